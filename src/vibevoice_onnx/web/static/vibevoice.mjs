// VibeVoice-Realtime in the browser, on onnxruntime-web (WebGPU where the browser offers a GPU adapter, else WASM).
// `globalThis.vibevoice` is the scriptable API (docs/browser.md lists every member):
//   ready      a promise of the API once the site's record, the manifest and the tokenizer are in; rejected,
//              with the sentence `speak` would give, for a bundle it may not run
//   speak(text, options), speakStream(options): the realtime loop in the tab, whole text or text in pieces
//   tokenize, normalise, schedule, sampleLatent, run, session, player, timings: its pieces, each gated against
//              the Python runtime in a real browser (tests/test_browser_site.py)
import { Tokenizer } from "./tokenizers/tokenizers.min.mjs";

const ARRAYS = { float32: Float32Array, int64: BigInt64Array, int32: Int32Array };
const api = { sessions: new Map(), timings: {} };
// onnxruntime-web, once the provider is chosen: its WASM build, or its WebGPU build (which runs on WASM's kernels
// every node WebGPU has no kernel for).
let ort = null;
const BUILDS = { wasm: "./ort/ort.wasm.min.mjs", webgpu: "./ort/ort.webgpu.min.mjs" };

// The provider: the page's `?provider=` (wasm or webgpu) if given, else WebGPU where the browser offers a hardware
// adapter (a software one, such as SwiftShader, is slower than WASM), else WASM.
async function chooseProvider() {
  const asked = new URLSearchParams(globalThis.location?.search ?? "").get("provider");
  if (asked !== null && !(asked in BUILDS)) throw new Error(`?provider=${asked}: the page runs on ${Object.keys(BUILDS).join(" or ")}`);
  if (asked === "wasm") return { provider: "wasm", adapter: null };
  const adapter = globalThis.navigator?.gpu ? await navigator.gpu.requestAdapter().catch(() => null) : null;
  const info = adapter ? { vendor: adapter.info?.vendor, architecture: adapter.info?.architecture,
                           software: Boolean(adapter.info?.isFallbackAdapter ?? adapter.isFallbackAdapter) } : null;
  if (asked === "webgpu" && !adapter) throw new Error("?provider=webgpu: this browser offers no WebGPU adapter");
  return { provider: asked === "webgpu" || (info && !info.software) ? "webgpu" : "wasm", adapter: info };
}

async function json(path) {
  const response = await fetch(path);
  if (!response.ok) throw new Error(`${path}: the host answered ${response.status}`);
  return response.json();
}

async function start() {
  const site = await json("site.json");
  Object.assign(api, { site, voices: site.voices });
  if (site.refused) throw new Error(site.refused);
  Object.assign(api, await chooseProvider());
  ort = await import(BUILDS[api.provider]);
  api.ort = ort;
  // Threads need SharedArrayBuffer, which browsers give only to cross-origin isolated pages (COOP + COEP).
  ort.env.wasm.numThreads = globalThis.crossOriginIsolated ? Math.min(navigator.hardwareConcurrency || 1, 4) : 1;
  api.threads = ort.env.wasm.numThreads;
  api.manifest = await json(`${site.bundle}/manifest.json`);
  // The record of `vibevoice-onnx web --check` (this site's page held to the Python runtime in Chromium):
  // {passed: null} until it runs.
  api.browserGates = await json("browser-gates.json");
  api.tokenizer = new Tokenizer(await json(`${site.bundle}/${api.manifest.tokenizer.file}`), {});
  return api;
}

api.tokenize = (text) => api.tokenizer.encode(text, { add_special_tokens: false }).ids;

// onnxruntime's WebAssembly binds the console when it loads, so the console is wrapped before it loads: while
// api.placement listens, what is written to it is kept there instead.
let listening = null;
for (const level of ["log", "warn", "error"]) {
  const write = console[level].bind(console);
  console[level] = (...args) => (listening ? listening.push(args.join(" ")) : write(...args));
}

// A new session of graph `name` on the page's provider (WebGPU with WASM for the nodes it has no kernel for).
function createSession(name, extra = {}) {
  const graph = api.site.graphs[name];
  if (!graph) throw new Error(`the bundle has no '${name}' graph`);
  // Errors only in the console: on WebGPU onnxruntime warns, for every graph, that it keeps the shape arithmetic
  // on WASM; api.placement says where each node runs.
  const options = { executionProviders: api.provider === "webgpu" ? ["webgpu", "wasm"] : ["wasm"],
                    graphOptimizationLevel: "all", logSeverityLevel: 3, ...extra };
  if (graph.data) options.externalData = [{ path: graph.data, data: `${api.site.bundle}/${graph.data}` }];
  return ort.InferenceSession.create(`${api.site.bundle}/${graph.file}`, options);
}

