"""The server in process: every route, every error case, each answered with OpenAI's error body and never a
traceback; speech and transcripts equal to what the runtime gives for the same seed."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("av")

from fastapi.testclient import TestClient  # noqa: E402

from vibevoice_onnx.serve import Models, Settings, create_app  # noqa: E402

from conftest import write_voice_sample  # noqa: E402
from helpers import eventually  # noqa: E402

TEXT = "Serving speech the way OpenAI's clients expect it."




@pytest.fixture(scope="module")
def bundles(tiny_bundle, tiny_15b_bundle, tiny_asr_bundle, tmp_path_factory):
    """Copies: the voices route writes into the 1.5B bundle."""
    root = tmp_path_factory.mktemp("served")
    return [shutil.copytree(b, root / name) for b, name in
            ((tiny_bundle, "cpu_fp32"), (tiny_15b_bundle, "cpu_fp32_15b"), (tiny_asr_bundle, "cpu_fp32_asr"))]


@pytest.fixture(scope="module")
def models(bundles):
    return Models.open(bundles, aliases={"alloy": "synthetic"})


@pytest.fixture(scope="module")
def client(models):
    with TestClient(create_app(models, Settings(max_upload_mb=1.0, body_timeout=2.0))) as c:
        yield c


def test_serve_refuses_a_bundle_that_failed_its_gates_unless_forced(tiny_bundle, tmp_path):
    """`serve` admits bundles by their recorded verdict before anything listens: one that failed is refused in one
    sentence naming its failed gate, and never announced as served; --force serves it, and says its gates failed."""
    import subprocess
    import sys

    from helpers import free_port

    bundle = shutil.copytree(tiny_bundle, tmp_path / "cpu_fp32")
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["parity"] = {"passed": False, "gates": [{"name": "diffusion_head", "passed": False},
                                                     {"name": "eos_classifier", "passed": True}]}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(Exception, match="failed its parity gates"):
        Models.open([bundle])
    forced = Models.open([bundle], force=True)
    assert next(iter(forced.by_id.values())).describe()["gates"] == "failed"
    done = subprocess.run([sys.executable, "-m", "vibevoice_onnx.cli", "serve", str(bundle), "--port", str(free_port())],
                          capture_output=True, text=True, timeout=120)  # a server that started would run past this
    assert done.returncode == 2, done.stderr
    assert f"error: {bundle}: failed its parity gates (diffusion_head), so it is not usable" in done.stderr
    assert "serving on" not in done.stderr and "Traceback" not in done.stderr


def ids(models):
    by_kind = {m.kind: m.id for m in models.by_id.values()}
    return by_kind["realtime"], by_kind["1.5b"], by_kind["asr"]


def error_of(response, status: int, param=None) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["param"] == param
    return body["error"]["message"]


def pcm16(audio: np.ndarray) -> bytes:
    return np.round(np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


def wav_bytes(samples: np.ndarray, rate: int = 24000) -> bytes:
    import soundfile as sf

    out = io.BytesIO()
    sf.write(out, samples, rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


def speech_like(seconds: float = 1.5, rate: int = 24000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2).astype(np.float32)


# ---- models, voices, health, auth ----

def test_models_list_every_bundle_with_kind_and_precision(client, models):
    data = client.get("/v1/models").json()["data"]
    assert {(m["kind"], m["precision"]) for m in data} == {("realtime", "fp32"), ("1.5b", "fp32"), ("asr", "fp32")}
    assert all(m["object"] == "model" for m in data)
    realtime = ids(models)[0]
    assert client.get(f"/v1/models/{realtime}").json()["id"] == realtime
    error_of(client.get("/v1/models/nope"), 404, "model")


def test_openai_names_go_to_the_first_model_of_their_task(models):
    realtime, _, asr = ids(models)
    assert models.get("tts-1", "tts").id == realtime and models.get("gpt-4o-mini-tts", "tts").id == realtime
    assert models.get("whisper-1", "asr").id == asr
    with pytest.raises(Exception, match="does not do transcription"):
        models.get(realtime, "asr")


def test_voices_list_has_the_clients_shape(client, models):
    voices = client.get("/v1/audio/voices").json()["voices"]
    assert {"id": "synthetic", "name": "synthetic", "model": ids(models)[0]} in voices
    assert {"id": "alice", "name": "alice", "model": ids(models)[1]} in voices
    assert [v["id"] for v in client.get("/v1/audio/voices", params={"model": ids(models)[1]}).json()["voices"]] == ["alice"]


def test_health_is_open_and_everything_else_needs_the_key(models):
    with TestClient(create_app(models, Settings(api_key="s3cret"))) as c:
        assert c.get("/health").status_code == 200
        assert "API key" in error_of(c.get("/v1/models"), 401)
        assert c.post("/v1/audio/speech", json={"model": "tts-1", "input": "hi"}).status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert c.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401


def key_protocol(key: str) -> str:
    import base64

    return "vibevoice-key." + base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def test_a_browser_sends_the_key_on_a_websocket_as_a_subprotocol(models):
    """Browsers cannot set a websocket's headers: the key comes as a subprotocol, which is never echoed; a wrong
    one is accepted only to be answered with the error event (a browser reads no reason from a refused handshake),
    and the header still works."""
    from starlette.websockets import WebSocketDisconnect

    key = "s3cret/+=key"  # base64url makes any key a valid subprotocol token
    with TestClient(create_app(models, Settings(api_key=key))) as c:
        with c.websocket_connect("/v1/audio/speech/stream", subprotocols=["vibevoice", key_protocol(key)]) as ws:
            assert ws.accepted_subprotocol == "vibevoice"
            ws.send_json({"model": "tts-1", "voice": "nobody"})
            assert ws.receive_json()["error"]["param"] == "voice"  # past the key: the request itself is judged
        with c.websocket_connect("/v1/stream", subprotocols=["vibevoice", key_protocol("wrong")]) as ws:
            event = ws.receive_json()
            assert event["error"]["code"] == "invalid_api_key" and "subprotocol" in event["error"]["message"]
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_json()
            assert closed.value.code == 1008
        with pytest.raises(WebSocketDisconnect) as refused:  # no page protocol, no key: refused at the handshake
            with c.websocket_connect("/v1/stream", subprotocols=[key_protocol("wrong")]):
                pass
        assert refused.value.code == 1008
        with c.websocket_connect("/v1/audio/speech/stream", headers={"Authorization": f"Bearer {key}"}) as ws:
            assert ws.accepted_subprotocol is None
            ws.send_json({"model": "tts-1", "voice": "nobody"})
            assert ws.receive_json()["error"]["param"] == "voice"


def test_the_page_is_served_without_the_key_and_nothing_else_is(models):
    with TestClient(create_app(models, Settings(api_key="s3cret"))) as c:
        page = c.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert '"/web/app.js"' in page.text and '"/web/style.css"' in page.text
        for name in ("app.js", "style.css", "capture.js"):
            assert c.get(f"/web/{name}").status_code == 200
        error_of(c.get("/web/secrets.txt"), 404)
        error_of(c.get("/web/../v1/models"), 401)
        assert "/" not in c.get("/openapi.json", headers={"Authorization": "Bearer s3cret"}).json()["paths"]


def test_models_say_whether_they_passed_their_gates(client):
    assert {m["gates"] for m in client.get("/v1/models").json()["data"]} == {"not run"}  # the tiny bundles: fp32, unverified


def test_unknown_routes_and_methods_get_the_error_body(client):
    error_of(client.get("/v1/nothing"), 404)
    error_of(client.get("/v1/audio/speech"), 405)


# ---- speech ----

def test_speech_pcm_equals_the_runtime_for_the_same_seed(client, models):
    realtime = models.by_id[ids(models)[0]]
    audio, _ = realtime.runner.create(TEXT, "synthetic", seed=5, max_frames=12)
    response = client.post("/v1/audio/speech", json={"model": "tts-1", "input": TEXT, "voice": "alloy",
                                                     "response_format": "pcm", "seed": 5, "max_frames": 12})
    assert response.status_code == 200 and response.headers["content-type"] == "audio/pcm"
    assert response.headers["x-vibevoice-seed"] == "5"
    assert response.content == pcm16(audio)


def test_speech_sse_events_carry_the_same_audio(client, models):
    realtime = models.by_id[ids(models)[0]]
    audio, _ = realtime.runner.create(TEXT, "synthetic", seed=6, max_frames=9)
    response = client.post("/v1/audio/speech", json={"model": "tts-1", "input": TEXT, "voice": "synthetic", "seed": 6,
                                                     "max_frames": 9, "response_format": "pcm", "stream_format": "sse"})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
    import base64

    assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"} and events[-1]["type"] == "speech.audio.done"
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == pcm16(audio)
    usage = events[-1]["usage"]
    assert usage["output_tokens"] == 9 and usage["total_tokens"] == usage["input_tokens"] + 9 > 9


def test_a_failure_mid_stream_ends_an_sse_stream_with_a_json_error_event(client, monkeypatch):
    """After the first byte there is no status to change: the stream's last event says what went wrong."""
    from vibevoice_onnx.serve.codec import StreamEncoder

    encode, calls = StreamEncoder.encode, []

    def failing(self, samples):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("the encoder broke")
        return encode(self, samples)

    monkeypatch.setattr(StreamEncoder, "encode", failing)
    response = client.post("/v1/audio/speech", json={"model": "tts-1", "input": TEXT, "voice": "synthetic", "seed": 1,
                                                     "max_frames": 9, "response_format": "pcm", "stream_format": "sse"})
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[0]["type"] == "speech.audio.delta"
    assert events[-1]["type"] == "error" and events[-1]["error"]["type"] == "server_error"
    request_id = response.headers["x-request-id"]  # the message names no exception: the log has it under this id
    assert events[-1]["error"]["message"].endswith(f"request id {request_id}"), events[-1]
    assert "the encoder broke" not in events[-1]["error"]["message"]


