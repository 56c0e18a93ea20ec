// Types of vibevoice.mjs: VibeVoice-Realtime from a verified bundle, in a browser or in Node.js.

/** Where the model runs: in a page "webgpu" or "wasm" ("auto": WebGPU where the browser offers a hardware adapter,
 * else WASM); in Node.js "cpu" ("auto" is the CPU). */
export type Device = "auto" | "webgpu" | "wasm" | "cpu";

export interface LoadProgress {
  /** The bundle file being read (its name in the bundle). */
  file: string;
  /** Bytes of the bundle's files read so far (kept ones count whole), and of all of them. */
  loaded: number;
  total: number;
  fileLoaded: number;
  fileSize: number;
}

export interface LoadOptions {
  device?: Device;
  /** WASM threads (a page needs cross-origin isolation for more than one; default up to 4) or, in Node.js,
   * onnxruntime's intra-op threads (default: its own, the machine's cores). */
  threads?: number;
  onProgress?: (progress: LoadProgress) => void;
  /** Keep checked files (by sha256) for the next load: Cache Storage in a page, a folder in Node.js. Default true. */
  cache?: boolean;
  /** Node.js: the folder files are kept in (default $VIBEVOICE_ONNX_JS_CACHE, else ~/.cache/vibevoice-onnx/js). */
  cacheDir?: string;
  /** An onnxruntime module to use instead of importing onnxruntime-web or onnxruntime-node. */
  ort?: unknown;
}

export interface SpeakOptions {
  /** A voice of the bundle (default: its first, `tts.voices[0]`). */
  voice?: string;
  /** Noise rows, frames x 64 (arrays, or one flat Float32Array), as `vibevoice-onnx speak --noise` takes them: the
   * Python runtime's speech on the same rows. */
  noise?: number[][] | Float32Array;
  /** This module's own generator, when no noise is given (random without a seed). */
  seed?: number;
  /** Stop after this many latents (3200 samples each); null: until the model ends. */
  maxFrames?: number | null;
  cfgScale?: number;
  steps?: number;
  /** Frames decoded a call after the first (default 3, the Python runtime's): the decoder's weights are read once a
   * group; a group never spans a speech window of 6. */
  decodeGroup?: number;
  /** Each frame's samples (24 kHz, mono), as soon as it is decoded. */
  onAudio?: (chunk: Float32Array) => void;
}

export interface Speech {
  samples: Float32Array;
  sampleRate: 24000;
  frames: number;
  stopReason: "eos" | "max_frames" | "max_length";
}

export interface SpeechStream {
  /** Text as it arrives (an LLM's tokens): spoken as soon as it is settled. */
  feed(piece: string): void;
  /** No more text: the rest is spoken. */
  finish(): void;
  /** The token ids settled so far. */
  ids(): number[];
  done: Promise<Speech>;
}

export declare class VibeVoice {
  /** The realtime bundle at `bundle` (a base URL; in Node.js also a folder), every file checked against its
   * manifest's sha256, its sessions ready. Rejects with one sentence a bundle `vibevoice-onnx speak` would refuse. */
  static load(bundle: string | URL, options?: LoadOptions): Promise<VibeVoice>;
  /** The bundle's voices, sorted. */
  readonly voices: string[];
  readonly device: "webgpu" | "wasm" | "cpu";
  readonly threads: number | null;
  readonly precision: string;
  /** Its parity gates: "passed", or "not verified" (an fp32 bundle). */
  readonly gates: "passed" | "failed" | "not verified";
  readonly manifest: Record<string, unknown>;
  /** Milliseconds per graph call, and `ready`: the load's, from the manifest read to the sessions made. */
  readonly timings: Record<string, number[] | number>;
  speak(text: string, options?: SpeakOptions): Promise<Speech>;
  stream(options?: SpeakOptions): SpeechStream;
  /** In a page: playback from the first frame, an AudioWorklet at 24 kHz. */
  player(): Promise<{ context: AudioContext; play(chunk: Float32Array): void }>;
  tokenize(text: string): number[];
  /** The text as the Python runtime reads it (controls out, Python's whitespace stripped, a newline after). */
  normalise(text: string): string;
  /** The sessions released; the model cannot speak after. */
  close(): Promise<void>;
}

/** The text as the Python runtime reads it; throws for a text with nothing to speak. */
export declare function normaliseText(text: string): string;
/** Python's str.isspace() for one character. */
export declare function isSpace(character: string): boolean;
/** Why `vibevoice-onnx speak` would refuse a bundle with this manifest (without --force), or null. */
export declare function refusal(where: string, manifest: Record<string, unknown>): string | null;

export default VibeVoice;
