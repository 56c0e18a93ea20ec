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

api.ready = start();
globalThis.vibevoice = api;
export default api;