def test_an_exception_at_the_top_is_one_log_line_and_a_500_that_names_the_request(client, monkeypatch, caplog):
    """Whatever escapes a route: a 500 in OpenAI's shape that names no exception but the request id, and one
    log line with that id; the traceback only at debug level."""
    import logging

    from vibevoice_onnx.serve import speech as speech_route

    def broken(*args, **kwargs):
        raise RuntimeError("a bug\nover two lines")

    monkeypatch.setattr(speech_route, "parse_speech", broken)
    with caplog.at_level(logging.DEBUG, logger="vibevoice_onnx.serve"):
        response = client.post("/v1/audio/speech", json={"model": "tts-1", "input": TEXT})
        with client.websocket_connect("/v1/audio/speech/stream") as ws:
            ws.send_json({"model": "tts-1"})
            event = ws.receive_json()
            closed = ws.receive()
    request_id = response.headers["x-request-id"]
    assert error_of(response, 500).endswith(f"request id {request_id}") and "RuntimeError" not in response.text
    assert event["error"]["type"] == "server_error" and "request id" in event["error"]["message"]
    assert closed["type"] == "websocket.close" and closed["code"] == 1011
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2 and not any(r.exc_info for r in warnings), [r.getMessage() for r in warnings]
    assert warnings[0].getMessage() == f"POST /v1/audio/speech failed: RuntimeError: a bug over two lines [request {request_id}]"
    assert warnings[1].getMessage().startswith("WS /v1/audio/speech/stream failed: RuntimeError: a bug over two lines")
    assert [r.levelno for r in caplog.records if r.exc_info] == [logging.DEBUG, logging.DEBUG]


def test_speech_takes_a_15b_script_with_a_voice_per_speaker(client, models):
    runner = models.by_id[ids(models)[1]].runner
    script = "Speaker 1: Hello there.\nSpeaker 2: Hi!"
    audio, _ = runner.create(script, {1: "alice", 2: "alice"}, seed=3, max_frames=5)
    response = client.post("/v1/audio/speech", json={"model": ids(models)[1], "input": script, "voice": "alice,alice",
                                                     "seed": 3, "max_frames": 5, "response_format": "pcm"})
    assert response.content == pcm16(audio)
    message = error_of(client.post("/v1/audio/speech", json={"model": ids(models)[1], "input": script,
                                                             "voice": "alice"}), 400, "voice")
    assert "2 speakers" in message


def test_realtime_dialogue_through_the_server(client, models):
    runner = models.by_id[ids(models)[0]].runner
    script = "Speaker 1: Hello there.\nSpeaker 2: Hi!"
    dialogue = runner.dialogue(script, {1: "synthetic", 2: "synthetic"}, seed=8, max_frames=4, turn_gap=0.1)
    expected = np.concatenate([c.samples for c in dialogue])
    response = client.post("/v1/audio/speech", json={"model": "tts-1", "input": script, "voice": "synthetic,alloy",
                                                     "seed": 8, "max_frames": 4, "turn_gap": 0.1,
                                                     "response_format": "pcm"})
    assert response.content == pcm16(expected)


BAD_SPEECH = [  # (body change, status, param, words in the message)
    ({"model": None}, 400, "model", "required"),
    ({"model": "no-such-model"}, 404, "model", "no speech model"),
    ({"model": "whisper-1"}, 404, "model", "no speech model"),
    ({"input": None}, 400, "input", "required"),
    ({"input": "   "}, 400, "input", "empty"),
    ({"input": "x" * 5000}, 400, "input", "limit of 4096"),
    ({"input": 42}, 422, "input", "must be a string"),
    ({"voice": "nobody"}, 400, "voice", "no voice 'nobody'"),
    ({"voice": "../../etc/passwd"}, 400, "voice", "no voice"),
    ({"voice": ["synthetic"]}, 422, "voice", "string or an object"),
    ({"voice": "synthetic,synthetic"}, 400, "voice", "no 'Speaker N:' lines"),
    ({"response_format": "ogg"}, 400, "response_format", "one of mp3"),
    ({"stream_format": "chunks"}, 400, "stream_format", "audio, sse"),
    ({"speed": 2.0}, 400, "speed", "not supported"),
    ({"speed": 9}, 400, "speed", "0.25 to 4.0"),
    ({"speed": "fast"}, 422, "speed", "must be a number"),
    ({"instructions": "y" * 5000}, 400, "instructions", "limit of 4096"),
    ({"seed": -1}, 400, "seed", "seed must be"),
    ({"seed": "seven"}, 422, "seed", "must be a number"),
    ({"steps": 0}, 400, "steps", "steps must be"),
    ({"cfg_scale": 1e9}, 400, "cfg_scale", "cfg_scale must be"),
    ({"max_frames": 2.5}, 400, "max_frames", "whole number"),
    ({"max_frames": True}, 422, "max_frames", "must be a number"),
]


