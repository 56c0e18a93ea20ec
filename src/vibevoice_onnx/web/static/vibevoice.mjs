// vibevoice-onnx for JavaScript: VibeVoice-Realtime from a bundle at any URL, in a browser (onnxruntime-web: WebGPU
// or WASM) or in Node.js (onnxruntime-node, CPU). Typed in vibevoice.d.ts, documented in docs/javascript.md:
//   const tts = await VibeVoice.load(bundleUrl, { device, threads, onProgress });
//   const { samples, sampleRate } = await tts.speak("Hello.", { voice: tts.voices[0] });
// Every file is checked against the sha256 its manifest records before use and kept (the browser's Cache Storage,
// or a folder in Node.js) under that sha256: a second load needs no network, a changed file is fetched again. The
// loop is the Python runtime's (generation/realtime.py), held to it by parity gates in Chromium, Firefox and
// Node.js (tests/test_browser_site.py, tests/test_javascript.py).
import { Tokenizer } from "@huggingface/tokenizers";

const IN_NODE = typeof process !== "undefined" && Boolean(process.versions?.node) && typeof window === "undefined";
const nodeImport = (name) => import(/* @vite-ignore */ `node:${name}`); // never resolved by a page's bundler
const ARRAYS = { float32: Float32Array, int64: BigInt64Array, int32: Int32Array };
const CACHE_NAME = "vibevoice-onnx-files";
const f = Math.fround;

// ---- the text rule: Python's (text.speakable, text.normalise_tts_text), character for character -----------------
// Control characters other than newline and tab are removed; whitespace is what Python's str.isspace() calls
// whitespace, never JavaScript's \s or trim(), which also take U+FEFF (Python keeps it, and so does the tokenizer).
const CONTROLS = /[\x00-\x08\x0b-\x1f\x7f-\x9f]/g;
const SPACE = "\\t\\n\\v\\f\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const IS_SPACE = new RegExp(`^[${SPACE}]$`), LEADING = new RegExp(`^[${SPACE}]+`), TRAILING = new RegExp(`[${SPACE}]+$`);
const strip = (text) => text.replace(LEADING, "").replace(TRAILING, "");
// The demo's quotes, as the Python runtime replaces them (text._QUOTES).
const withQuotes = (text) => text.replaceAll("\u2019", "'").replaceAll("\u201c", '"').replaceAll("\u201d", '"');

/** Python's str.isspace() for one character. */
export const isSpace = (character) => IS_SPACE.test(character);

/** The text as the Python runtime reads it: controls out, stripped, the demo's quotes replaced, stripped, a newline
 * after; the Python runtime's sentence for a text with nothing to speak. */
export function normaliseText(text) {
  const out = strip(withQuotes(strip(String(text).replace(CONTROLS, ""))));
  if (!out) throw new Error("the text has nothing to speak (it is empty, or only whitespace and control characters)");
  return `${out}\n`;
}

// ---- a bundle's files, from any base URL (or, in Node.js, a folder), checked and kept ----------------------------
const hex = (bytes) => Array.from(new Uint8Array(bytes), (b) => b.toString(16).padStart(2, "0")).join("");

function baseUrl(bundle) {
  const text = String(bundle);
  const here = IN_NODE ? `file://${process.cwd()}/` : globalThis.location?.href;
  const url = IN_NODE && !/^[a-z][a-z0-9+.-]*:/i.test(text) ? new URL(`file://${text.startsWith("/") ? "" : `${process.cwd()}/`}${text}`) : new URL(text, here);
  if (!url.pathname.endsWith("/")) url.pathname += "/";
  return url;
}

// Where checked files are kept, by sha256: the browser's Cache Storage (where the page may use it: a secure
// context), a folder in Node.js, or nowhere (`cache: false`).
class BrowserStore {
  static async open(enabled) {
    return new BrowserStore(enabled && globalThis.caches ? await caches.open(CACHE_NAME).catch(() => null) : null);
  }

  constructor(cache) { this.cache = cache; }

  key(name) { return `https://vibevoice-onnx.invalid/${name}`; }

  async get(sha256) {
    const found = this.cache && await this.cache.match(this.key(`sha256/${sha256}`));
    return found ? new Uint8Array(await found.arrayBuffer()) : null;
  }

  async put(sha256, bytes) { await this.cache?.put(this.key(`sha256/${sha256}`), new Response(bytes)).catch(() => {}); }

  async getText(name) { const found = this.cache && await this.cache.match(this.key(name)); return found ? found.text() : null; }

  async putText(name, text) { await this.cache?.put(this.key(name), new Response(text)).catch(() => {}); }
}

class NodeStore {
  static async open(enabled, folder) {
    const [fs, os, path] = await Promise.all([nodeImport("fs/promises"), nodeImport("os"), nodeImport("path")]);
    const root = folder ?? process.env.VIBEVOICE_ONNX_JS_CACHE ?? path.join(os.homedir(), ".cache", "vibevoice-onnx", "js");
    return new NodeStore(enabled ? root : null, fs, path);
  }

  constructor(root, fs, path) { Object.assign(this, { root, fs, path }); }

  file(name) { return this.path.join(this.root, ...name.split("/")); }

  async get(sha256) {
    const bytes = this.root ? await this.fs.readFile(this.file(`sha256/${sha256}`)).catch(() => null) : null;
    return bytes && new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }

  async put(sha256, bytes) { if (this.root) await this.write(`sha256/${sha256}`, bytes); }

  async getText(name) { return this.root ? this.fs.readFile(this.file(name), "utf8").catch(() => null) : null; }

  async putText(name, text) { if (this.root) await this.write(name, text); }

  async write(name, data) { // whole or not at all: written beside, then renamed
    const target = this.file(name), partial = `${target}.${process.pid}.partial`;
    await this.fs.mkdir(this.path.dirname(target), { recursive: true });
    await this.fs.writeFile(partial, data);
    await this.fs.rename(partial, target);
  }
}

// A file that is not the one its manifest records: `how` it differs, and the one sentence every refusal ends with.
const notRecorded = (url, how) => new Error(`${url}: ${how}; it was changed or damaged on the way, so the bundle is refused`);

