"""A real `vibevoice-onnx serve` process on 127.0.0.1, driven by the official `openai` client (which no one
here wrote): every format against `speak` and `transcribe` for the same seed, streaming, websockets,
concurrent clients, clients that leave, overload, and SIGTERM."""

from __future__ import annotations

import base64
import io
import json
import socket
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from helpers import KEY, Server, assert_audio_streams_while_it_is_made, cli, eventually, live_streams

pytest.importorskip("fastapi")
pytest.importorskip("av")
openai = pytest.importorskip("openai")

TEXT = "A real server, a real client, and the same audio as speak gives."


@pytest.fixture(scope="module")
def server(tiny_bundle, tiny_15b_bundle, tiny_asr_bundle, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    running = Server([tiny_bundle, tiny_15b_bundle, tiny_asr_bundle], log, "--max-active", "4", "--max-queue", "4")
    yield running
    assert running.stop() == 0, log.read_text()


def spoken(bundle, seed: int, frames: int, text: str = TEXT) -> np.ndarray:
    """`speak --raw` for the same text, voice and seed: int16 samples."""
    return np.frombuffer(cli("speak", str(bundle), text, "--voice", "synthetic", "--seed", str(seed), "--max-frames",
                             str(frames), "--raw"), "<i2")


def speech(client, seed: int, frames: int, fmt: str, text: str = TEXT, **extra):
    return client.audio.speech.create(model="tts-1", voice="alloy", input=text, response_format=fmt,
                                      extra_body={"seed": seed, "max_frames": frames, **extra})


def decoded(data: bytes) -> tuple[np.ndarray, int]:
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="s16", layout="mono", rate=24000)
        chunks = [f.to_ndarray().reshape(-1) for frame in container.decode(stream) for f in resampler.resample(frame)]
        chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(chunks).astype(np.float32) / 32768, stream.codec_context.sample_rate


@pytest.mark.parametrize("fmt", ["pcm", "wav", "flac"])
def test_lossless_formats_are_speaks_samples(server, tiny_bundle, fmt):
    expected = spoken(tiny_bundle, 21, 15)
    data = speech(server.client(), 21, 15, fmt).content
    if fmt == "pcm":
        got = np.frombuffer(data, "<i2")
    else:
        import soundfile as sf

        got, rate = sf.read(io.BytesIO(data), dtype="int16")
        assert rate == 24000
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("fmt,rate", [("mp3", 24000), ("opus", 48000), ("aac", 24000)])
def test_lossy_formats_keep_the_duration_and_the_waveform(server, tiny_bundle, fmt, rate):
    expected = spoken(tiny_bundle, 22, 15).astype(np.float32) / 32768
    got, stream_rate = decoded(speech(server.client(), 22, 15, fmt).content)
    assert stream_rate == rate
    assert abs(len(got) - len(expected)) / 24000 < 0.08  # codec priming and padding
    lag = int(np.argmax(np.correlate(got[:6000], expected[:4000], "valid")))  # the encoder's delay
    aligned = got[lag:lag + len(expected)]
    n = min(len(aligned), len(expected))
    assert np.corrcoef(aligned[:n], expected[:n])[0, 1] > 0.9


def test_audio_streams_as_it_decodes_and_a_client_that_leaves_stops_it(server):
    assert_audio_streams_while_it_is_made(server.client(), TEXT, server.url, server.log)
    assert eventually(lambda: live_streams(server.url) == 0, 60), "the generation ran on after its client left"


def test_sse_through_the_client(server, tiny_bundle):
    expected = spoken(tiny_bundle, 23, 8)
    with server.client().audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=TEXT, response_format="pcm", stream_format="sse",
            extra_body={"seed": 23, "max_frames": 8}) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["output_tokens"] == 8
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert np.array_equal(np.frombuffer(pcm, "<i2"), expected)