@pytest.mark.parametrize("change,status,param,words", BAD_SPEECH)
def test_bad_speech_fields_are_refused_before_any_audio(client, change, status, param, words):
    body = {"model": "tts-1", "input": TEXT, "voice": "synthetic", **change}
    assert words in error_of(client.post("/v1/audio/speech", json={k: v for k, v in body.items() if v is not None}),
                             status, param)


@pytest.mark.parametrize("raw,status,words", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b"\xff\xfe\x00", 400, "not valid JSON"),
    (b'{"model": "tts-1", "input": "' + b"a" * 200_000 + b'"}', 413, "larger than"),
])
def test_garbage_bodies_get_a_sentence(client, raw, status, words):
    response = client.post("/v1/audio/speech", content=raw, headers={"content-type": "application/json"})
    assert words in error_of(response, status)


def test_server_survives_every_bad_request(client):
    for change, *_ in BAD_SPEECH:
        client.post("/v1/audio/speech", json={"model": "tts-1", "input": TEXT, **change})
    assert client.get("/health").json()["status"] == "ok"
    assert client.post("/v1/audio/speech", json={"model": "tts-1", "input": TEXT, "max_frames": 2,
                                                 "response_format": "wav"}).status_code == 200


# ---- transcriptions ----

def transcribe(client, data=None, files=None, **fields):
    files = files if files is not None else {"file": ("speech.wav", wav_bytes(speech_like()), "audio/wav")}
    return client.post("/v1/audio/transcriptions", data={"model": "whisper-1", "max_new_tokens": "6",
                                                         "mean_latents": "true", **fields, **(data or {})}, files=files)


@pytest.mark.parametrize("fmt", ["srt", "vtt", "text", "json", "verbose_json"])
def test_transcription_formats_match_the_runtime(client, models, fmt):
    from vibevoice_onnx.transcription import render

    runner = models.by_id[ids(models)[2]].runner
    expected = runner.transcribe(speech_like(), sample_rate=24000, max_new_tokens=6, mean_latents=True)
    response = transcribe(client, response_format=fmt)
    assert response.status_code == 200, response.text
    if fmt in ("srt", "vtt"):
        assert response.text == render(fmt, expected.segments, expected.text, expected.raw)
    elif fmt == "text":
        assert response.text == expected.text.strip() + "\n"
    else:
        body = response.json()
        assert body["text"] == expected.text.strip() and "not a JSON transcript" in body["warning"]
        if fmt == "verbose_json":
            assert body["raw_text"] == render("raw", [], expected.text, expected.raw)
            assert body["segments"] == [] and body["duration"] == 1.5 and body["language"] == "unknown"


def test_transcription_stream_is_sse_ending_in_done(client, models):
    runner = models.by_id[ids(models)[2]].runner
    expected = runner.transcribe(speech_like(), sample_rate=24000, max_new_tokens=6, mean_latents=True)
    response = transcribe(client, stream="true")
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    events = [json.loads(line) for line in lines[:-1]]
    assert events[-1]["type"] == "transcript.text.done" and events[-1]["text"] == expected.text.strip()
    assert "".join(e["delta"] for e in events if e["type"] == "transcript.text.delta") == expected.text.strip()


@pytest.mark.parametrize("encoding", ["timestamp_granularities[]", "timestamp_granularities"])
def test_word_timestamps_are_refused_with_the_reason(client, encoding):
    message = error_of(transcribe(client, data={encoding: ["segment", "word"]}, response_format="verbose_json"),
                       400, "timestamp_granularities")
    assert "per segment" in message
    assert transcribe(client, data={encoding: "segment"}).status_code == 200


def test_uploads_in_other_formats_decode(client, tmp_path):
    import av

    path = tmp_path / "speech.m4a"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=24000, layout="mono")
        samples = speech_like()
        frame = av.AudioFrame.from_ndarray(samples[None], format="flt", layout="mono")
        frame.rate = 24000
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    files = {"file": ("speech.m4a", path.read_bytes(), "audio/mp4")}
    body = transcribe(client, files=files, response_format="verbose_json").json()
    assert abs(body["duration"] - 1.5) < 0.1


def test_bad_uploads_get_a_sentence(client):
    silent = wav_bytes(np.zeros(24000, np.float32))
    cases = [
        ({"file": ("empty.wav", b"", "audio/wav")}, 400, "file"),
        ({"file": ("junk.wav", b"RIFF\x00\x01garbage" * 50, "audio/wav")}, 400, "file"),
        ({"file": ("silent.wav", silent, "audio/wav")}, 400, "file"),
        ({"file": ("big.wav", b"\x00" * (2 << 20), "audio/wav")}, 413, None),
        ({"other": ("x.wav", wav_bytes(speech_like()), "audio/wav")}, 400, "file"),
    ]
    for files, status, param in cases:
        error_of(transcribe(client, files=files), status, param)
    error_of(client.post("/v1/audio/transcriptions", json={"model": "whisper-1"}), 400)
    error_of(transcribe(client, model="tts-1"), 404, "model")
    error_of(transcribe(client, response_format="tsv"), 400, "response_format")
    error_of(transcribe(client, max_new_tokens="many"), 422, "max_new_tokens")


def test_a_truncated_multipart_body_is_a_400(client):
    body = (b"--XYZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--XYZ\r\n"
            b"Content-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF")
    response = client.post("/v1/audio/transcriptions", content=body,
                           headers={"content-type": "multipart/form-data; boundary=XYZ"})
    assert response.status_code == 400, response.text


# ---- custom voices ----

def test_posting_a_voice_adds_it_to_the_15b_model(client, models, tmp_path):
    sample = write_voice_sample(tmp_path / "bob.flac").read_bytes()
    response = client.post("/v1/audio/voices", data={"name": "bob", "consent": "yes"},
                           files={"audio_sample": ("bob.flac", sample, "audio/flac")})
    assert response.status_code == 200, response.text
    assert response.json()["id"] == "bob" and abs(response.json()["seconds"] - 2.5) < 0.01
    assert "bob" in models.by_id[ids(models)[1]].voices()
    error_of(client.post("/v1/audio/voices", data={"name": "bob"}, files={"audio_sample": ("b.flac", sample)}), 400, "name")
    error_of(client.post("/v1/audio/voices", data={"name": "x", "model": "tts-1"},
                         files={"audio_sample": ("b.flac", sample)}), 400, "model")
    error_of(client.post("/v1/audio/voices", data={"name": "bad/name"}, files={"audio_sample": ("b.flac", sample)}),
             400, "name")


