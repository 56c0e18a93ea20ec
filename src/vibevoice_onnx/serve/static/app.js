// The vibevoice-onnx page: plain JS over the server's public routes only. The API key, when the server wants
// one, lives in this page's memory (never storage); websockets carry it as a subprotocol, since a browser
// cannot set their headers. What the page played, showed and sent is kept on window (__lastAudio,
// __lastTranscript, __liveSent, __liveRate, __liveChunks, __liveDone): the browser tests compare it with
// what the server gives for the same input.
"use strict";

const RATE = 24000; // the speech models' rate; the `pcm` format is s16le mono at it
const $ = (id) => document.getElementById(id);
let apiKey = null;
let models = [];
let voices = [];

// ---- errors and calls ----

function showError(message) {
  const line = $("error");
  line.textContent = message || "";
  line.hidden = !message;
}

async function errorSentence(response) {
  // The server's error body is {"error": {"message": ...}}: its one sentence is what the user sees.
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch (e) { /* not JSON: fall through */ }
  return `the server answered ${response.status} ${response.statusText}`;
}

async function call(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
  let response;
  try {
    response = await fetch(path, Object.assign({}, options, { headers }));
  } catch (e) {
    throw new Error(`the server could not be reached (${e.message})`);
  }
  if (response.status === 401) askForKey();
  if (!response.ok) throw new Error(await errorSentence(response));
  return response;
}

function socket(path) {
  // The page's subprotocol, and the key as base64url (a subprotocol is a token: no '/', '+' or '=').
  const protocols = ["vibevoice"];
  if (apiKey) {
    const bytes = new TextEncoder().encode(apiKey);
    const encoded = btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
    protocols.push(`vibevoice-key.${encoded}`);
  }
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(`${scheme}//${location.host}${path}`, protocols);
  ws.binaryType = "arraybuffer";
  return ws;
}

function socketMessage(event) {
  // A JSON message; an error event becomes the server's sentence.
  const message = JSON.parse(event.data);
  if (message.type === "error") throw new Error(message.error.message);
  return message;
}

function onSocketClose(ws, fail) {
  ws.addEventListener("close", (event) => {
    if (!ws.finished && event.code !== 1000) fail(new Error(event.reason || `the connection closed (code ${event.code})`));
  });
}

function askForKey() {
  $("key-form").hidden = false;
  $("key").focus();
}

// ---- models and voices ----

function describe(model) {
  const gates = { passed: "gates passed", failed: "gates FAILED", "not run": "not verified" }[model.gates] || "";
  return `${model.id} (${model.kind}, ${model.precision}, ${gates})`;
}

async function loadModels() {
  models = (await (await call("/v1/models")).json()).data;
  voices = (await (await call("/v1/audio/voices")).json()).voices;
  $("key-form").hidden = true;
  showError("");
  for (const select of document.querySelectorAll("select[data-task]")) {
    const kinds = select.dataset.kinds ? select.dataset.kinds.split(" ") : null;
    const chosen = select.value;
    select.replaceChildren(...models
      .filter((m) => m.task === select.dataset.task && (!kinds || kinds.includes(m.kind)))
      .map((m) => new Option(describe(m), m.id, false, m.id === chosen)));
    if (!select.options.length) select.append(new Option("no model of this kind is served", ""));
  }
  fillVoices($("speak-model"), $("speak-voice"));
  fillVoices($("type-model"), $("type-voice"));
  scriptVoices();
  $("voice-list").replaceChildren(...voices.map((v) => {
    const item = document.createElement("li");
    item.textContent = `${v.name} (${v.model})`;
    return item;
  }));
}

function voicesOf(modelId) {
  return voices.filter((v) => v.model === modelId).map((v) => v.id);
}

function voiceSelect(select, modelId) {
  const chosen = select.value;
  select.replaceChildren(...voicesOf(modelId).map((v) => new Option(v, v, false, v === chosen)));
}

function fillVoices(modelSelect, voiceSelectElement) {
  voiceSelect(voiceSelectElement, modelSelect.value);
}