@pytest.fixture(scope="module")
def upload(tmp_path_factory) -> Path:
    import soundfile as sf

    t = np.arange(36000) / 24000
    path = tmp_path_factory.mktemp("upload") / "speech.flac"
    sf.write(str(path), (0.3 * np.sin(2 * np.pi * 200 * t) * np.sin(2 * np.pi * 2 * t)).astype(np.float32), 24000)
    return path


ASR_OPTIONS = {"max_new_tokens": 6, "seed": 4}


@pytest.mark.parametrize("fmt", ["srt", "vtt", "text", "json", "verbose_json"])
def test_transcriptions_through_the_client_match_transcribe(server, tiny_asr_bundle, upload, fmt):
    ours = {"srt": "srt", "vtt": "vtt", "text": "json", "json": "json", "verbose_json": "raw"}[fmt]
    expected = cli("transcribe", str(tiny_asr_bundle), str(upload), "--format", ours, "--max-new-tokens", "6",
                   "--seed", "4").decode()
    with open(upload, "rb") as f:
        result = server.client().audio.transcriptions.create(model="whisper-1", file=f, response_format=fmt,
                                                             timestamp_granularities=["segment"] if fmt == "verbose_json" else openai.omit,
                                                             extra_body=ASR_OPTIONS)
    if fmt in ("srt", "vtt"):
        assert result == expected
    elif fmt == "verbose_json":
        assert result.raw_text == expected and result.duration == 1.5 and result.segments == []
    else:
        text = json.loads(expected)["text"].strip()
        assert (result if fmt == "text" else result.text).strip() == text


def test_transcription_stream_through_the_client(server, upload):
    with open(upload, "rb") as f:
        events = list(server.client().audio.transcriptions.create(model="whisper-1", file=f, stream=True,
                                                                  extra_body=ASR_OPTIONS))
    assert events[-1].type == "transcript.text.done"
    assert "".join(e.delta for e in events if e.type == "transcript.text.delta") == events[-1].text


def test_websocket_streamed_text_gives_the_whole_texts_audio(server, tiny_bundle):
    """60 frames: past the text's last window (37 tokens of the tiny tokenizer, 8 windows, 48 frames), which the
    loop runs only once `input_text.done` has ended the text: a server that ignored it would never answer."""
    from websockets.sync.client import connect

    expected = spoken(tiny_bundle, 24, 60)
    audio = b""
    with connect(f"ws://127.0.0.1:{server.port}/v1/audio/speech/stream",
                 additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=10) as ws:
        ws.send(json.dumps({"model": "tts-1", "voice": "synthetic", "response_format": "pcm", "seed": 24,
                            "max_frames": 60}))
        for piece in [TEXT[i:i + 3] for i in range(0, len(TEXT), 3)]:
            ws.send(json.dumps({"type": "input_text.delta", "delta": piece}))
        ws.send(json.dumps({"type": "input_text.done"}))
        while True:
            message = ws.recv(timeout=30)
            if isinstance(message, bytes):
                audio += message
                continue
            event = json.loads(message)
            assert event["type"] == "audio.done", event
            break
    assert event["usage"]["output_tokens"] == 60
    assert np.array_equal(np.frombuffer(audio, "<i2"), expected)


def test_websocket_errors_are_events(server):
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{server.port}/v1/audio/speech/stream",
                 additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        ws.send(json.dumps({"model": "tts-1", "voice": "nobody"}))
        event = json.loads(ws.recv(timeout=10))
    assert event["type"] == "error" and event["error"]["param"] == "voice"


def test_eight_concurrent_streams_are_neither_dropped_nor_mixed(server):
    client = server.client()
    alone = {seed: speech(client, seed, 20, "pcm").content for seed in range(30, 38)}
    together: dict[int, bytes] = {}

    def fetch(seed):
        with client.audio.speech.with_streaming_response.create(
                model="tts-1", voice="alloy", input=TEXT, response_format="pcm",
                extra_body={"seed": seed, "max_frames": 20}) as response:
            together[seed] = b"".join(response.iter_bytes())

    threads = [threading.Thread(target=fetch, args=(seed,)) for seed in alone]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert together == alone
    assert len(set(alone.values())) == 8


