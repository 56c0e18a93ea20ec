// VibeVoice-Realtime in the browser, on onnxruntime-web (WASM). `globalThis.vibevoice` is the scriptable API:
//   ready      a promise of the API once the site's record, the manifest and the tokenizer are in; rejected,
//              with the sentence `speak` would give, for a bundle that failed its gates
//   voices     the bundle's voices
//   tokenize(text) -> token ids, as the Python runtime's tokenizer gives them (no special tokens)
//   run(graph, feeds, fetches) -> outputs: one call of one of the bundle's graphs; feeds and outputs in the wire
//              form {name: {type, dims, data: base64}} that the parity tests send (types: float32, int64, int32)
//   timings    {graph: [ms of each session.run]}: the graphs' own time, without the wire's conversions
// The generation loop itself (speak, streamed text) comes next; its contract is a parity gate against Python.
import * as ort from "./ort/ort.wasm.min.mjs";
import { Tokenizer } from "./tokenizers/tokenizers.min.mjs";

const ARRAYS = { float32: Float32Array, int64: BigInt64Array, int32: Int32Array };
const api = { ort, sessions: new Map(), timings: {} };

async function json(path) {
  const response = await fetch(path);
  if (!response.ok) throw new Error(`${path}: the host answered ${response.status}`);
  return response.json();
}

async function start() {
  const site = await json("site.json");
  Object.assign(api, { site, voices: site.voices });
  if (site.refused) throw new Error(site.refused);
  // Threads need SharedArrayBuffer, which browsers give only to cross-origin isolated pages (COOP + COEP).
  ort.env.wasm.numThreads = globalThis.crossOriginIsolated ? Math.min(navigator.hardwareConcurrency || 1, 4) : 1;
  api.threads = ort.env.wasm.numThreads;
  api.manifest = await json(`${site.bundle}/manifest.json`);
  api.tokenizer = new Tokenizer(await json(`${site.bundle}/${api.manifest.tokenizer.file}`), {});
  return api;
}

api.tokenize = (text) => api.tokenizer.encode(text, { add_special_tokens: false }).ids;

api.session = (name) => {
  if (!api.sessions.has(name)) {
    const graph = api.site.graphs[name];
    if (!graph) throw new Error(`the bundle has no '${name}' graph`);
    const options = { executionProviders: ["wasm"], graphOptimizationLevel: "all" };
    if (graph.data) options.externalData = [{ path: graph.data, data: `${api.site.bundle}/${graph.data}` }];
    api.sessions.set(name, ort.InferenceSession.create(`${api.site.bundle}/${graph.file}`, options));
  }
  return api.sessions.get(name);
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

api.run = async (name, feeds, fetches) => {
  const session = await api.session(name);
  const inputs = Object.fromEntries(Object.entries(feeds).map(([key, value]) => [key, fromWire(value)]));
  const start = performance.now();
  const outputs = await session.run(inputs, fetches);
  (api.timings[name] ??= []).push(performance.now() - start);
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
  const conditioning = await api.session("diffusion_head_conditioning");
  const { modulation } = await conditioning.run({ timesteps: new ort.Tensor("float32", times, [2 * steps]),
    condition: new ort.Tensor("float32", condition, [2 * steps, width]) });
  const rows = modulation.dims[1], head = await api.session("diffusion_head_step");
  let x = Float32Array.from(noise), previous = null;
  for (let k = 0; k < steps; k++) {
    const noisy = new Float32Array(2 * size); noisy.set(x); noisy.set(x, size);
    const { velocity } = await head.run({ noisy_latents: new ort.Tensor("float32", noisy, [2, size]),
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

api.ready = start();
globalThis.vibevoice = api;
export default api;