function scriptSpeakers(text) {
  // The speaker numbers in sorted order: the server gives the comma-separated voices to them in that order.
  const numbers = new Set();
  for (const match of text.matchAll(/^\s*Speaker\s+(\d+)\s*:/gim)) numbers.add(Number(match[1]));
  return [...numbers].sort((a, b) => a - b);
}

function scriptVoices() {
  const box = $("script-voices");
  const previous = {};
  for (const select of box.querySelectorAll("select")) previous[select.dataset.speaker] = select.value;
  const rows = scriptSpeakers($("script-text").value).map((n) => {
    const label = document.createElement("label");
    const select = document.createElement("select");
    select.id = `script-voice-${n}`;
    select.dataset.speaker = n;
    label.htmlFor = select.id;
    label.textContent = `Speaker ${n}`;
    voiceSelect(select, $("script-model").value);
    if (previous[n] && voicesOf($("script-model").value).includes(previous[n])) select.value = previous[n];
    return [label, select];
  });
  box.replaceChildren(box.querySelector("legend"), ...rows.flat());
}

// ---- audio out: played as it arrives, kept for the download ----

let output = null; // one AudioContext for all playback (browsers limit how many a page may hold)

class Player {
  constructor() {
    output = output || new AudioContext({ sampleRate: RATE });
    this.context = output;
    this.next = 0;
    this.pieces = [];
    this.carry = null; // an odd byte left between two network chunks
    this.started = performance.now();
    this.firstAudio = null;
    window.__lastAudio = new Float32Array(0);
    $("speech-stats").textContent = "waiting for the first audio…";
  }

  pushBytes(buffer) {
    let bytes = new Uint8Array(buffer);
    if (this.carry) {
      const joined = new Uint8Array(bytes.length + 1);
      joined[0] = this.carry[0];
      joined.set(bytes, 1);
      bytes = joined;
      this.carry = null;
    }
    if (bytes.length % 2) {
      this.carry = bytes.slice(-1);
      bytes = bytes.slice(0, -1);
    }
    if (!bytes.length) return;
    const ints = new Int16Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length));
    const samples = Float32Array.from(ints, (v) => v / 32768);
    this.play(samples);
  }

  play(samples) {
    if (this.firstAudio === null) this.firstAudio = performance.now() - this.started;
    this.pieces.push(samples);
    const buffer = this.context.createBuffer(1, samples.length, RATE);
    buffer.copyToChannel(samples, 0);
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    this.next = Math.max(this.next, this.context.currentTime + 0.05);
    source.start(this.next);
    this.next += samples.length / RATE;
    this.stats(false);
  }

  samples() {
    const all = new Float32Array(this.pieces.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const piece of this.pieces) { all.set(piece, at); at += piece.length; }
    return all;
  }

  stats(done) {
    const seconds = this.pieces.reduce((n, p) => n + p.length, 0) / RATE;
    const elapsed = (performance.now() - this.started) / 1000;
    const parts = [];
    if (this.firstAudio !== null) parts.push(`first audio after ${Math.round(this.firstAudio)} ms`);
    parts.push(`${seconds.toFixed(2)} s of audio`);
    if (done && seconds > 0) parts.push(`RTF ${(elapsed / seconds).toFixed(2)} (generation time / audio time)`);
    $("speech-stats").textContent = parts.join(" · ");
  }

  finish() {
    const all = this.samples();
    window.__lastAudio = all;
    this.stats(true);
    if (!all.length) return;
    const url = URL.createObjectURL(new Blob([wav(all, RATE)], { type: "audio/wav" }));
    for (const element of [$("speech-audio"), $("speech-download")]) {
      if (element.dataset.url) URL.revokeObjectURL(element.dataset.url);
      element.dataset.url = url;
      element.hidden = false;
    }
    $("speech-audio").src = url;
    $("speech-download").href = url;
  }
}