async function sha256Of(bytes) {
  if (globalThis.crypto?.subtle) return hex(await crypto.subtle.digest("SHA-256", bytes));
  return (await nodeImport("crypto")).createHash("sha256").update(bytes).digest("hex");
}

// The bundle's bytes as its manifest records them: from the store, else from the base URL, with progress.
class BundleFiles {
  // `key`: the manifest's, naming the folder of links Node.js opens a fetched bundle's graphs from (nodeFolder)
  constructor(base, manifest, store, progress, key) { Object.assign(this, { base, manifest, store, progress, key }); }

  record(name) {
    const record = this.manifest.files?.[name];
    if (!record?.sha256) throw new Error(`${this.base}: its manifest records no sha256 for ${name}, so it cannot be checked (build the bundle again with this version)`);
    return record;
  }

  async bytes(name) {
    const { sha256, size } = this.record(name);
    const kept = await this.store.get(sha256);
    if (kept && kept.byteLength === size) {
      this.progress(name, size, size);
      return kept;
    }
    const url = new URL(name, this.base);
    const bytes = await download(url, size, (loaded) => this.progress(name, loaded, size));
    if (await sha256Of(bytes) !== sha256) {
      throw notRecorded(url, "this file does not match the sha256 its manifest records");
    }
    await this.store.put(sha256, bytes);
    return bytes;
  }

  async json(name) { return JSON.parse(new TextDecoder().decode(await this.bytes(name))); }

  // Node.js, a store that keeps files: `name` kept (fetched and checked unless it is already), and where it is.
  async kept(name) {
    const { sha256, size } = this.record(name), path = this.store.file(`sha256/${sha256}`);
    if ((await this.store.fs.stat(path).catch(() => null))?.size === size) this.progress(name, size, size);
    else await this.bytes(name);
    return path;
  }

  // A file of a bundle in a folder (Node.js) checked without holding it: read and hashed a piece at a time.
  async checkInPlace(name) {
    const [fs, crypto] = await Promise.all([nodeImport("fs"), nodeImport("crypto")]), { sha256, size } = this.record(name);
    const url = new URL(name, this.base), hash = crypto.createHash("sha256");
    let loaded = 0;
    try {
      for await (const chunk of fs.createReadStream(url)) {
        hash.update(chunk);
        loaded += chunk.length;
        this.progress(name, loaded, size);
      }
    } catch (e) {
      throw new Error(`${url}: cannot be read (${e.code ?? e.message})`);
    }
    if (loaded !== size || hash.digest("hex") !== sha256) {
      throw notRecorded(url, "this file does not match the sha256 its manifest records");
    }
  }
}

async function download(url, size, onBytes) {
  if (url.protocol === "file:") {
    if (!IN_NODE) throw new Error(`${url}: a page cannot read files; give the bundle's http(s) URL`);
    const bytes = await (await nodeImport("fs/promises")).readFile(url).catch((e) => {
      throw new Error(`${url}: cannot be read (${e.code ?? e.message})`);
    });
    onBytes(bytes.byteLength);
    return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }
  const response = await fetch(url).catch((e) => { throw new Error(`${url}: cannot be fetched (${e.cause?.code ?? e.message})`); });
  if (!response.ok) throw new Error(`${url}: the host answered ${response.status}`);
  const bytes = new Uint8Array(size), reader = response.body.getReader();
  let loaded = 0;
  for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) {
    if (loaded + chunk.value.byteLength > size) {
      await reader.cancel();
      throw notRecorded(url, `longer than the ${size} bytes its manifest records`);
    }
    bytes.set(chunk.value, loaded);
    loaded += chunk.value.byteLength;
    onBytes(loaded);
  }
  if (loaded !== size) throw notRecorded(url, `${loaded} bytes where its manifest records ${size}`);
  return bytes;
}

// The manifest: the host's, kept for a load with the network gone; the kept one where the host cannot be reached.
async function readManifest(base, store) {
  const url = new URL("manifest.json", base), key = `manifests/${(await sha256Of(new TextEncoder().encode(String(base)))).slice(0, 32)}.json`;
  let text;
  try {
    if (url.protocol === "file:") text = await (await nodeImport("fs/promises")).readFile(url, "utf8");
    else {
      const response = await fetch(url, { cache: "no-cache" });
      if (!response.ok) throw Object.assign(new Error(`${url}: the host answered ${response.status}`), { answered: true });
      text = await response.text();
    }
  } catch (error) {
    text = error.answered ? null : await store.getText(key);
    if (text === null) throw error.answered ? error : new Error(`${url}: cannot be read (${error.cause?.code ?? error.code ?? error.message}), and no copy is kept from an earlier load`);
  }
  let manifest;
  try { manifest = JSON.parse(text); } catch { throw new Error(`${url}: is not a bundle's manifest (not JSON)`); }
  await store.putText(key, text);
  return manifest;
}

// Why `speak` refuses the bundle (runtime.bundle.Bundle.unusable, without --force: a page has none), or null.
export function refusal(where, manifest) {
  const { parity, precision } = manifest;
  if (parity && !parity.passed) {
    const failed = parity.gates.filter((g) => !g.passed).map((g) => g.name).join(", ");
    return `${where}: failed its parity gates (${failed}), so it is not usable`;
  }
  if (!parity && precision !== "fp32") {
    return `${where}: this ${precision} bundle has not been verified; run \`vibevoice-onnx verify ${where}\` first (its closed loop must pass)`;
  }
  return null;
}

function checkRunnable(where, manifest) {
  if (manifest.model_kind !== "realtime") throw new Error(`${where}: a bundle of ${manifest.model_kind}; this module runs VibeVoice-Realtime bundles (realtime)`);
  const profile = manifest.profile?.name ?? "dynamic";
  if (profile !== "dynamic" || manifest.device !== "cpu") {
    throw new Error(`${where}: a bundle of the ${profile} profile built for ${manifest.device}; this module runs bundles of the dynamic profile built for the CPU (fp32, int8-decoder, int8 or int4-mixed; build --profile dynamic --device cpu)`);
  }
  const why = refusal(where, manifest);
  if (why) throw new Error(why);
}