def concurrent_requests(server, upload) -> dict:
    """Per served model: a request whose answer depends on the seed (speech as PCM bytes, a transcript's text)."""
    client = server.client()

    def transcript(seed):
        with open(upload, "rb") as f:
            return client.audio.transcriptions.create(model="vibevoice-asr-cpu-fp32", file=f, response_format="json",
                                                      extra_body={"max_new_tokens": 12, "seed": seed}).text

    return {"vibevoice-realtime-cpu-fp32": lambda seed: speech(client, seed, 24, "pcm").content,
            "vibevoice-1.5b-cpu-fp32": lambda seed: client.audio.speech.create(
                model="vibevoice-1.5b-cpu-fp32", voice="alloy", input="Speaker 1: One of four at once.",
                response_format="pcm", extra_body={"seed": seed, "max_frames": 10}).content,
            "vibevoice-asr-cpu-fp32": transcript}


@pytest.mark.parametrize("model", ["vibevoice-realtime-cpu-fp32", "vibevoice-1.5b-cpu-fp32", "vibevoice-asr-cpu-fp32"])
def test_four_concurrent_clients_share_the_models_steps_and_each_gets_its_own_result(server, upload, model):
    ask = concurrent_requests(server, upload)[model]
    alone = {seed: ask(seed) for seed in range(40, 44)}

    def batching() -> dict:
        with urllib.request.urlopen(urllib.request.Request(f"{server.url}/v1/models/{model}",
                                                           headers={"Authorization": f"Bearer {KEY}"})) as r:
            return json.load(r)["batching"]

    before = batching()
    assert before["max_streams"] == 4 and before["streams"] == 0
    together: dict[int, bytes] = {}
    start = threading.Barrier(4)

    def fetch(seed):
        start.wait()
        together[seed] = ask(seed)

    threads = [threading.Thread(target=fetch, args=(seed,)) for seed in alone]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert together == alone  # exactly what each gets alone
    assert len(set(alone.values())) > 1  # the seed matters, so a mix-up would show
    after = batching()
    assert after["shared_steps"] > before["shared_steps"] and after["largest_batch"] >= 2  # they were batched
    assert after["streams"] == 0  # every stream left the batch


def test_request_lines_are_logged(server):
    speech(server.client(), 2, 3, "wav")
    lines = [line for line in server.log.read_text().splitlines() if "POST /v1/audio/speech" in line]
    assert any("status=200" in line and "audio=0.40s" in line for line in lines), lines[-3:]


def test_the_server_runs_without_torch(tiny_bundle, tiny_asr_bundle, upload, tmp_path):
    """`pip install 'vibevoice-onnx[serve]'` has no torch: the server, with torch and transformers impossible to
    import, speaks what `speak` speaks, transcribes, and stops cleanly."""
    from helpers import torch_blocked_environment

    running = Server([tiny_bundle, tiny_asr_bundle], tmp_path / "server.log", env=torch_blocked_environment(tmp_path))
    try:
        assert np.array_equal(np.frombuffer(speech(running.client(), 21, 5, "pcm").content, "<i2"),
                              spoken(tiny_bundle, 21, 5))
        with open(upload, "rb") as f:
            text = running.client().audio.transcriptions.create(model="whisper-1", file=f, response_format="text",
                                                                extra_body=ASR_OPTIONS)
        assert isinstance(text, str)
    finally:
        assert running.stop() == 0, (tmp_path / "server.log").read_text()
    assert "blocked import" not in (tmp_path / "server.log").read_text()


# ---- a server with one generation slot and no queue: overload, leaving clients, slow bodies, SIGTERM ----