# ---- the transcript as it becomes known ----

def test_segment_stream_sends_each_segment_once_and_adds_up_to_the_text():
    from vibevoice_onnx.serve.transcriptions import SegmentStream, transcript_text
    from vibevoice_onnx.transcription import parse_transcript

    output = ('[{"Start time": 0.0, "End time": 1.5, "Speaker ID": 0, "Content": "Hello there."}, '
              '{"Start time": 1.5, "End time": 3.0, "Speaker ID": 1, "Content": "Hi, how are you?"}]')
    stream, deltas, segments = SegmentStream(), [], []
    for end in range(1, len(output), 7):  # token-sized pieces
        delta, new = stream.update(output[:end])
        deltas.append(delta)
        segments += new
    delta, new = stream.update(output, final=True)
    deltas.append(delta)
    segments += new
    parsed, _ = parse_transcript(output)
    assert [index for index, _ in segments] == [0, 1] and [s for _, s in segments] == parsed
    assert "".join(deltas) == transcript_text(parsed, output) == "Hello there. Hi, how are you?"
    assert deltas.index("Hello there.") < len(deltas) - 1  # the first segment came before the end


def test_a_parsed_transcript_gets_openai_shapes(models):
    from vibevoice_onnx.runtime.asr import Transcript
    from vibevoice_onnx.serve.transcriptions import TranscriptionCall, respond
    from vibevoice_onnx.transcription import parse_transcript

    output = '[{"Start": 0.5, "End": 2.25, "Speaker": 0, "Content": "Good morning."}]'
    segments, note = parse_transcript(output)
    transcript = Transcript(segments, output, output + "<|im_end|>", [], note, 3.0)
    request = TranscriptionCall(models.by_id[ids(models)[2]], "verbose_json", None, "en", False, {})
    body = respond(transcript, request)
    assert body["text"] == "Good morning." and body["language"] == "en" and "warning" not in body
    assert body["segments"] == [{"id": 0, "seek": 0, "start": 0.5, "end": 2.25, "text": "Good morning.", "tokens": [],
                                 "temperature": 0.0, "speaker": 0}]
    assert respond(transcript, request, "srt") == "1\n00:00:00,500 --> 00:00:02,250\nSpeaker 0: Good morning.\n"
    assert respond(transcript, request, "text") == "Good morning.\n"


@pytest.mark.parametrize("field,value,flag", [("max_active", 0, "--max-active"), ("max_queue", -1, "--max-queue"),
                                              ("max_upload_mb", 0, "--max-upload-mb"), ("body_timeout", 0, "--body-timeout")])
def test_limits_that_would_stall_the_server_are_refused(field, value, flag):
    from vibevoice_onnx.errors import VibeVoiceError

    with pytest.raises(VibeVoiceError, match=f"{flag} must be at least"):
        Settings(**{field: value})


def test_a_job_runs_at_most_pump_ahead_items_ahead_of_its_reader_and_stops_with_it():
    """A client that stops reading holds its generation: the job's emits wait for the reader (the server never
    gathers the rest of a stream in memory), and once the reader stops, the waiting job ends."""
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from vibevoice_onnx.serve.http import PUMP_AHEAD, Pump

    taken, ahead, ended = [0], [], threading.Event()

    def job(emit):
        try:
            for index in range(10 * PUMP_AHEAD):
                emit(index)
                ahead.append(index + 1 - taken[0])  # emitted and not yet taken, as the job sees it
        finally:
            ended.set()

    async def read_one_then_wait():
        with ThreadPoolExecutor(1) as workers:
            pump = Pump(job, workers)
            async for _ in pump:
                taken[0] += 1
                break
            # a reader that reads nothing more: the job must come to wait, not run to its end
            await asyncio.get_running_loop().run_in_executor(None, lambda: eventually(
                lambda: len(ahead) >= PUMP_AHEAD + 1, 30))
            await asyncio.sleep(0.5)  # room for a job that would not wait to run on (it takes microseconds)
            waiting = len(ahead)
            pump.stop()
            await asyncio.get_running_loop().run_in_executor(None, lambda: ended.wait(30))
            return waiting

    emitted = asyncio.run(read_one_then_wait())
    assert emitted == PUMP_AHEAD + 1  # the one taken and PUMP_AHEAD waiting
    assert max(ahead) <= PUMP_AHEAD + 1
    assert ended.is_set()  # the stopped job ended at its waiting emit


def _raised(awaitable_or_call):
    """The ApiError a call raises (a coroutine is run to its end); its text is its message."""
    import asyncio
    import inspect

    from vibevoice_onnx.serve.http import ApiError

    with pytest.raises(ApiError) as refused:
        if inspect.iscoroutine(awaitable_or_call):
            asyncio.run(awaitable_or_call)
        else:
            awaitable_or_call()
    assert str(refused.value) == refused.value.message
    return refused.value


def _refusal(call) -> tuple:
    """(status, param, code, message) of the ApiError a call raises."""
    error = _raised(call)
    return error.status, error.param, error.code, error.message


@pytest.mark.parametrize("value, kind, status, words", [
    ("abc", int, 422, "'f' must be a whole number, got a string"),
    ("3.5", int, 422, "'f' must be a whole number, got a string"),
    (True, int, 422, "'f' must be a whole number, got a boolean"),
    (2.5, int, 422, "'f' must be a whole number, got a number"),
    ({"a": 1}, int, 422, "'f' must be a whole number, got an object"),
    (True, float, 422, "'f' must be a number, got a boolean"),
    ("ten", float, 422, "'f' must be a number, got a string"),
    (["x"], str, 422, "'f' must be a string, got an array"),
    (3, str, 422, "'f' must be a string, got a number"),
    (b"x", str, 422, "'f' must be a string, got bytes"),
    ("yes", bool, 422, "'f' must be true or false, got a string"),
    (1, bool, 422, "'f' must be true or false, got a number"),
    ("x", dict, 422, "'f' must be an object, got a string"),
    ("3", dict, 422, "'f' must be an object, got a string"),  # a form's number is no object
], ids=lambda v: repr(v)[:12])
def test_a_field_of_the_wrong_type_is_a_422_naming_the_field_and_what_came(value, kind, status, words):
    from vibevoice_onnx.serve.fields import take

    assert _refusal(lambda: take({"f": value}, "f", kind)) == (status, "f", "invalid_type", words)


def test_fields_are_taken_as_json_or_a_forms_text_sends_them():
    """JSON's own types as they are (an int is a float where a number is due), a form's text parsed (true/false
    in any case, numbers), absent, null or a form's empty value: the default; a string may be empty."""
    from vibevoice_onnx.serve.fields import take

    assert take({"f": 3}, "f", int) == 3 and take({"f": "3"}, "f", int) == 3
    assert take({"f": 2}, "f", float) == 2.0 and isinstance(take({"f": 2}, "f", float), float)
    assert take({"f": "2.5"}, "f", float) == 2.5 and take({"f": 2.5}, "f", float) == 2.5
    assert take({"f": "TRUE"}, "f", bool) is True and take({"f": "false"}, "f", bool) is False
    assert take({"f": False}, "f", bool) is False and take({"f": {"a": 1}}, "f", dict) == {"a": 1}
    for body in ({}, {"f": None}, {"f": ""}):
        assert take(body, "f", int, default=7) == 7
    assert take({"f": ""}, "f", str, default="x") == "" and take({}, "f", str, default="x") == "x"


