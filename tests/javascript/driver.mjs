// What tests/test_javascript.py asks of the module in Node.js, as a user's program imports it (the package npm
// installed from `npm pack`): a JSON request on stdin, a JSON answer on stdout ({error} for a rejection).
import { VibeVoice, isSpace, normaliseText } from "vibevoice-onnx";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const request = JSON.parse(Buffer.concat(chunks).toString("utf8"));

async function answer({ action, bundle, options = {}, text, texts, speak = {}, calls = [] }) {
  if (action === "text") {
    const spaces = [];
    for (let c = 0; c <= 0x10ffff; c++) if (isSpace(String.fromCodePoint(c))) spaces.push(c);
    const normalised = texts.map((t) => { try { return normaliseText(t); } catch (e) { return { error: e.message }; } });
    return { spaces, normalised };
  }
  const progress = [];
  const tts = await VibeVoice.load(bundle, { ...options, onProgress: (p) => progress.push(p) });
  try {
    const out = { voices: tts.voices, gates: tts.gates, device: tts.device, progress };
    if (action === "tokenize") out.ids = texts.map((t) => tts.tokenize(t));
    if (action === "calls") out.outputs = await Promise.all(calls.map(({ name, feeds, fetches }) => tts.run(name, feeds, fetches)));
    if (action === "bench") { // benchmarks/node.py: speak twice (cold, then warm), timed as the page's are
      out.ready_ms = tts.timings.ready;
      out.runs = [];
      for (let i = 0; i < 2; i++) {
        const start = performance.now();
        let first = null;
        const r = await tts.speak(text, { ...speak, onAudio: () => { first ??= performance.now() - start; } });
        const seconds = (performance.now() - start) / 1000;
        out.runs.push({ frames: r.frames, first_audio_seconds: first / 1000, seconds,
                        real_time_factor: seconds / (r.samples.length / r.sampleRate) });
      }
      out.peak_rss_bytes = process.resourceUsage().maxRSS * 1024;
      out.graph_ms = Object.fromEntries(Object.entries(tts.timings).filter(([, v]) => Array.isArray(v))
        .map(([name, v]) => [name, { calls: v.length, total: Math.round(v.reduce((a, b) => a + b, 0)) }]));
    }
    if (action === "speak") {
      const result = await tts.speak(text, speak);
      Object.assign(out, { samples: Array.from(result.samples), rate: result.sampleRate, frames: result.frames,
                           stop: result.stopReason, calls: Object.fromEntries(Object.entries(tts.timings)
                             .filter(([, v]) => Array.isArray(v)).map(([name, v]) => [name, v.length])) });
    }
    return out;
  } finally {
    await tts.close();
  }
}

process.stdout.write(JSON.stringify(await answer(request).catch((e) => ({ error: e.message }))));