@pytest.fixture
def small_server(tiny_bundle, tmp_path):
    running = Server([tiny_bundle], tmp_path / "small.log", "--max-active", "1", "--max-queue", "0",
                     "--body-timeout", "1")
    yield running
    running.stop()


def test_overload_is_a_429_with_retry_after_and_a_leaving_client_frees_the_slot(small_server):
    client = small_server.client()
    long = client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=TEXT, response_format="pcm", extra_body={"seed": 1, "max_frames": 100000})
    response = long.__enter__()
    next(response.iter_bytes())
    with pytest.raises(openai.RateLimitError) as busy:
        speech(client, 1, 2, "pcm")
    assert busy.value.response.headers["retry-after"] == "1" and "busy" in busy.value.message
    long.__exit__(None, None, None)  # the client leaves mid-stream
    deadline = time.monotonic() + 120  # catches a slot never freed; a loaded machine frees it in well under a second
    while True:  # the generation stops at its next frame, and the slot is free again
        try:
            assert len(speech(client, 1, 2, "pcm").content) == 2 * 3200 * 2
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline, "the slot was not freed"
            time.sleep(0.05)
    lines = [line for line in small_server.log.read_text().splitlines() if "status=499" in line]
    assert lines and float(lines[0].split("audio=")[1].split("s")[0]) < 1000  # it stopped long before 100000 frames


def test_a_body_that_never_finishes_gets_a_408(small_server):
    with socket.create_connection(("127.0.0.1", small_server.port), timeout=10) as s:
        s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                  b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":")
        reply = b""
        while b"did not arrive" not in reply and (data := s.recv(4096)):  # headers and body may come apart
            reply += data
    assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive" in reply


def test_sigterm_ends_running_streams_cleanly_and_exits(small_server):
    import soundfile as sf

    received = bytearray()

    def listen():
        with small_server.client().audio.speech.with_streaming_response.create(
                model="tts-1", voice="alloy", input=TEXT, response_format="wav",
                extra_body={"seed": 1, "max_frames": 100000}) as response:
            for chunk in response.iter_bytes():
                received.extend(chunk)

    listener = threading.Thread(target=listen)
    listener.start()
    assert eventually(lambda: len(received) >= 20000 or not listener.is_alive(), 120, every=0.01)
    assert small_server.stop() == 0
    listener.join(10)
    assert not listener.is_alive()
    audio, rate = sf.read(io.BytesIO(bytes(received)), dtype="int16")
    assert rate == 24000 and len(audio) == (len(received) - 44) // 2 and len(audio) % 3200 == 0


@pytest.mark.parametrize("command", ["serve", "wyoming"])
def test_an_address_out_of_range_or_taken_is_refused_in_one_sentence_before_serving(tiny_bundle, command):
    """A port past 65535 is refused as a usage error (serve once announced port 99999 and listened on 34463, its
    remainder mod 65536; wyoming ended in a traceback, as it did for a port that is no number); a port another
    program holds is refused at once, in one sentence, before any model loads and never after "serving on"."""
    from helpers import cli_run

    if command == "wyoming":
        pytest.importorskip("wyoming")
    spell = {"serve": lambda port: ["--port", str(port)], "wyoming": lambda port: ["--uri", f"tcp://127.0.0.1:{port}"]}
    for port in ("99999", "abc", "-1"):
        done = cli_run(command, str(tiny_bundle), *spell[command](port), timeout=60)
        assert done.returncode == 2 and "65535" in done.stderr and "Traceback" not in done.stderr, done.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli_run(command, str(tiny_bundle), *spell[command](port), timeout=60)
    where = f"127.0.0.1:{port}" if command == "serve" else f"tcp://127.0.0.1:{port}"
    assert done.returncode == 2 and "serving" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().endswith(f"{where}: cannot listen there (Address already in use); give another "
                                        f"{'--port, or 0 for any free one' if command == 'serve' else '--uri'}"), done.stderr