def test_a_missing_choice_or_length_refusal_names_the_field_with_its_code():
    from vibevoice_onnx.serve.fields import take

    assert _refusal(lambda: take({}, "input", str, required=True)) == \
        (400, "input", "missing_field", "'input' is required")
    assert _refusal(lambda: take({"input": None}, "input", str, required=True))[3] == "'input' is required"
    assert _refusal(lambda: take({"format": "mp4"}, "format", str, choices=("wav", "pcm"))) == \
        (400, "format", "invalid_value", "'format' must be one of wav, pcm, got 'mp4'")
    assert _refusal(lambda: take({"input": "abcd"}, "input", str, max_length=3)) == \
        (400, "input", "too_long", "'input' is 4 characters long, over the limit of 3")
    assert take({"input": "abc"}, "input", str, max_length=3) == "abc"  # at the limit
    assert take({"format": "pcm"}, "format", str, choices=("wav", "pcm"), required=True) == "pcm"


def test_an_option_is_the_runtimes_own_range_from_json_or_a_form():
    from vibevoice_onnx.options import LIMITS
    from vibevoice_onnx.serve.fields import option

    assert option({"seed": "3"}, "seed") == 3 and option({"cfg_scale": 2}, "cfg_scale") == 2.0
    assert option({}, "steps", default=5) == 5 and option({"steps": None}, "steps") is None
    assert _refusal(lambda: option({"cfg_scale": 99}, "cfg_scale")) == \
        (400, "cfg_scale", "invalid_value", f"cfg_scale must be {LIMITS['cfg_scale'].describe()}, got 99.0")
    assert _refusal(lambda: option({"seed": "x"}, "seed"))[:3] == (422, "seed", "invalid_type")


# serve/http.py's pieces on their own: the JSON door, admission, bounded bodies, timeouts and websocket messages.

def _api_error(awaitable_or_call) -> tuple:
    """(status, code, message, headers) of the ApiError a call raises (a coroutine is run to its end)."""
    error = _raised(awaitable_or_call)
    return error.status, error.code, error.message, error.headers


def test_json_from_a_client_is_parsed_or_refused_in_one_sentence():
    from vibevoice_onnx.serve.http import MAX_JSON_DEPTH, parse_json

    assert parse_json(b'{"a": [1, {"b": "\\u00e9"}]}', "the body") == {"a": [1, {"b": "\u00e9"}]}
    nested = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert parse_json(nested, "the body") is not None  # at the limit: parsed
    assert _api_error(lambda: parse_json("[" + nested + "]", "the message")) == \
        (400, "invalid_json", f"the message nests JSON more than {MAX_JSON_DEPTH} levels deep", None)
    assert parse_json('{"a": "' + "[" * 100 + '"}', "the body") == {"a": "[" * 100}  # brackets in a string
    assert _api_error(lambda: parse_json('{"t": "\\ud800"}', "the body")) == \
        (400, "invalid_json", "the body holds an unpaired surrogate escape (such as \\ud800), which is not text", None)
    for raw, why in ((b"\xff{}", "'utf-8' codec can't decode byte 0xff"), ("{", "Expecting property name"),
                     ("1" * 5000, "Exceeds the limit")):
        status, code, message, _ = _api_error(lambda: parse_json(raw, "the body"))
        assert (status, code) == (400, "invalid_json") and message.startswith(f"the body is not valid JSON ({why}")


@pytest.mark.parametrize("text, depth", [("", 0), ("1", 0), ("[]", 1), ("[[], []]", 2), ('{"a": [1, {"b": 2}]}', 3),
                                         ('"[[["', 0), ('[{"x": "]]] [[["}]', 2), ('["\\"[["]', 1), ('[[], [[]]]', 3),
                                         ("[" * 100, 33)])
def test_json_depth_counts_brackets_outside_strings_and_stops_past_the_limit(text, depth):
    from vibevoice_onnx.serve.http import json_depth

    assert json_depth(text) == depth


def test_admission_lets_active_run_queues_the_next_and_answers_the_rest_429_with_retry_after():
    import asyncio

    from vibevoice_onnx.serve.http import Admission

    async def scenario():
        door = Admission(active=1, queue=1)
        await door.enter()  # runs
        queued = asyncio.create_task(door.enter())
        await asyncio.sleep(0)  # let it start waiting (an event-loop turn, not a clock)
        assert door.waiting == 1 and not queued.done()
        refused = None
        try:
            await door.enter()
        except Exception as e:  # noqa: BLE001 - examined below
            refused = e
        door.leave()
        await asyncio.wait_for(queued, 30)  # the queued one runs once a slot is free
        assert door.waiting == 0
        deep = Admission(active=1, queue=2)
        await deep.enter()
        two = [asyncio.create_task(deep.enter()) for _ in range(2)]
        await asyncio.sleep(0)
        assert deep.waiting == 2
        try:
            await deep.enter()
        except Exception as e:  # noqa: BLE001 - examined below
            assert e.message == "the server is busy (1 generations running, 2 waiting); retry shortly"
        else:
            raise AssertionError("a third waiting request was queued past the queue of 2")
        for _ in two:
            deep.leave()
        await asyncio.wait_for(asyncio.gather(*two), 30)
        assert deep.waiting == 0
        busy = Admission(active=2, queue=0)
        await busy.enter()
        await busy.enter()
        return refused, busy

    refused, busy = asyncio.run(scenario())
    assert (refused.status, refused.code, refused.message, refused.headers) == \
        (429, "server_busy", "the server is busy (1 generations running, 1 waiting); retry shortly", {"Retry-After": "1"})
    assert refused.response().headers["retry-after"] == "1" and refused.body()["error"]["type"] == "rate_limit_error"
    assert _api_error(busy.enter())[2] == "the server is busy (2 generations running, 0 waiting); retry shortly"


def test_an_error_body_is_openais_and_an_event_is_one_sse_line_in_utf8():
    from vibevoice_onnx.serve.http import ApiError, sse_event

    assert ApiError(418, "odd", param="p", code="c").body() == \
        {"error": {"message": "odd", "type": "invalid_request_error", "param": "p", "code": "c"}}
    assert ApiError(503, "down").body()["error"]["type"] == "server_error"
    assert sse_event("speech.audio.delta", audio="\u00e9", n=1) == \
        'data: {"type": "speech.audio.delta", "audio": "\u00e9", "n": 1}\n\n'.encode()