function wav(samples, rate) {
  // 16-bit PCM WAV, the samples as the server sent them (they were 16-bit already).
  const out = new DataView(new ArrayBuffer(44 + samples.length * 2));
  const text = (at, s) => { for (let i = 0; i < s.length; i++) out.setUint8(at + i, s.charCodeAt(i)); };
  text(0, "RIFF"); out.setUint32(4, 36 + samples.length * 2, true); text(8, "WAVE");
  text(12, "fmt "); out.setUint32(16, 16, true); out.setUint16(20, 1, true); out.setUint16(22, 1, true);
  out.setUint32(24, rate, true); out.setUint32(28, rate * 2, true); out.setUint16(32, 2, true);
  out.setUint16(34, 16, true); text(36, "data"); out.setUint32(40, samples.length * 2, true);
  samples.forEach((v, i) => out.setInt16(44 + i * 2, Math.max(-32768, Math.min(32767, Math.round(v * 32768))), true));
  return out.buffer;
}

function advanced() {
  const options = {};
  for (const [field, id] of [["seed", "seed"], ["cfg_scale", "cfg"], ["steps", "steps"], ["max_frames", "frames"]]) {
    if ($(id).value !== "") options[field] = Number($(id).value);
  }
  return options;
}

// ---- speaking: one request, its pcm stream read as it comes ----

let running = null; // what a Stop button ends: {stop()}

function busy(form, job) {
  // The form's buttons off but its Stop while `job` runs; the returned function puts them back as they were.
  const buttons = [...form.querySelectorAll("button")];
  const before = buttons.map((b) => b.disabled);
  const stop = form.querySelector(".stop");
  buttons.forEach((b) => { b.disabled = b !== stop; });
  running = job;
  return () => {
    buttons.forEach((b, i) => { b.disabled = b === stop || before[i]; });
    if (running === job) running = null;
  };
}

async function speak(form, body) {
  showError("");
  const player = new Player();
  const controller = new AbortController();
  const done = busy(form, { stop: () => controller.abort() });
  try {
    const response = await call("/v1/audio/speech", {
      method: "POST", signal: controller.signal, headers: { "Content-Type": "application/json" },
      body: JSON.stringify(Object.assign({ response_format: "pcm" }, advanced(), body)),
    });
    const reader = response.body.getReader();
    for (;;) {
      const { value, done: ended } = await reader.read();
      if (ended) break;
      player.pushBytes(value);
    }
  } catch (e) {
    if (e.name !== "AbortError") showError(e.message);
  } finally {
    player.finish();
    done();
  }
}

$("speak-form").addEventListener("submit", (event) => {
  event.preventDefault();
  speak(event.target, { model: $("speak-model").value, voice: $("speak-voice").value, input: $("speak-text").value });
});

$("script-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const speakers = scriptSpeakers($("script-text").value);
  const chosen = speakers.map((n) => $(`script-voice-${n}`).value);
  speak(event.target, { model: $("script-model").value, voice: chosen.join(","), input: $("script-text").value });
});

// ---- type as it speaks: the text streamed in over the websocket ----

let typing = null; // the open session: {ws, player, sent, ...}
let spoken = ""; // what the last session spoke: typing on after it speaks only the new text

function unspoken() {
  const text = $("type-text").value;
  return text.startsWith(spoken) ? text.slice(spoken.length) : text;
}

function startTyping() {
  showError("");
  const ws = socket("/v1/audio/speech/stream");
  const sent = $("type-text").value.startsWith(spoken) ? spoken : "";
  const session = { ws, player: new Player(), sent, open: false };
  const fail = (e) => { showError(e.message); endTyping(session); };
  session.release = busy($("type-form"), { stop: () => { ws.close(1000); endTyping(session); } });
  $("type-done").disabled = false;
  ws.addEventListener("open", () => {
    session.open = true;
    ws.send(JSON.stringify(Object.assign({ model: $("type-model").value, voice: $("type-voice").value,
      response_format: "pcm" }, advanced())));
    sendTyped(session);
    if (session.finishing) finishTyping(session);
  });
  ws.addEventListener("message", (event) => {
    if (typeof event.data !== "string") { session.player.pushBytes(event.data); return; }
    try {
      if (socketMessage(event).type === "audio.done") { ws.finished = true; endTyping(session); }
    } catch (e) { ws.finished = true; fail(e); }
  });
  onSocketClose(ws, fail);
  return session;
}