// ---- onnxruntime: onnxruntime-web (WebGPU or WASM) in a page, onnxruntime-node in Node.js ------------------------
// onnxruntime's WebAssembly binds the console when it loads, so a page's console is wrapped before it loads: while
// placement() listens, what is written to it is kept there instead.
let listening = null;
function wrapConsole() {
  if (console.vibevoiceWrapped) return;
  for (const level of ["log", "warn", "error"]) {
    const write = console[level].bind(console);
    console[level] = (...args) => (listening ? listening.push(args.join(" ")) : write(...args));
  }
  console.vibevoiceWrapped = true;
}

// The device: WebGPU where the page asks or, with "auto", where the browser offers a hardware adapter (a software
// one, such as SwiftShader, is slower than WASM); else WASM; in Node.js the CPU.
async function chooseDevice(device) {
  const devices = IN_NODE ? ["auto", "cpu"] : ["auto", "webgpu", "wasm"];
  if (!devices.includes(device)) throw new Error(`device ${device}: ${IN_NODE ? "Node.js runs on cpu" : "a page runs on webgpu or wasm"} (or auto)`);
  if (IN_NODE) return { device: "cpu", adapter: null };
  if (device === "wasm") return { device, adapter: null };
  const adapter = globalThis.navigator?.gpu ? await navigator.gpu.requestAdapter().catch(() => null) : null;
  const info = adapter ? { vendor: adapter.info?.vendor, architecture: adapter.info?.architecture,
                           software: Boolean(adapter.info?.isFallbackAdapter ?? adapter.isFallbackAdapter) } : null;
  if (device === "webgpu" && !adapter) throw new Error("device webgpu: this browser offers no WebGPU adapter");
  return { device: device === "webgpu" || (info && !info.software) ? "webgpu" : "wasm", adapter: info };
}

async function importRuntime(device) {
  if (IN_NODE) return import("onnxruntime-node");
  wrapConsole();
  return device === "webgpu" ? import("onnxruntime-web/webgpu") : import("onnxruntime-web/wasm");
}

function fromWire(ort, { type, dims, data }) {
  const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
  return new ort.Tensor(type, new ARRAYS[type](bytes.buffer), dims);
}

function toWire(tensor) {
  const bytes = new Uint8Array(tensor.data.buffer, tensor.data.byteOffset, tensor.data.byteLength);
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return { type: tensor.type, dims: Array.from(tensor.dims), data: btoa(text) };
}

// In Node.js onnxruntime opens graphs by path, their external data beside them under the names the graph records:
// a bundle in a folder is opened where it is (once checked); a fetched one from a folder of links to the kept
// files, named as the bundle names them.
async function nodeFolder(files, names) {
  const [fs, path, url, os] = await Promise.all(["fs/promises", "path", "url", "os"].map(nodeImport));
  if (files.base.protocol === "file:") {
    for (const name of names) await files.checkInPlace(name);
    return { folder: url.fileURLToPath(files.base), temporary: false };
  }
  const temporary = !files.store.root;
  const folder = temporary ? await fs.mkdtemp(path.join(os.tmpdir(), "vibevoice-onnx-")) : files.store.file(`bundles/${files.key}`);
  try {
    for (const name of names) {
      const target = path.join(folder, ...name.split("/"));
      await fs.mkdir(path.dirname(target), { recursive: true });
      if (temporary) await fs.writeFile(target, await files.bytes(name)); // checked
      else {
        const kept = await files.kept(name);
        if (!(await fs.stat(target).catch(() => null))) await fs.link(kept, target).catch(() => fs.copyFile(kept, target));
      }
    }
  } catch (error) {
    if (temporary) await fs.rm(folder, { recursive: true, force: true });
    throw error;
  }
  return { folder, temporary };
}

// ---- the model ------------------------------------------------------------------------------------------------
export class VibeVoice {
  /** The realtime bundle at `bundle` (a base URL; in Node.js also a folder), its sessions ready. Rejects, with one
   * sentence, a bundle `speak` would refuse, a file that is not the one its manifest records, and a host that
   * cannot be reached with nothing kept from an earlier load. */
  static async load(bundle, { device = "auto", threads, onProgress = null, cache = true, cacheDir, ort } = {}) {
    const base = baseUrl(bundle), where = String(base).replace(/\/$/, "");
    // a bundle in a folder is read where it is: nothing of it is kept
    const store = IN_NODE ? await NodeStore.open(cache && base.protocol !== "file:", cacheDir) : await BrowserStore.open(cache);
    const manifest = await readManifest(base, store);
    checkRunnable(where, manifest);
    const graphs = Object.values(manifest.graphs ?? {}), voices = Object.keys(manifest.files ?? {})
      .filter((n) => /^voices\/[^/]+\.safetensors$/.test(n)).map((n) => n.slice(7, -12)).sort();
    const graphFiles = graphs.flatMap((g) => [g.file, g.external_data].filter(Boolean));
    const needed = [manifest.tokenizer.file, manifest.host_tensors, ...graphFiles];
    const total = needed.reduce((sum, name) => sum + (manifest.files[name]?.size ?? 0), 0), done = new Map();
    const progress = (file, loaded, size) => {
      if (!onProgress || done.get(file) === loaded || !needed.includes(file)) return;
      done.set(file, loaded);
      onProgress({ file, loaded: [...done.values()].reduce((a, b) => a + b, 0), total, fileLoaded: loaded, fileSize: size });
    };
    const key = (await sha256Of(new TextEncoder().encode(JSON.stringify(manifest)))).slice(0, 32);
    const files = new BundleFiles(base, manifest, store, progress, key);
    const chosen = await chooseDevice(device);
    const runtime = ort ?? await importRuntime(chosen.device);
    const tts = new VibeVoice({ where, manifest, files, voices, ort: runtime, ...chosen });
    tts.threads = tts.setThreads(threads);
    const started = performance.now();
    try {
      if (IN_NODE) tts.folder = await nodeFolder(files, graphFiles);
      tts.tokenizer = new Tokenizer(await files.json(manifest.tokenizer.file), {});
      tts.host = await readSafetensors(await files.bytes(manifest.host_tensors), manifest.host_tensors);
      for (const name of Object.keys(manifest.graphs)) tts.sessions.set(name, await tts.createSession(name));
    } catch (error) {
      await tts.close(); // nothing left behind: sessions made so far, a temporary folder
      throw error;
    }
    tts.timings.ready = performance.now() - started;
    return tts;
  }