def test_a_stream_past_its_limit_is_refused_with_a_413_or_the_refusal_given():
    import asyncio

    from vibevoice_onnx.serve.http import ApiError, bounded

    async def chunks(*sizes):
        for size in sizes:
            yield b"x" * size

    async def taken(stream):
        return [chunk async for chunk in stream]

    assert asyncio.run(taken(bounded(chunks(2**19, 2**19), 2**20))) == [b"x" * 2**19] * 2  # at the limit
    assert _api_error(taken(bounded(chunks(2**19, 2**19, 1), 2**20)))[:3] == \
        (413, "too_large", "the request is larger than the limit of 1 MB")
    own = ApiError(413, "the upload is too big")
    assert _api_error(taken(bounded(chunks(3), 2, own)))[2] == "the upload is too big"


def test_a_wait_with_a_timeout_is_a_408_naming_what_did_not_arrive():
    import asyncio

    from vibevoice_onnx.serve.http import with_timeout

    async def never():
        await asyncio.Event().wait()

    async def soon():
        return 5

    assert asyncio.run(with_timeout(soon(), None)) == 5 and asyncio.run(with_timeout(soon(), 30)) == 5
    assert _api_error(with_timeout(never(), 0.01))[:3] == (408, None, "the request body did not arrive within 0.01 s")
    assert _api_error(with_timeout(never(), 0.5, "a message"))[2] == "a message did not arrive within 0.5 s"


def _receiver(*messages):
    """An ASGI `receive`: these messages in order, then nothing more, ever (a client that stalls)."""
    import asyncio

    queue = list(messages)

    async def receive():
        return queue.pop(0) if queue else await asyncio.Event().wait()

    return receive


def _socket(*messages):
    """A websocket whose receive gives these ASGI messages (starlette's WebSocket.receive gives these dicts)."""
    from types import SimpleNamespace

    return SimpleNamespace(receive=_receiver(*messages))


def test_a_websocket_message_is_json_an_allowed_word_or_allowed_bytes_and_anything_else_an_error():
    import asyncio

    from starlette.websockets import WebSocketDisconnect

    from vibevoice_onnx.serve.http import receive_message

    def text(value):
        return {"type": "websocket.receive", "text": value}

    def received(message, **options):
        return asyncio.run(receive_message(_socket(message), 30, **options))

    assert received(text('{"type": "x"}')) == {"type": "x"}
    assert received(text(' "done" '), words=("done",)) == "done" and received(text("done"), words=("done",)) == "done"
    assert _api_error(receive_message(_socket(text("Xdone")), 30, words=("done",)))[2] \
        .startswith("the message is not valid JSON (")  # only quotes and spaces around a word are forgiven
    assert received({"type": "websocket.receive", "bytes": b"\x00\x01"}, binary=True) == b"\x00\x01"
    assert _api_error(receive_message(_socket({"type": "websocket.receive", "bytes": b"\x00"}), 30))[:3] == \
        (400, "invalid_message", "this socket takes JSON text messages, and a binary message came")
    assert _api_error(receive_message(_socket(text("[1]")), 30))[:3] == \
        (400, "invalid_message", "a message must be a JSON object, not list")
    assert _api_error(receive_message(_socket(text("done")), 30))[2].startswith("the message is not valid JSON (")
    for message, code, reason in (({"type": "websocket.disconnect", "code": 1001, "reason": "bye"}, 1001, "bye"),
                                  ({"type": "websocket.disconnect"}, 1000, None)):
        with pytest.raises(WebSocketDisconnect) as left:
            received(message)
        assert (left.value.code, left.value.reason) == (code, reason or "")

    assert _api_error(receive_message(_socket(), 0.01))[:3] == (408, None, "a message did not arrive within 0.01 s")


def _request(*messages):
    """A starlette Request whose body arrives as these ASGI messages, then stalls."""
    from starlette.requests import Request

    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, _receiver(*messages))


def test_a_body_is_read_whole_bounded_and_timed_and_a_client_that_leaves_is_gone():
    import asyncio

    from vibevoice_onnx.serve.http import ClientGone, read_body, read_json

    part = {"type": "http.request", "body": b'{"a": ', "more_body": True}
    end = {"type": "http.request", "body": b"1}", "more_body": False}
    assert asyncio.run(read_json(_request(part, end), 100, 30)) == {"a": 1}
    assert asyncio.run(read_body(_request(part, end), 8, 30)) == b'{"a": 1}'  # at the limit
    assert _api_error(read_body(_request(part, end), 7, 30))[0] == 413
    assert _api_error(read_json(_request(part), 100, 0.01))[:3] == \
        (408, None, "the request body did not arrive within 0.01 s")
    assert _api_error(read_json(_request({"type": "http.request", "body": b"{", "more_body": False}), 100, 30))[2] \
        .startswith("the body is not valid JSON (")
    with pytest.raises(ClientGone):
        asyncio.run(read_body(_request(part, {"type": "http.disconnect"}), 100, 30))


def _watched(*messages, headers=()):
    """A RequestBody over these ASGI messages, then a client that sends nothing more."""
    from vibevoice_onnx.serve.http import RequestBody

    return RequestBody(_receiver(*messages), list(headers))


def _part(size: int, more: bool = True) -> dict:
    return {"type": "http.request", "body": b"x" * size, "more_body": more}


def test_a_watched_body_counts_what_came_and_knows_when_it_ended():
    import asyncio

    async def read(body, times):
        for _ in range(times):
            await body.receive()
        return body.started, body.received, body.ended

    fresh = _watched()
    assert (fresh.started, fresh.received, fresh.ended) == (False, 0, False)
    body = _watched(_part(3), _part(2, more=False))
    assert asyncio.run(read(body, 1)) == (True, 3, False)
    assert asyncio.run(read(body, 1)) == (True, 5, True)
    assert asyncio.run(read(_watched(_part(3), {"type": "http.disconnect"}), 2)) == (True, 3, True)
    assert asyncio.run(read(_watched({"type": "http.request"}), 1)) == (True, 0, True)  # no more_body: the end


def test_settling_reads_the_rest_of_a_body_within_its_bounds_or_says_to_close(monkeypatch):
    """An answer given before the body was read: the rest is read and dropped (True: the connection may stay)
    unless the body is over (True at once), the answer is a 408, the client waits for 100 Continue, its declared
    length or what it sends passes the bound, or it stops sending (False: the answer closes)."""
    import asyncio

    from vibevoice_onnx.serve import http

    def settled(body, status=400):
        return asyncio.run(body.settle(status))

    ended = _watched(_part(2, more=False))
    asyncio.run(ended.receive())
    assert settled(ended) is True
    rest = _watched(_part(5), _part(5), _part(1, more=False), headers=[(b"content-length", b"11")])
    assert settled(rest) is True and rest.received == 11
    assert settled(_watched(_part(5, more=False)), 408) is False
    assert settled(_watched(_part(5, more=False), headers=[(b"expect", b"100-Continue")])) is False
    sent = _watched(_part(1), _part(1, more=False), headers=[(b"expect", b"100-continue")])
    asyncio.run(sent.receive())  # it began sending: it wants the answer after its body
    assert settled(sent) is True
    big = str(http.LINGER_BYTES + 1).encode()
    assert settled(_watched(_part(1, more=False), headers=[(b"content-length", big)])) is False
    begun = _watched(_part(1), _part(1, more=False), headers=[(b"content-length", big)])
    asyncio.run(begun.receive())  # one byte in: LINGER_BYTES left, at the bound
    assert settled(begun) is True
    monkeypatch.setattr(http, "LINGER_IDLE_SECONDS", 0.01)
    assert settled(_watched(_part(1))) is False  # then silence
    monkeypatch.setattr(http, "LINGER_BYTES", 4)
    assert settled(_watched(_part(2), _part(2), _part(0, more=False))) is True  # four bytes: at the bound
    assert settled(_watched(_part(2), _part(3), _part(0, more=False))) is False