function sendTyped(session) {
  const text = $("type-text").value;
  if (!session.open || text.length <= session.sent.length) return;
  session.ws.send(JSON.stringify({ type: "input_text.delta", delta: text.slice(session.sent.length) }));
  session.sent = text;
}

function finishTyping(session) {
  session.finishing = true;
  if (!session.open) return;
  sendTyped(session);
  session.ws.send(JSON.stringify({ type: "input_text.done" }));
  $("type-done").disabled = true;
}

function endTyping(session) {
  if (session.ended) return;
  session.ended = true;
  spoken = session.sent;
  session.player.finish();
  session.release();
  if (typing === session) typing = null;
}

$("type-text").addEventListener("input", () => {
  const area = $("type-text");
  if (typing && !area.value.startsWith(typing.sent)) {
    area.value = typing.sent; // what was sent is being spoken: only new text at the end can follow it
    showError("text already sent cannot be changed; type on at the end");
    return;
  }
  if (!typing && unspoken().trim()) typing = startTyping();
  if (typing) sendTyped(typing);
});

$("type-form").addEventListener("submit", (event) => {
  event.preventDefault();
  if (!typing && unspoken().trim()) typing = startTyping();
  if (typing) finishTyping(typing);
});

// ---- voices ----

$("voice-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  showError("");
  const form = new FormData();
  form.append("model", $("voice-model").value);
  form.append("name", $("voice-name").value.trim());
  form.append("audio_sample", $("voice-file").files[0]);
  const done = busy(event.target, null);
  try {
    const voice = await (await call("/v1/audio/voices", { method: "POST", body: form })).json();
    await loadModels();
    showStatus(`voice '${voice.name}' added to ${voice.model} (${voice.seconds.toFixed(1)} s sample)`);
  } catch (e) {
    showError(e.message);
  } finally {
    done();
  }
});

function showStatus(message) {
  let line = $("voice-status");
  if (!line) {
    line = document.createElement("p");
    line.id = "voice-status";
    line.setAttribute("aria-live", "polite");
    $("voice-form").after(line);
  }
  line.textContent = message;
}

// ---- transcription: a file, or the microphone (live over /v1/stream on ASR-Streaming models) ----

let transcript = { text: "", segments: [] };

function asrModel() {
  return models.find((m) => m.id === $("asr-model").value);
}

function showTranscript(text, segments) {
  transcript = { text, segments: segments || [] };
  window.__lastTranscript = transcript;
  $("asr-text").textContent = text;
  const body = $("asr-segments").querySelector("tbody");
  body.replaceChildren(...transcript.segments.map((s) => {
    const row = document.createElement("tr");
    for (const value of [s.speaker ?? "", clock(s.start, "."), clock(s.end, "."), s.text]) {
      const cell = document.createElement("td");
      cell.textContent = value;
      row.append(cell);
    }
    return row;
  }));
  $("asr-segments").hidden = !transcript.segments.length;
  $("asr-exports").hidden = !text && !transcript.segments.length;
}

function clock(seconds, point) {
  const ms = Math.round((seconds || 0) * 1000);
  const pad = (n, w) => String(n).padStart(w, "0");
  return `${pad(Math.floor(ms / 3600000), 2)}:${pad(Math.floor(ms / 60000) % 60, 2)}:${pad(Math.floor(ms / 1000) % 60, 2)}${point}${pad(ms % 1000, 3)}`;
}