  constructor(fields) {
    Object.assign(this, fields, { sessions: new Map(), voiceCache: new Map(), timings: {} });
    this.gates = !this.manifest.parity ? "not verified" : this.manifest.parity.passed ? "passed" : "failed";
    this.precision = this.manifest.precision;
  }

  // Threads: WASM's need SharedArrayBuffer, which browsers give only to cross-origin isolated pages (COOP + COEP).
  setThreads(threads) {
    if (threads !== undefined && !(Number.isInteger(threads) && threads >= 1)) throw new Error(`threads ${threads}: a whole number from 1`);
    if (IN_NODE) return threads ?? null; // onnxruntime-node's own default: the machine's cores
    const most = globalThis.crossOriginIsolated ? (navigator.hardwareConcurrency || 1) : 1;
    this.ort.env.wasm.numThreads = Math.min(threads ?? Math.min(most, 4), most);
    return this.ort.env.wasm.numThreads;
  }

  /** A new session of graph `name` on the chosen device (WebGPU with WASM for the nodes it has no kernel for). */
  async createSession(name, extra = {}) {
    const graph = this.manifest.graphs[name];
    if (!graph) throw new Error(`the bundle has no '${name}' graph`);
    // Errors only in the console: on WebGPU onnxruntime warns, for every graph, that it keeps the shape arithmetic
    // on WASM; placement() says where each node runs.
    // Threads that spin after one session's call steal the cores from the next: the loop runs seven sessions in
    // turn (the Python runtime's setting; in Node.js, 2 threads spinning ran the full-size loop 2.4x slower than 1).
    const options = { graphOptimizationLevel: "all", logSeverityLevel: 3,
                      extra: { session: { intra_op: { allow_spinning: "0" } } }, ...extra };
    if (IN_NODE) {
      const path = await nodeImport("path");
      return this.ort.InferenceSession.create(path.join(this.folder.folder, ...graph.file.split("/")),
        { ...options, executionProviders: ["cpu"], ...(this.threads ? { intraOpNumThreads: this.threads } : {}) });
    }
    options.executionProviders = this.device === "webgpu" ? ["webgpu", "wasm"] : ["wasm"];
    if (graph.external_data) options.externalData = [{ path: graph.external_data, data: await this.files.bytes(graph.external_data) }];
    return this.ort.InferenceSession.create(await this.files.bytes(graph.file), options);
  }

  session(name) {
    if (!this.sessions.has(name)) throw new Error(`the bundle has no '${name}' graph`);
    return this.sessions.get(name);
  }

  /** The sessions released (their memory given back); the model cannot speak after. */
  async close() {
    for (const session of this.sessions.values()) await session.release?.();
    this.sessions.clear();
    if (this.folder?.temporary) await (await nodeImport("fs/promises")).rm(this.folder.folder, { recursive: true, force: true });
  }

  tokenize(text) { return this.tokenizer.encode(text, { add_special_tokens: false }).ids; }

  normalise(text) { return normaliseText(text); }

  // One call of graph `name`, its session.run time kept in timings.
  async call(name, feeds, fetches) {
    const session = this.session(name), start = performance.now(), outputs = await session.run(feeds, fetches);
    (this.timings[name] ??= []).push(performance.now() - start);
    return outputs;
  }

  // A call with arrays in the wire form ({type, dims, data: base64}): what the parity gates replay.
  async run(name, feeds, fetches) {
    const inputs = Object.fromEntries(Object.entries(feeds).map(([key, value]) => [key, fromWire(this.ort, value)]));
    const outputs = await this.call(name, inputs, fetches);
    return Object.fromEntries(Object.entries(outputs).map(([key, value]) => [key, toWire(value)]));
  }

  // Where onnxruntime places graph `name`'s nodes: {provider: {nodes, ops: {op type: count}}} (ops where onnxruntime
  // lists them: for a provider that got only some of the nodes). Read from its verbose log of a fresh session,
  // which it writes to the console (a page's only).
  async placement(name) {
    const lines = [];
    listening = lines;
    try {
      await (await this.createSession(name, { logSeverityLevel: 0, logVerbosityLevel: 0 })).release?.();
    } finally {
      listening = null;
    }
    const placed = {};
    let current = null;
    for (const line of lines.flatMap((l) => l.split("\n"))) {
      const all = /All nodes placed on \[(\w+)\]\. Number of nodes: (\d+)/.exec(line);
      const some = /Node\(s\) placed on \[(\w+)\]\. Number of nodes: (\d+)/.exec(line);
      const node = /^\s+(\w+) \(/.exec(line.replace(/^.*\] /, ""));
      if (all || some) {
        const [, provider, count] = all || some;
        placed[provider] = { nodes: Number(count), ops: {} };
        current = some ? placed[provider] : null; // a split lists its nodes next, a line each
      } else if (current && node) {
        current.ops[node[1]] = (current.ops[node[1]] ?? 0) + 1;
      } else {
        current = null;
      }
    }
    return placed;
  }

  async voice(name) {
    if (!this.voices.includes(name)) throw new Error(`no voice '${name}' in this bundle (it has ${this.voices.join(", ") || "none"})`);
    if (!this.voiceCache.has(name)) {
      const file = `voices/${name}.safetensors`, tensors = await readSafetensors(await this.files.bytes(file), file);
      const layers = (prefix) => {
        const flat = [];
        for (let i = 0; `${prefix}.${i}.key` in tensors; i++) flat.push(tensors[`${prefix}.${i}.key`], tensors[`${prefix}.${i}.value`]);
        return flat;
      };
      this.voiceCache.set(name, { lm: layers("lm"), ttsLm: layers("tts_lm"), negTtsLm: layers("neg_tts_lm"),
                                  positive: tensors.tts_condition.data, negative: tensors.neg_condition.data });
    }
    return this.voiceCache.get(name);
  }