def test_a_request_layer_error_keeps_its_code_and_names_the_field_as_the_body_does():
    from vibevoice_onnx.requests import RequestError
    from vibevoice_onnx.serve.fields import api_error

    error = api_error(RequestError("text", "{field} has nothing to speak", code="empty_input"))
    assert (error.status, error.param, error.code, error.message) == (400, "input", "empty_input",
                                                                      "input has nothing to speak")
    error = api_error(RequestError("speakers", "add {entry}", speaker=3, code="voice_not_found"))
    assert (error.param, error.code, error.message) == \
        ("voice", "voice_not_found", "add a voice for Speaker 3 to 'voice' (comma-separated, in speaker order)")


def test_a_job_that_fails_hands_its_own_exception_to_the_reader():
    """It ran on the executor it was given (the server's generation threads, which bound how many run at once)."""
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from vibevoice_onnx.serve.http import Pump

    def job(emit):
        emit(threading.current_thread().name)
        raise ValueError("boom")

    async def read():
        got = []
        with ThreadPoolExecutor(1, thread_name_prefix="generation") as workers:  # the server's threads
            try:
                async for item in Pump(job, workers):
                    got.append(item)
            except ValueError as e:
                return got, str(e)
        return got, None

    (ran_on,), error = asyncio.run(read())
    assert ran_on.startswith("generation") and error == "boom"


def test_once_the_server_is_stopping_a_job_emits_past_the_bound_and_loses_nothing():
    """Shutdown: a job whose reader is slow no longer waits for room; every item it emits still arrives."""
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from vibevoice_onnx.serve.http import PUMP_AHEAD, Pump

    stopping, ended = threading.Event(), threading.Event()
    stopping.set()

    def job(emit):
        for index in range(3 * PUMP_AHEAD):
            emit(index)
        ended.set()
        return "done"

    async def read():
        with ThreadPoolExecutor(1) as workers:
            pump = Pump(job, workers, stopping=stopping)
            assert await asyncio.get_running_loop().run_in_executor(None, ended.wait, 30)  # ran to its end unread
            items = [item async for item in pump]
            return items, pump.result

    assert asyncio.run(read()) == (list(range(3 * PUMP_AHEAD)), "done")


def test_a_model_not_served_is_a_404_naming_the_field(models):
    from vibevoice_onnx.serve.fields import served_model

    status, param, code, message = _refusal(lambda: served_model(models, "no-such-model", "speech"))
    assert (status, param, code) == (404, "model", "model_not_found") and "no-such-model" in message


def test_a_client_that_trickles_its_body_is_closed_at_the_deadline(monkeypatch):
    """A byte at a time, each well within the idle limit, for (here) some 3,000 bytes: settling gives up at
    LINGER_SECONDS in all (the answer then closes the connection) instead of reading it to its end."""
    import asyncio

    from vibevoice_onnx.serve import http

    monkeypatch.setattr(http, "LINGER_SECONDS", 0.05)
    monkeypatch.setattr(http, "LINGER_IDLE_SECONDS", 30.0)
    sent = [0]

    async def trickle():
        await asyncio.sleep(0.001)
        sent[0] += 1
        return _part(1, more=sent[0] < 3000)

    assert asyncio.run(http.RequestBody(trickle, []).settle(400)) is False and sent[0] < 3000


def _transcription_form(models, *pairs, model: str | None = "whisper-1"):
    """parse_transcription of a multipart form as starlette hands it: the model (None: none), then `pairs`
    (repeats allowed)."""
    from starlette.datastructures import FormData

    from vibevoice_onnx.serve.transcriptions import parse_transcription

    return parse_transcription(FormData([*([("model", model)] if model else []), *pairs]), models)


def test_a_transcription_form_is_taken_with_openais_defaults_and_the_runtimes_options(models):
    """A bare form: json, no prompt or language, not streamed, the runtime's token cap, noise sampled, the guard on.
    Every field given reaches the call by its own name (a form sends text, parsed as the field's type)."""
    from vibevoice_onnx.runtime.asr import MAX_NEW_TOKENS

    bare = _transcription_form(models)
    assert bare.model.kind == "asr"
    assert (bare.response_format, bare.prompt, bare.language, bare.stream) == ("json", None, None, False)
    assert bare.options == {"seed": None, "mean_latents": False, "repetition_guard": True,
                            "max_new_tokens": MAX_NEW_TOKENS}
    given = _transcription_form(models, ("response_format", "srt"), ("prompt", "Ada, Lovelace"), ("language", "en"),
                                ("stream", "true"), ("seed", "11"), ("max_new_tokens", "40"),
                                ("mean_latents", "true"), ("repetition_guard", "false"), ("temperature", "1"),
                                ("timestamp_granularities[]", "segment"), ("include[]", "logprobs"))
    assert (given.response_format, given.prompt, given.language, given.stream) == ("srt", "Ada, Lovelace", "en", True)
    assert given.options == {"seed": 11, "mean_latents": True, "repetition_guard": False, "max_new_tokens": 40}


@pytest.mark.parametrize("pairs, refusal", [
    ([("prompt", ("a.txt", b"x"))], (422, "prompt", "invalid_type", "'prompt' must be a text field, not a file")),
    ([("response_format", "tsv")], (400, "response_format", "invalid_value", None)),
    ([("timestamp_granularities[]", "word")],
     (400, "timestamp_granularities", "unsupported_value", "word timestamps are not available: VibeVoice-ASR writes "
      "timestamps per segment only; ask for 'segment'")),
    ([("timestamp_granularities", "segment,sentence")],  # LiteLLM's bare key, a comma list
     (400, "timestamp_granularities", "invalid_value", "timestamp_granularities must be 'segment', got 'sentence'")),
    ([("temperature", "1.5")], (400, "temperature", "invalid_value",
                                "'temperature' must be from 0 to 1, got 1.5 (decoding is greedy whatever it is)")),
    ([("temperature", "-0.1")], (400, "temperature", "invalid_value", None)),
    ([("seed", "-1")], (400, "seed", "invalid_value", None)),
    ([("max_new_tokens", "0")], (400, "max_new_tokens", "invalid_value", None)),
    ([("mean_latents", "maybe")], (422, "mean_latents", "invalid_type", None)),
    ([("repetition_guard", "2")], (422, "repetition_guard", "invalid_type", None)),
    ([("language", ("a.txt", b"x"))], (422, "language", "invalid_type", None)),
    ([("stream", "often")], (422, "stream", "invalid_type", None)),
], ids=lambda v: str(v)[:30])
def test_each_refused_transcription_field_is_named_with_its_status_and_code(models, pairs, refusal):
    from starlette.datastructures import UploadFile

    pairs = [(key, UploadFile(io.BytesIO(value[1]), filename=value[0]) if isinstance(value, tuple) else value)
             for key, value in pairs]
    status, param, code, message = _refusal(lambda: _transcription_form(models, *pairs))
    assert (status, param, code) == refusal[:3] and message == (refusal[3] or message)