function subtitles(format) {
  const point = format === "srt" ? "," : ".";
  const cues = transcript.segments.map((s, i) => {
    const who = s.speaker !== null && s.speaker !== undefined ? `[${s.speaker}] ` : "";
    const head = format === "srt" ? `${i + 1}\n` : "";
    return `${head}${clock(s.start, point)} --> ${clock(s.end, point)}\n${who}${s.text}\n`;
  });
  return (format === "vtt" ? "WEBVTT\n\n" : "") + cues.join("\n");
}

function download(name, text, type) {
  const link = document.createElement("a");
  link.href = URL.createObjectURL(new Blob([text], { type }));
  link.download = name;
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 1000);
}

function asrFields(form) {
  if ($("asr-hotwords").value.trim()) form.append("prompt", $("asr-hotwords").value.trim());
  if ($("asr-tokens").value) form.append("max_new_tokens", $("asr-tokens").value);
  if ($("asr-seed").value) form.append("seed", $("asr-seed").value);
  return form;
}

async function transcribeBlob(blob, name) {
  showError("");
  $("asr-chunks").replaceChildren();
  $("asr-status").textContent = "transcribing…";
  const form = asrFields(new FormData());
  form.append("model", $("asr-model").value);
  form.append("response_format", "verbose_json");
  form.append("file", blob, name);
  const started = performance.now();
  const done = busy($("transcribe-form"), null);
  try {
    const body = await (await call("/v1/audio/transcriptions", { method: "POST", body: form })).json();
    showTranscript(body.text, body.segments);
    const seconds = (performance.now() - started) / 1000;
    $("asr-status").textContent = `${body.duration.toFixed(2)} s of audio in ${seconds.toFixed(2)} s` +
      (body.warning ? ` (${body.warning})` : "");
  } catch (e) {
    $("asr-status").textContent = "";
    showError(e.message);
  } finally {
    done();
  }
}

$("transcribe-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const file = $("asr-file").files[0];
  if (!file) { showError("choose an audio file first"); return; }
  transcribeBlob(file, file.name);
});

let recording = null;

async function startRecording() {
  showError("");
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: false, noiseSuppression: false, autoGainControl: false, channelCount: 1 } });
  } catch (e) {
    showError(`the microphone is not available (${e.message})`);
    return;
  }
  const context = new AudioContext();
  await context.audioWorklet.addModule("/web/capture.js");
  const capture = new AudioWorkletNode(context, "capture");
  context.createMediaStreamSource(stream).connect(capture);
  const live = asrModel() && asrModel().kind === "asr-streaming";
  const session = { stream, context, capture, live, pieces: [], pending: [], pendingLength: 0 };
  window.__liveSent = session.pieces; // exactly what went to the server, piece by piece, at this rate
  window.__liveRate = context.sampleRate;
  window.__liveDone = false;
  window.__liveChunks = [];
  $("asr-chunks").replaceChildren();
  showTranscript("", []);
  if (live) session.ws = openLive(session);
  capture.port.onmessage = (event) => keepPiece(session, event.data);
  recording = session;
  $("record").disabled = true;
  $("record-stop").disabled = false;
  $("asr-status").textContent = live ? "listening: each chunk's text appears as it is decoded" : "recording…";
}

function keepPiece(session, samples) {
  // About a fifth of a second a message: small enough to stream, few enough messages.
  session.pending.push(samples);
  session.pendingLength += samples.length;
  if (session.pendingLength >= session.context.sampleRate / 5) flushPiece(session);
}

function flushPiece(session) {
  if (!session.pendingLength) return;
  const piece = new Float32Array(session.pendingLength);
  let at = 0;
  for (const part of session.pending) { piece.set(part, at); at += part.length; }
  session.pending = [];
  session.pendingLength = 0;
  if (session.live && session.ws.readyState !== WebSocket.OPEN) return; // not yet open: not sent, not kept
  session.pieces.push(piece);
  if (session.live) session.ws.send(piece.buffer);
}