  schedule(steps) { return schedule(steps); }

  sampleLatent(options) { return sampleLatent(this, options); }

  /** Speech of `text` (a string, or a stream's feed): the realtime loop, each latent decoded as it comes. */
  speak(text, options = {}) { return speak(this, text, options); }

  /** Speech of text fed in pieces while the loop runs: {feed(piece), finish(), ids(), done}, `done` speak's promise. */
  stream(options = {}) {
    const text = new TextFeed(this);
    return { feed: (piece) => text.feed(piece), finish: () => text.finish(), ids: () => text.ids.slice(),
             done: speak(this, text, options) };
  }

  /** Playback from the first decoded frame in a page: {context, play(chunk)}, an AudioWorklet at 24 kHz. */
  async player() {
    if (!this.audio) {
      const context = new AudioContext({ sampleRate: SAMPLE_RATE });
      await context.audioWorklet.addModule(URL.createObjectURL(new Blob([PLAYER], { type: "text/javascript" })));
      const node = new AudioWorkletNode(context, "vibevoice-player");
      node.connect(context.destination);
      this.audio = { context, play: (chunk) => node.port.postMessage(chunk) };
    }
    await this.audio.context.resume();
    return this.audio;
  }
}
// DPM-Solver++ as the Python runtime runs it (vibevoice_onnx.sampling, facts sheet 4.1): 1000 training steps,
// cosine betas, v-prediction, order 2 with the midpoint rule, first order on the first and the final step, final
// sigma zero. Its arithmetic is fp32 there, so every scalar operation here is rounded to fp32 (Math.fround).
const TRAIN_STEPS = 1000;

function schedule(steps) {
  if (!(steps >= 1 && steps < TRAIN_STEPS)) throw new Error(`diffusion steps must be from 1 to ${TRAIN_STEPS - 1}, got ${steps}`);
  const alphaBar = (t) => Math.cos(((t + 0.008) / 1.008) * Math.PI / 2) ** 2;
  const sigmaTable = new Float32Array(TRAIN_STEPS);
  let cumulative = 1; // in double, as torch's CPU cumprod accumulates fp32
  for (let i = 0; i < TRAIN_STEPS; i++) {
    const beta = f(Math.min(1 - alphaBar((i + 1) / TRAIN_STEPS) / alphaBar(i / TRAIN_STEPS), 0.999));
    cumulative *= f(1 - beta);
    const alphas = f(cumulative);
    sigmaTable[i] = f(Math.sqrt(f(f(1 - alphas) / alphas)));
  }
  const timesteps = []; // numpy's linspace(0, 999, steps + 1), rounded half to even, descending, without 0
  const step = (TRAIN_STEPS - 1) / steps;
  for (let i = steps; i >= 1; i--) timesteps.push(i === steps ? TRAIN_STEPS - 1 : roundHalfEven(i * step));
  const sigmas = new Float32Array(steps + 1); // the table at integer timesteps; the last is 0
  timesteps.forEach((t, k) => { sigmas[k] = sigmaTable[t]; });
  return { timesteps, sigmas };
}

function roundHalfEven(value) {
  const floor = Math.floor(value), fraction = value - floor;
  return fraction > 0.5 || (fraction === 0.5 && floor % 2 === 1) ? floor + 1 : floor;
}

function alphaSigma(sigmas, k) {
  const alpha = f(1 / f(Math.sqrt(f(f(sigmas[k] * sigmas[k]) + 1))));
  return [alpha, f(sigmas[k] * alpha)];
}

const lambda = (sigmas, k) => { const [a, s] = alphaSigma(sigmas, k); return f(f(Math.log(a)) - f(Math.log(s))); };

// One latent from its (positive, negative) conditions and its noise: the head conditioned once for every step
// (timestep-major rows: positive, negative), then a step per timestep on [x, x], guided by cfgScale.
async function sampleLatent(tts, { positive, negative, noise, cfgScale, steps }) {
  const { timesteps, sigmas } = schedule(steps), ort = tts.ort;
  const width = positive.length, size = noise.length;
  const condition = new Float32Array(2 * steps * width), times = new Float32Array(2 * steps);
  timesteps.forEach((t, k) => {
    condition.set(positive, 2 * k * width); condition.set(negative, (2 * k + 1) * width);
    times[2 * k] = times[2 * k + 1] = t;
  });
  const { modulation } = await tts.call("diffusion_head_conditioning", { timesteps: new ort.Tensor("float32", times, [2 * steps]),
    condition: new ort.Tensor("float32", condition, [2 * steps, width]) });
  const rows = modulation.dims[1];
  let x = Float32Array.from(noise), previous = null;
  for (let k = 0; k < steps; k++) {
    const noisy = new Float32Array(2 * size); noisy.set(x); noisy.set(x, size);
    const { velocity } = await tts.call("diffusion_head_step", { noisy_latents: new ort.Tensor("float32", noisy, [2, size]),
      modulation: new ort.Tensor("float32", modulation.data.subarray(2 * k * rows, (2 * k + 2) * rows), [2, rows]) });
    const [alpha, sigmaHat] = alphaSigma(sigmas, k), x0 = new Float32Array(size);
    for (let i = 0; i < size; i++) {
      const vPos = velocity.data[i], vNeg = velocity.data[size + i];
      const v = f(vNeg + f(f(cfgScale) * f(vPos - vNeg)));
      x0[i] = f(f(alpha * x[i]) - f(sigmaHat * v));
    }
    x = k + 1 === steps || sigmas[k + 1] === 0 ? x0 : solverStep(sigmas, k, steps, x, x0, previous);
    previous = x0;
  }
  return x;
}