api.session = (name) => {
  if (!api.sessions.has(name)) api.sessions.set(name, createSession(name));
  return api.sessions.get(name);
};

// Where onnxruntime places graph `name`'s nodes on the page's provider: {provider: {nodes, ops: {op type: count}}}
// (ops where onnxruntime lists them: for a provider that got only some of the nodes). Read from onnxruntime's
// verbose log of a fresh session, which it writes to the console.
api.placement = async (name) => {
  const lines = [];
  listening = lines;
  try {
    await createSession(name, { logSeverityLevel: 0, logVerbosityLevel: 0 });
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
};

function fromWire({ type, dims, data }) {
  const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
  return new ort.Tensor(type, new ARRAYS[type](bytes.buffer), dims);
}

function toWire(tensor) {
  const bytes = new Uint8Array(tensor.data.buffer, tensor.data.byteOffset, tensor.data.byteLength);
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return { type: tensor.type, dims: Array.from(tensor.dims), data: btoa(text) };
}

// One call of graph `name`, its session.run time kept in api.timings.
async function call(name, feeds, fetches) {
  const session = await api.session(name), start = performance.now(), outputs = await session.run(feeds, fetches);
  (api.timings[name] ??= []).push(performance.now() - start);
  return outputs;
}

api.run = async (name, feeds, fetches) => {
  const inputs = Object.fromEntries(Object.entries(feeds).map(([key, value]) => [key, fromWire(value)]));
  const outputs = await call(name, inputs, fetches);
  return Object.fromEntries(Object.entries(outputs).map(([key, value]) => [key, toWire(value)]));
};

// DPM-Solver++ as the Python runtime runs it (vibevoice_onnx.sampling, facts sheet 4.1): 1000 training steps,
// cosine betas, v-prediction, order 2 with the midpoint rule, first order on the first and the final step, final
// sigma zero. Its arithmetic is fp32 there, so every scalar operation here is rounded to fp32 (Math.fround).
const f = Math.fround;
const TRAIN_STEPS = 1000;

api.schedule = (steps) => {
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
};

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
api.sampleLatent = async ({ positive, negative, noise, cfgScale, steps }) => {
  const { timesteps, sigmas } = api.schedule(steps);
  const width = positive.length, size = noise.length;
  const condition = new Float32Array(2 * steps * width), times = new Float32Array(2 * steps);
  timesteps.forEach((t, k) => {
    condition.set(positive, 2 * k * width); condition.set(negative, (2 * k + 1) * width);
    times[2 * k] = times[2 * k + 1] = t;
  });
  const { modulation } = await call("diffusion_head_conditioning", { timesteps: new ort.Tensor("float32", times, [2 * steps]),
    condition: new ort.Tensor("float32", condition, [2 * steps, width]) });
  const rows = modulation.dims[1];
  let x = Float32Array.from(noise), previous = null;
  for (let k = 0; k < steps; k++) {
    const noisy = new Float32Array(2 * size); noisy.set(x); noisy.set(x, size);
    const { velocity } = await call("diffusion_head_step", { noisy_latents: new ort.Tensor("float32", noisy, [2, size]),
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
};

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
function toFloat32(dtype, buffer, begin, end) {
  const bytes = buffer.slice(begin, end);
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
  throw new Error(`a tensor of type ${dtype}, which the page does not read`);
}

async function safetensors(path) {
  const response = await fetch(path);
  if (!response.ok) throw new Error(`${path}: the host answered ${response.status}`);
  const buffer = await response.arrayBuffer();
  const length = Number(new DataView(buffer).getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 8, length)));
  const tensors = {};
  for (const [name, t] of Object.entries(header)) {
    if (name === "__metadata__") continue;
    tensors[name] = { dims: t.shape, data: toFloat32(t.dtype, buffer, 8 + length + t.data_offsets[0], 8 + length + t.data_offsets[1]) };
  }
  return tensors;
}

async function host() {
  api.host ??= safetensors(`${api.site.bundle}/${api.manifest.host_tensors}`);
  return api.host;
}

async function loadVoice(name) {
  if (!api.voices.includes(name)) throw new Error(`no voice '${name}' in this bundle (it has ${api.voices.join(", ")})`);
  const tensors = await safetensors(`${api.site.bundle}/voices/${name}.safetensors`);
  const layers = (prefix) => {
    const flat = [];
    for (let i = 0; `${prefix}.${i}.key` in tensors; i++) flat.push(tensors[`${prefix}.${i}.key`], tensors[`${prefix}.${i}.value`]);
    return flat;
  };
  return { lm: layers("lm"), ttsLm: layers("tts_lm"), negTtsLm: layers("neg_tts_lm"),
           positive: tensors.tts_condition.data, negative: tensors.neg_condition.data };
}

// ---- an LM stream: one row, its cache grown call by call (the graph returns past + the new positions) ----------
class LmStream {
  constructor(name, layers) {
    this.name = name;
    this.past = layers.map((t) => new ort.Tensor("float32", t.data, t.dims));
    this.length = layers[0].dims[2];
  }

  async step(embeds, count, width) { // embeds [count, width] -> the hidden states [count, width]
    const session = await api.session(this.name);
    const positions = new BigInt64Array(count).map((_, i) => BigInt(this.length + i));
    const feeds = { inputs_embeds: new ort.Tensor("float32", embeds, [1, count, width]),
      position_ids: new ort.Tensor("int64", positions, [1, count]),
      seqlens_k: new ort.Tensor("int32", Int32Array.of(this.length + count - 1), [1]),
      total_sequence_length: new ort.Tensor("int32", Int32Array.of(this.length + count), []) };
    session.inputNames.slice(4).forEach((name, i) => { feeds[name] = this.past[i]; });
    const outputs = await call(this.name, feeds);
    this.past = session.outputNames.slice(1).map((name) => outputs[name]);
    this.length += count;
    return outputs[session.outputNames[0]].data;
  }

  async last(embeds, count, width) { // the last position's hidden state [width]
    return (await this.step(embeds, count, width)).slice((count - 1) * width, count * width);
  }
}

const add = (a, b) => a.map((x, i) => f(x + b[i]));
const TEXT_WINDOW = 5, SPEECH_WINDOW = 6, LATENT = 64;
const CONTROLS = /[\x00-\x08\x0b-\x1f\x7f-\x9f]/g;
// The demo's quotes, as the Python runtime replaces them (text._QUOTES).
const withQuotes = (text) => text.replaceAll("\u2019", "'").replaceAll("\u201c", '"').replaceAll("\u201d", '"');

// Noise rows given (frames x 64, as `speak --noise` takes them): frame k's row, or an error past the last.
function rowsOf(noise) {
  const rows = ArrayBuffer.isView(noise) ? noise : Float32Array.from(noise.flat()), available = Math.floor(rows.length / LATENT);
  return (frame) => {
    if (frame >= available) throw new Error(`the noise has ${available} rows, but generation reached frame ${frame + 1}`);
    return rows.subarray(frame * LATENT, (frame + 1) * LATENT);
  };
}

// Noise from a seed, frame by frame: the page's own generator (xorshift128 and Box-Muller), reproducible in the
// page but not the Python runtime's numpy stream: for speech equal to Python's, pass its noise rows.
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

// The text as the Python runtime reads it (text.normalise_tts_text): controls out, stripped, the demo's quotes
// replaced, stripped, a newline after.
api.normalise = (text) => {
  const out = withQuotes(text.replace(CONTROLS, "").trim()).trim();
  if (!out) throw new Error("the text has nothing to speak (it is empty, or only whitespace and control characters)");
  return `${out}\n`;
};

// Text that arrives in pieces (an LLM's tokens), handed to the loop as 5-token windows, with the ids of the whole
// text whatever the split (text.TextFeed's rule): a token is settled once it ends before the last whitespace run
// that has text after it, where the tokenizer's pre-tokens cannot change whatever comes next.
class TextFeed {
  constructor() { this.text = ""; this.ids = []; this.handed = 0; this.finished = false; this.wake = () => {}; }

  feed(piece) {
    if (this.finished) throw new Error("this text is already finished: no more pieces can be added");
    this.text += String(piece).replace(CONTROLS, "");
    const prepared = withQuotes(this.text).trimStart();
    const end = prepared.trimEnd().length;
    let cut = -1;
    for (let i = end - 1; i >= 0; i--) if (/\s/.test(prepared[i])) { cut = i; break; }
    if (cut >= 0) {
      while (cut > 0 && /\s/.test(prepared[cut - 1])) cut -= 1;
      this.extend(api.tokenize(prepared.slice(0, cut)));
    }
    this.wake();
  }

  finish() {
    if (this.finished) return;
    this.extend(api.tokenize(api.normalise(this.text)));
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

// Speech of text that streams in: {feed(piece), finish(), done} where `done` is speak's promise; audio leaves
// through onAudio as it is decoded, and the loop waits for each window as the Python runtime's text_stream does.
api.speakStream = (options = {}) => {
  const text = new TextFeed();
  return { feed: (piece) => text.feed(piece), finish: () => text.finish(), ids: () => text.ids.slice(),
           done: api.speak(text, options) };
};

// Speech of `text` with `voice`: the realtime loop (generation/realtime.py's `_latents`), each latent decoded as it
// comes. `noise`: frames x 64 rows (arrays or one flat Float32Array), as `speak --noise` takes (the Python
// runtime's speech, exactly); else `seed` (the page's own generator; random without one). `onAudio(chunk)` is
// called with each frame's samples as they are decoded. Returns {samples, sampleRate, frames, stopReason}.
api.speak = async (text, { voice, noise, seed, maxFrames = null, cfgScale = 1.5, steps = 5, onAudio = null } = {}) => {
  const noiseOf = noise ? rowsOf(noise) : seededNoise(seed ?? Math.floor(Math.random() * 2 ** 32));
  const feed = text instanceof TextFeed ? text : null;
  const ids = feed ? null : api.tokenize(api.normalise(text));
  const tensors = await host(), prompt = await loadVoice(voice ?? api.voices[0]);
  const table = tensors.embed_tokens, width = table.dims[1], types = tensors.tts_input_types.data;
  const scale = tensors.speech_scaling_factor.data[0], bias = tensors.speech_bias_factor.data[0];
  const textType = types.slice(width, 2 * width), speechType = types.slice(0, width);
  const maxPositions = api.site.max_positions;
  const lower = new LmStream("lower_lm", prompt.lm), positive = new LmStream("upper_lm", prompt.ttsLm);
  const negative = new LmStream("upper_lm", prompt.negTtsLm);
  let hPos = prompt.positive, hNeg = prompt.negative;
  const decoder = api.manifest.graphs.acoustic_decoder_stream;
  let state = Object.fromEntries(decoder.states.map((s) => [`state.${s.name}`,
    new ort.Tensor("float32", new Float32Array(s.channels * s.length), [1, s.channels, s.length])]));
  const chunks = [];
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
      if (positive.length + window.length > maxPositions) { stopReason = "max_length"; break; }
      const lowerHidden = await lower.step(embed(window), window.length, width);
      hPos = await positive.last(lowerHidden.map((x, i) => f(x + textType[i % width])), window.length, width);
    }
    for (let n = 0; n < SPEECH_WINDOW; n++) {
      const z = await api.sampleLatent({ positive: hPos, negative: hNeg, noise: noiseOf(frames), cfgScale, steps });
      frames += 1;
      const unscaled = z.map((x) => f(f(x / scale) - bias));
      const decoded = await call("acoustic_decoder_stream", { latents: new ort.Tensor("float32", unscaled, [1, 1, LATENT]), ...state });
      state = Object.fromEntries(decoder.states.map((s) => [`state.${s.name}`, decoded[`new_state.${s.name}`]]));
      chunks.push(decoded.audio.data);
      if (onAudio) onAudio(decoded.audio.data);
      if (maxFrames !== null && frames >= maxFrames) { stopReason = "max_frames"; break; }
      const connected = await call("acoustic_connector", { latents: new ort.Tensor("float32", z, [1, 1, LATENT]) });
      const feedback = add(connected[Object.keys(connected)[0]].data, speechType);
      if (positive.length + 1 > maxPositions) { stopReason = "max_length"; break; }
      hPos = await positive.last(feedback, 1, width);
      hNeg = await negative.last(feedback, 1, width);
      const eos = await call("eos_classifier", { hidden_states: new ort.Tensor("float32", hPos, [1, width]) });
      const logit = eos[Object.keys(eos)[0]].data[0];
      if (1 / (1 + Math.exp(-logit)) > 0.5) { stopReason = "eos"; break; }
    }
  }
  const samples = new Float32Array(chunks.reduce((n, c) => n + c.length, 0));
  chunks.reduce((at, c) => { samples.set(c, at); return at + c.length; }, 0);
  return { samples, sampleRate: 24000, frames, stopReason };
};

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

api.player = async () => {
  if (!api.audio) {
    const context = new AudioContext({ sampleRate: 24000 });
    await context.audioWorklet.addModule(URL.createObjectURL(new Blob([PLAYER], { type: "text/javascript" })));
    const node = new AudioWorkletNode(context, "vibevoice-player");
    node.connect(context.destination);
    api.audio = { context, play: (chunk) => node.port.postMessage(chunk) };
  }
  await api.audio.context.resume();
  return api.audio;
};

api.ready = start();
globalThis.vibevoice = api;
export default api;