def test_a_form_without_a_model_is_refused_naming_it(models):
    assert _refusal(lambda: _transcription_form(models, ("language", "en"), model=None))[:2] == (400, "model")


def test_temperature_from_0_to_1_is_taken_and_changes_nothing(models):
    bare = _transcription_form(models)
    for value in ("0", "0.5", "1"):
        taken = _transcription_form(models, ("temperature", value))
        assert (taken.options, taken.response_format, taken.prompt) == (bare.options, bare.response_format, bare.prompt)


@pytest.mark.parametrize("content, code, words", [
    (b"", "invalid_file", "the uploaded file is not audio this server can decode ("),
    (b"RIFF\x00\x01garbage" * 50, "invalid_file", "the uploaded file is not audio this server can decode ("),
    ("silent", "silent_file", "the uploaded audio is silent, so there is nothing to transcribe"),
    ("nan", "invalid_file", "the uploaded file holds NaN or infinite samples"),
    ("inf", "invalid_file", "the uploaded file holds NaN or infinite samples"),
    ("empty", "empty_file", "the uploaded file holds no audio (zero samples)"),
])
def test_an_upload_that_holds_nothing_to_transcribe_is_a_400_saying_why(tmp_path, content, code, words):
    import soundfile as sf

    from vibevoice_onnx.serve.transcriptions import load_upload

    path = tmp_path / "upload.wav"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        samples = {"silent": np.zeros(2400), "empty": np.zeros(0), "nan": np.full(2400, np.nan),
                   "inf": np.r_[np.zeros(100), np.inf]}[content]
        sf.write(str(path), samples.astype(np.float32), 24000, subtype="FLOAT")
    status, param, got_code, message = _refusal(lambda: load_upload(str(path)))
    assert (status, param, got_code) == (400, "file", code) and message.startswith(words)


def test_an_upload_of_speech_is_its_samples_at_its_rate(tmp_path):
    import soundfile as sf

    from vibevoice_onnx.serve.transcriptions import load_upload

    samples = speech_like()[:4000]
    sf.write(str(tmp_path / "a.wav"), samples, 16000, subtype="FLOAT")
    got, rate = load_upload(str(tmp_path / "a.wav"))
    assert rate == 16000 and np.array_equal(got, samples)


@pytest.mark.parametrize("body, text_required, refusal", [
    ([1], True, (400, None, "invalid_json", "the body must be a JSON object")),
    ({"voice": {"name": "synthetic"}}, True, (422, "voice", "invalid_type", "'voice' as an object must have a string 'id'")),
    ({"voice": {"id": 3}}, True, (422, "voice", "invalid_type", "'voice' as an object must have a string 'id'")),
    ({"voice": 3}, True, (422, "voice", "invalid_type", "'voice' must be a string or an object with an 'id', got int")),
    ({"voice": "synthetic,alloy"}, False, (400, "voice", None, "a streamed text takes one voice")),
    ({"voice": "synthetic,alloy,synthetic", "input": "Speaker 1: Hi.\nSpeaker 2: Yo."}, True,
     (400, "voice", None, "the script has 2 speakers (1, 2) but 3 voices are given: give one per speaker, in order, "
                          "comma-separated")),
], ids=lambda v: str(v)[:30])
def test_a_speech_body_is_refused_by_its_field_before_the_request_layer(models, body, text_required, refusal):
    """parse_speech's own refusals (the JSON door and the voices), each as a whole (status, param, code, sentence)."""
    from vibevoice_onnx.serve.speech import parse_speech

    full = {"model": ids(models)[0], "input": TEXT, **body} if isinstance(body, dict) else body
    assert _refusal(lambda: parse_speech(full, models, 4096, text_required=text_required)) == refusal


def test_a_speech_body_names_its_voices_as_the_request_layer_takes_them(models):
    """A voice by name, by OpenAI's alias or as {"id": ...}; one voice for a streamed text; a script with one speaker
    and one voice; no voice: the model's first. The server's --max-frames caps a request's, and is the default."""
    from vibevoice_onnx.serve.speech import parse_speech

    realtime = ids(models)[0]

    def parsed(body, max_chars=4096, **given):
        return parse_speech({"model": realtime, "input": TEXT, **body}, models, max_chars, **given).request

    assert parsed({"voice": {"id": "alloy"}}).voice == parsed({"voice": "synthetic"}).voice == "synthetic"
    assert parsed({}).voice == models.by_id[realtime].voices()[0]
    assert parsed({"voice": "alloy", "input": None}, text_required=False).voice == "synthetic"
    assert parsed({"voice": "synthetic", "input": "Speaker 1: Hello.\nSpeaker 1: Again."}).speakers == {1: "synthetic"}
    assert parsed({"max_frames": 50}, max_frames=20).max_frames == 20
    assert parsed({"max_frames": 5}, max_frames=20).max_frames == 5 and parsed({}, max_frames=20).max_frames == 20
    assert parsed({}).max_frames is None
    assert _refusal(lambda: parsed({"input": "x" * 11}, max_chars=10))[:2] == (400, "input")


def test_an_encode_job_streams_the_encoders_bytes_whole_in_sse_too_and_a_stop_still_flushes_the_tail():
    """mp3 holds bytes back until its encoder is flushed: the SSE deltas decode to the plain stream's bytes, the tail
    included, and a stopping server ends the stream at the next frame with that tail (a whole file, cut short)."""
    import base64
    import threading
    from types import SimpleNamespace

    from vibevoice_onnx.serve.codec import StreamEncoder
    from vibevoice_onnx.serve.speech import encode_job

    chunks = [SimpleNamespace(samples=(0.3 * np.sin(np.arange(3200) * 0.05 * (k + 1))).astype(np.float32))
              for k in range(4)]

    def run(sse, stop_after=None):
        stopping, emitted = threading.Event(), []

        def frames():
            for k, chunk in enumerate(chunks):
                if k == stop_after:
                    stopping.set()
                yield chunk

        speech = frames()
        assert encode_job(speech, "mp3", sse, stopping)(emitted.append) is speech
        return emitted

    plain = run(False)
    events = [json.loads(line[len(b"data: "):]) for line in run(True)]
    assert {event["type"] for event in events} == {"speech.audio.delta"}
    assert b"".join(base64.b64decode(event["audio"]) for event in events) == b"".join(plain)
    stopped = run(False, stop_after=2)
    encoder = StreamEncoder("mp3")  # two frames and the flush, nothing after
    assert b"".join(stopped) == b"".join([*(encoder.encode(chunk.samples) for chunk in chunks[:2]), encoder.finish()])