function solverStep(sigmas, k, steps, x, x0, previous) {
  const [alphaT, sigmaT] = alphaSigma(sigmas, k + 1), [, sigmaS] = alphaSigma(sigmas, k);
  const h = f(lambda(sigmas, k + 1) - lambda(sigmas, k));
  const coefficient = f(alphaT * f(f(Math.exp(-h)) - 1)), ratio = f(sigmaT / sigmaS);
  const second = previous !== null && k > 0 && k < steps - 1;
  const r = second ? f(f(1 / f(f(lambda(sigmas, k) - lambda(sigmas, k - 1)) / h))) : 0;
  const next = new Float32Array(x.length);
  for (let i = 0; i < x.length; i++) {
    next[i] = f(f(ratio * x[i]) - f(coefficient * x0[i]));
    if (second) next[i] = f(next[i] - f(f(0.5 * coefficient) * f(r * f(x0[i] - previous[i]))));
  }
  return next;
}

// ---- safetensors: the bundle's host tensors and voices, as float32 -------------------------------------------
function toFloat32(dtype, data, begin, end) {
  const bytes = Uint8Array.prototype.slice.call(data, begin, end).buffer; // a copy (Node's Buffer.slice is a view)
  if (dtype === "F32") return new Float32Array(bytes);
  if (dtype === "BF16") {
    const halves = new Uint16Array(bytes), words = new Uint32Array(halves.length);
    for (let i = 0; i < halves.length; i++) words[i] = halves[i] << 16;
    return new Float32Array(words.buffer);
  }
  if (dtype === "F16") {
    const halves = new Uint16Array(bytes), out = new Float32Array(halves.length);
    for (let i = 0; i < halves.length; i++) {
      const h = halves[i], sign = h & 0x8000 ? -1 : 1, exponent = (h >> 10) & 31, fraction = h & 1023;
      out[i] = exponent === 0 ? sign * 2 ** -14 * (fraction / 1024)
        : exponent === 31 ? (fraction ? NaN : sign * Infinity) : sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
    }
    return out;
  }
  throw new Error(`a tensor of type ${dtype}, which this module does not read`);
}


function readSafetensors(bytes, name) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const length = Number(view.getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + length)));
  const tensors = {};
  for (const [key, t] of Object.entries(header)) {
    if (key === "__metadata__") continue;
    tensors[key] = { dims: t.shape, data: toFloat32(t.dtype, bytes, 8 + length + t.data_offsets[0], 8 + length + t.data_offsets[1]) };
  }
  if (!Object.keys(tensors).length) throw new Error(`${name}: holds no tensor`);
  return tensors;
}

// ---- LM calls: a KV cache grown call by call (the graph returns past + the new positions) ---------------------
// One call of LM graph `name` for `rows` rows (each at its own length) taking `count` positions each: the hidden
// states [rows, count, width] and the present K/V, as long as the longest row plus `count`.
async function lmCall(tts, name, past, lengths, embeds, count, width) {
  const { ort } = tts, session = tts.session(name), rows = lengths.length;
  const positions = new BigInt64Array(rows * count).map((_, i) => BigInt(lengths[Math.floor(i / count)] + (i % count)));
  const feeds = { inputs_embeds: new ort.Tensor("float32", embeds, [rows, count, width]),
    position_ids: new ort.Tensor("int64", positions, [rows, count]),
    seqlens_k: new ort.Tensor("int32", Int32Array.from(lengths, (n) => n + count - 1), [rows]),
    total_sequence_length: new ort.Tensor("int32", Int32Array.of(Math.max(...lengths) + count), []) };
  session.inputNames.slice(4).forEach((input, i) => { feeds[input] = past[i]; });
  const outputs = await tts.call(name, feeds);
  return { hidden: outputs[session.outputNames[0]].data, present: session.outputNames.slice(1).map((n) => outputs[n]) };
}

// One stream: a row alone, its cache exactly its length.
class LmStream {
  constructor(tts, name, layers) {
    Object.assign(this, { tts, name, length: layers[0].dims[2] });
    this.past = layers.map((t) => new tts.ort.Tensor("float32", t.data, t.dims));
  }

  async step(embeds, count, width) { // embeds [count, width] -> the hidden states [count, width]
    const { hidden, present } = await lmCall(this.tts, this.name, this.past, [this.length], embeds, count, width);
    Object.assign(this, { past: present, length: this.length + count });
    return hidden;
  }
}

// Both CFG streams of the upper LM (runtime.lm.BatchedGuidedStreams): row 0 the positive, row 1 the negative, each
// at its own length in one cache as long as the longer. A speech frame goes to both in one batch-2 call (the
// weights read once, and the same products as the Python runtime's, whose int8 scales span both rows); text goes
// to the positive row alone.
class GuidedStreams {
  constructor(tts, positive, negative) {
    Object.assign(this, { tts, lengths: [positive[0].dims[2], negative[0].dims[2]] });
    this.past = this.joined(positive, negative);
  }

  joined(positive, negative) { // one-row K/V lists -> [2, KV, longest, D] tensors, each row zero-padded
    const longest = Math.max(...this.lengths);
    return positive.map((p, i) => new this.tts.ort.Tensor("float32", stackRows([p, negative[i]], longest),
      [2, p.dims[1], longest, p.dims[3]]));
  }

  row(r) { return this.past.map((t) => rowOf(t, r, this.lengths[r])); }

  async text(embeds, count, width) { // the positive row's last hidden state [width]
    const { ort } = this.tts, alone = this.row(0).map((t) => new ort.Tensor("float32", t.data, t.dims));
    const { hidden, present } = await lmCall(this.tts, "upper_lm", alone, [this.lengths[0]], embeds, count, width);
    const negative = this.row(1);
    this.lengths[0] += count;
    this.past = this.joined(present, negative);
    return hidden.slice((count - 1) * width, count * width);
  }