function openLive(session) {
  const ws = socket("/v1/stream");
  const fail = (e) => { showError(e.message); stopCapture(session); };
  ws.addEventListener("open", () => {
    const settings = { model: $("asr-model").value, sample_rate: session.context.sampleRate, format: "f32le" };
    if ($("asr-hotwords").value.trim()) settings.prompt = $("asr-hotwords").value.trim();
    if ($("asr-tokens").value) settings.max_tokens = Number($("asr-tokens").value);
    if ($("asr-seed").value) settings.seed = Number($("asr-seed").value);
    ws.send(JSON.stringify(settings));
  });
  ws.addEventListener("message", (event) => {
    let message;
    try { message = socketMessage(event); } catch (e) { ws.finished = true; fail(e); return; }
    if (message.done) {
      ws.finished = true;
      showTranscript(message.text, message.segments);
      $("asr-status").textContent = `${message.total_chunks} chunks`;
      window.__liveDone = true;
      return;
    }
    window.__liveChunks.push(message);
    const item = document.createElement("li");
    item.textContent = `${clock(message.start, ".")} ${message.text}`;
    $("asr-chunks").append(item);
  });
  onSocketClose(ws, fail);
  return ws;
}

function stopCapture(session) {
  session.capture.port.onmessage = null;
  session.stream.getTracks().forEach((t) => t.stop());
  session.context.close();
  recording = null;
  $("record").disabled = false;
  $("record-stop").disabled = true;
}

function stopRecording() {
  const session = recording;
  if (!session) return;
  flushPiece(session);
  stopCapture(session);
  if (session.live) {
    if (session.ws.readyState === WebSocket.OPEN) session.ws.send("end");
    $("asr-status").textContent = "finishing the last chunk…";
    return;
  }
  const all = new Float32Array(session.pieces.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const piece of session.pieces) { all.set(piece, at); at += piece.length; }
  transcribeBlob(new Blob([wav(all, session.context.sampleRate)], { type: "audio/wav" }), "recording.wav");
}

$("record").addEventListener("click", startRecording);
$("record-stop").addEventListener("click", stopRecording);
$("asr-copy").addEventListener("click", async () => {
  try { await navigator.clipboard.writeText(transcript.text); } catch (e) { showError(`copying failed (${e.message})`); }
});
for (const button of document.querySelectorAll("[data-export]")) {
  button.addEventListener("click", () => {
    const format = button.dataset.export;
    const text = format === "txt" ? `${transcript.text}\n` : subtitles(format);
    download(`transcript.${format}`, text, format === "vtt" ? "text/vtt" : "text/plain");
  });
}

// ---- the page: tabs, stop buttons, key ----

const SPEECH_TABS = ["tab-speak", "tab-type", "tab-script"];

function selectTab(tab) {
  for (const other of document.querySelectorAll("[role=tab]")) {
    const selected = other === tab;
    other.setAttribute("aria-selected", String(selected));
    other.tabIndex = selected ? 0 : -1;
    $(other.getAttribute("aria-controls")).hidden = !selected;
  }
  const speech = SPEECH_TABS.includes(tab.id);
  $("advanced").hidden = !speech;
  $("speech-out").hidden = !speech;
}

const tabs = [...document.querySelectorAll("[role=tab]")];
for (const tab of tabs) {
  tab.addEventListener("click", () => selectTab(tab));
  tab.addEventListener("keydown", (event) => { // arrow keys move between tabs, as in every tab list
    const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
    if (!step) return;
    const next = tabs[(tabs.indexOf(tab) + step + tabs.length) % tabs.length];
    next.focus();
    selectTab(next);
  });
}
for (const stop of document.querySelectorAll(".stop")) {
  stop.addEventListener("click", () => { if (running) running.stop(); });
}
$("speak-model").addEventListener("change", () => fillVoices($("speak-model"), $("speak-voice")));
$("type-model").addEventListener("change", () => fillVoices($("type-model"), $("type-voice")));
$("script-model").addEventListener("change", scriptVoices);
$("script-text").addEventListener("input", scriptVoices);
$("key-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  apiKey = $("key").value;
  try { await loadModels(); } catch (e) { showError(e.message); }
});

selectTab($("tab-speak"));
loadModels().catch((e) => showError(e.message));