  async speech(feedback, width) { // one frame to both rows: [positive hidden, negative hidden]
    const embeds = new Float32Array(2 * width);
    embeds.set(feedback); embeds.set(feedback, width);
    const { hidden, present } = await lmCall(this.tts, "upper_lm", this.past, this.lengths, embeds, 1, width);
    this.past = present;
    this.lengths = this.lengths.map((n) => n + 1);
    return [hidden.slice(0, width), hidden.slice(width, 2 * width)];
  }
}

// Row r's first `length` positions of a K/V tensor [R, KV, L, D], as {dims: [1, KV, length, D], data} (a copy).
function rowOf(t, r, length) {
  const [, heads, had, dim] = t.dims, data = new Float32Array(heads * length * dim);
  for (let h = 0; h < heads; h++) data.set(t.data.subarray((r * heads + h) * had * dim, ((r * heads + h) * had + length) * dim), h * length * dim);
  return { dims: [1, heads, length, dim], data };
}

// One-row K/V tensors ([1, KV, L_i, D], each its own length) stacked as the data of [rows, KV, length, D].
function stackRows(rows, length) {
  const [, heads, , dim] = rows[0].dims, out = new Float32Array(rows.length * heads * length * dim);
  rows.forEach((t, r) => {
    const had = t.dims[2];
    for (let h = 0; h < heads; h++) out.set(t.data.subarray(h * had * dim, (h + 1) * had * dim), (r * heads + h) * length * dim);
  });
  return out;
}

const add = (a, b) => a.map((x, i) => f(x + b[i]));
const TEXT_WINDOW = 5, SPEECH_WINDOW = 6, LATENT = 64, SAMPLE_RATE = 24000;
const DECODE_GROUP = 3; // runtime.realtime.DECODE_GROUP: Python's default, so the same noise gives the same samples

// Noise rows given (frames x 64, as `speak --noise` takes them): frame k's row, or an error past the last.
function rowsOf(noise) {
  const rows = ArrayBuffer.isView(noise) ? noise : Float32Array.from(noise.flat()), available = Math.floor(rows.length / LATENT);
  return (frame) => {
    if (frame >= available) throw new Error(`the noise has ${available} rows, but generation reached frame ${frame + 1}`);
    return rows.subarray(frame * LATENT, (frame + 1) * LATENT);
  };
}

// Noise from a seed, frame by frame: this module's own generator (xorshift128 and Box-Muller), reproducible here
// but not the Python runtime's numpy stream: for speech equal to Python's, pass its noise rows.
function seededNoise(seed) {
  return (frame) => {
    let a = (seed ^ 0x9e3779b9) >>> 0, b = (frame * 0x85ebca6b + 0x27d4eb2f) >>> 0 || 1, c = 0x165667b1, d = 0xd3a2646c;
    const next = () => { // xorshift128 on 32-bit words: uniform in (0, 1)
      const t = a ^ (a << 11); a = b; b = c; c = d; d = (d ^ (d >>> 19) ^ (t ^ (t >>> 8))) >>> 0;
      return (d + 0.5) / 2 ** 32;
    };
    for (let i = 0; i < 8; i++) next();
    const row = new Float32Array(LATENT);
    for (let i = 0; i < LATENT; i += 2) {
      const radius = Math.sqrt(-2 * Math.log(next())), angle = 2 * Math.PI * next();
      row[i] = radius * Math.cos(angle); row[i + 1] = radius * Math.sin(angle);
    }
    return row;
  };
}

// Text that arrives in pieces (an LLM's tokens), handed to the loop as 5-token windows, with the ids of the whole
// text whatever the split (text.TextFeed's rule): a token is settled once it ends before the last whitespace run
// that has text after it, where the tokenizer's pre-tokens cannot change whatever comes next.
class TextFeed {
  constructor(tts) { Object.assign(this, { tts, text: "", ids: [], handed: 0, finished: false, wake: () => {} }); }

  feed(piece) {
    if (this.finished) throw new Error("this text is already finished: no more pieces can be added");
    this.text += String(piece).replace(CONTROLS, "");
    const prepared = withQuotes(this.text).replace(LEADING, "");
    const end = prepared.replace(TRAILING, "").length;
    let cut = -1;
    for (let i = end - 1; i >= 0; i--) if (isSpace(prepared[i])) { cut = i; break; }
    if (cut >= 0) {
      while (cut > 0 && isSpace(prepared[cut - 1])) cut -= 1;
      this.extend(this.tts.tokenize(prepared.slice(0, cut)));
    }
    this.wake();
  }

  finish() {
    if (this.finished) return;
    this.extend(this.tts.tokenize(normaliseText(this.text)));
    this.finished = true;
    this.wake();
  }

  extend(ids) {
    if (ids.length <= this.ids.length) return;
    if (this.ids.some((id, i) => ids[i] !== id)) throw new Error("streamed text tokenised differently from the whole text");
    this.ids = ids;
  }

  async window() { // the next window, once there is one: [] when the text is finished and all handed out
    while (!this.finished && this.ids.length - this.handed < TEXT_WINDOW) await new Promise((resolve) => { this.wake = resolve; });
    const window = this.ids.slice(this.handed, this.handed + TEXT_WINDOW);
    this.handed += window.length;
    return window;
  }
}

// Speech of `text` with `voice`: the realtime loop (generation/realtime.py's `_latents`), each latent decoded as it
// comes. `noise`: frames x 64 rows (arrays or one flat Float32Array), as `speak --noise` takes (the Python
// runtime's speech, exactly); else `seed` (this module's generator; random without one). `onAudio(chunk)` is
// called with each frame's samples as they are decoded. Returns {samples, sampleRate, frames, stopReason}.
async function speak(tts, text, { voice, noise, seed, maxFrames = null, cfgScale = 1.5, steps = 5, onAudio = null,
                                   decodeGroup = DECODE_GROUP } = {}) {
  const { ort } = tts;
  if (maxFrames !== null && !(Number.isInteger(maxFrames) && maxFrames >= 1)) throw new Error(`maxFrames ${maxFrames}: a whole number from 1 (or null: until the model ends)`);
  if (!(Number.isInteger(steps) && steps >= 1)) throw new Error(`steps ${steps}: a whole number of diffusion steps from 1`);
  if (!(Number.isFinite(cfgScale) && cfgScale > 0)) throw new Error(`cfgScale ${cfgScale}: a positive number`);
  if (!(Number.isInteger(decodeGroup) && decodeGroup >= 1)) throw new Error(`decodeGroup ${decodeGroup}: a whole number of frames from 1`);
  const noiseOf = noise ? rowsOf(noise) : seededNoise(seed ?? Math.floor(Math.random() * 2 ** 32));
  const feed = text instanceof TextFeed ? text : null;
  const ids = feed ? null : tts.tokenize(normaliseText(text));
  const tensors = tts.host, prompt = await tts.voice(voice ?? tts.voices[0]);
  const table = tensors.embed_tokens, width = table.dims[1], types = tensors.tts_input_types.data;
  const scale = tensors.speech_scaling_factor.data[0], bias = tensors.speech_bias_factor.data[0];
  const textType = types.slice(width, 2 * width), speechType = types.slice(0, width);
  const maxPositions = tts.manifest.config.decoder_config?.max_position_embeddings ?? 32768; // checkpoints.configs
  const lower = new LmStream(tts, "lower_lm", prompt.lm), upper = new GuidedStreams(tts, prompt.ttsLm, prompt.negTtsLm);
  let hPos = prompt.positive, hNeg = prompt.negative;
  const decoder = new FrameDecoder(tts, decodeGroup, onAudio);
  let frames = 0, stopReason = null, offset = 0;
  const embed = (window) => {
    const out = new Float32Array(window.length * width);
    window.forEach((id, i) => out.set(table.data.subarray(id * width, (id + 1) * width), i * width));
    return out;
  };
  let textLeft = true;
  while (stopReason === null) {
    const window = !textLeft ? [] : feed ? await feed.window() : ids.slice(offset, offset + TEXT_WINDOW);
    offset += window.length;
    textLeft = window.length > 0;
    if (window.length) {
      if (upper.positiveLength + window.length > maxPositions) { stopReason = "max_length"; break; }
      const lowerHidden = await lower.step(embed(window), window.length, width);
      hPos = await upper.text(lowerHidden.map((x, i) => f(x + textType[i % width])), window.length, width);
    }
    for (let n = 0; n < SPEECH_WINDOW; n++) {
      const z = await sampleLatent(tts, { positive: hPos, negative: hNeg, noise: noiseOf(frames), cfgScale, steps });
      frames += 1;
      await decoder.add(z.map((x) => f(f(x / scale) - bias)));
      if (maxFrames !== null && frames >= maxFrames) { stopReason = "max_frames"; break; }
      const connected = await tts.call("acoustic_connector", { latents: new ort.Tensor("float32", z, [1, 1, LATENT]) });
      const feedback = add(connected[Object.keys(connected)[0]].data, speechType);
      if (upper.positiveLength + 1 > maxPositions) { stopReason = "max_length"; break; }
      [hPos, hNeg] = await upper.speech(feedback, width);
      const eos = await tts.call("eos_classifier", { hidden_states: new ort.Tensor("float32", hPos, [1, width]) });
      const logit = eos[Object.keys(eos)[0]].data[0];
      if (1 / (1 + Math.exp(-logit)) > 0.5) { stopReason = "eos"; break; }
    }
  }
  await decoder.flush();
  return { samples: decoder.samples(), sampleRate: SAMPLE_RATE, frames, stopReason };
}

// Latents decoded as the loop makes them (generation/realtime.py's FrameDecoder): the first alone, for early first
// audio; the later ones `group` at a time through the streaming decoder, whose weights are then read once a group;
// a group never spans two speech windows, so a window's audio is out before the loop waits for streamed text.
class FrameDecoder {
  constructor(tts, group, onAudio) {
    Object.assign(this, { tts, group, onAudio, pending: [], frames: 0, chunks: [] });
    this.states = tts.manifest.graphs.acoustic_decoder_stream.states;
    this.state = Object.fromEntries(this.states.map((s) => [`state.${s.name}`,
      new tts.ort.Tensor("float32", new Float32Array(s.channels * s.length), [1, s.channels, s.length])]));
  }

  async add(unscaled) {
    this.pending.push(unscaled);
    this.frames += 1;
    if (this.frames === 1 || this.pending.length >= this.group || this.frames % SPEECH_WINDOW === 0) await this.flush();
  }

  async flush() {
    const count = this.pending.length;
    if (!count) return;
    const latents = new Float32Array(count * LATENT);
    this.pending.forEach((z, i) => latents.set(z, i * LATENT));
    this.pending = [];
    const decoded = await this.tts.call("acoustic_decoder_stream",
      { latents: new this.tts.ort.Tensor("float32", latents, [1, count, LATENT]), ...this.state });
    this.state = Object.fromEntries(this.states.map((s) => [`state.${s.name}`, decoded[`new_state.${s.name}`]]));
    const audio = decoded.audio.data, size = audio.length / count;
    for (let i = 0; i < count; i++) {
      const chunk = audio.slice(i * size, (i + 1) * size);
      this.chunks.push(chunk);
      if (this.onAudio) this.onAudio(chunk);
    }
  }

  samples() {
    const samples = new Float32Array(this.chunks.reduce((n, c) => n + c.length, 0));
    this.chunks.reduce((at, c) => { samples.set(c, at); return at + c.length; }, 0);
    return samples;
  }
}

// Playback from the first decoded frame: an AudioWorklet at the model's 24 kHz that plays chunks as they arrive.
const PLAYER = `registerProcessor("vibevoice-player", class extends AudioWorkletProcessor {
  constructor() { super(); this.queue = []; this.at = 0; this.port.onmessage = (e) => this.queue.push(e.data); }
  process(_, outputs) {
    const out = outputs[0][0];
    for (let i = 0; i < out.length; i++) {
      while (this.queue.length && this.at >= this.queue[0].length) { this.queue.shift(); this.at = 0; }
      out[i] = this.queue.length ? this.queue[0][this.at++] : 0;
    }
    return true;
  }
});`;


export default VibeVoice;
