"""ASR-Streaming without torch, on tiny checkpoints of both variants: build (fp32, int8, int4) with the window
geometry from the checkpoint and the 1.5B's head from the embedding, verify (the gates recorded, the admission
rule following them), the ONNX loop against the reference loop token for token, and the interfaces: the
Python API (fed in pieces), `transcribe --stream` (a file, paced or not, and PCM on standard input) and the
server (the official openai client's streamed transcription, and upstream's /v1/stream websocket)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import soundfile as sf
from helpers import KEY, Server, fuzz_examples, fuzz_seed, torch_blocked_environment
from test_asr_streaming import speech_samples

VARIANTS = ("1.5b", "7b")
PER_CHUNK = 6  # tokens per chunk: a random-weight model never ends a chunk by itself


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """{variant: {precision: bundle}} built and verified once, and the checkpoints."""
    from vibevoice_onnx.checkpoints.synthetic import make_checkpoint
    from vibevoice_onnx.export.build import build_bundle
    from vibevoice_onnx.verify.common import verify_bundle

    root = tmp_path_factory.mktemp("asr-streaming-onnx")
    built = {}
    for variant in VARIANTS:
        checkpoint = root / variant
        make_checkpoint("asr-streaming", checkpoint, size="tiny", seed=0, variant=variant)
        built[variant] = {"checkpoint": checkpoint}
        for precision in ("fp32", "int8", "int4"):
            bundle = build_bundle(checkpoint, root / f"onnx-{variant}", precision, write=True)
            verify_bundle(bundle, log=lambda message: None)
            built[variant][precision] = bundle
    return built


def chunks_of(bundle, audio, piece: int, rate: int = 24000, **options):
    from vibevoice_onnx.runtime.asr_streaming import StreamingTranscriber

    live = StreamingTranscriber(bundle, mean_latents=True, max_tokens_per_chunk=PER_CHUNK, **options)
    for start in range(0, len(audio), piece):
        live.feed(audio[start:start + piece], rate)
    live.finish()
    return live


@pytest.mark.parametrize("variant", VARIANTS)
def test_build_reads_the_geometry_and_the_1_5b_head_is_the_embedding(bundles, variant):
    from vibevoice_onnx.runtime.bundle import Bundle

    bundle = Bundle(bundles[variant]["fp32"])
    checkpoint = bundles[variant]["checkpoint"]
    assert bundle.info.preprocessor == json.loads((checkpoint / "preprocessor_config.json").read_text())
    assert (bundle.streaming_geometry.chunk_samples, bundle.streaming_geometry.window_samples) == (70400, 83200)
    (embedding,) = bundle.host_tensors("embed_tokens")
    hidden = np.random.default_rng(0).standard_normal((2, embedding.shape[1])).astype(np.float32)
    logits = bundle.session("lm_head").run(None, {"hidden_states": hidden})[0]
    tied = np.allclose(logits, hidden @ embedding.T, rtol=1e-4, atol=1e-4)
    assert tied == (variant == "1.5b")  # the 7B keeps its own head; the 1.5B's shipped one is never read


@pytest.mark.parametrize("variant", VARIANTS)
def test_verify_records_every_precisions_gates_and_the_admission_rule_follows_them(bundles, variant):
    from vibevoice_onnx.errors import VibeVoiceError
    from vibevoice_onnx.runtime.asr_streaming import StreamingTranscriber
    from vibevoice_onnx.runtime.bundle import Bundle

    for precision in ("fp32", "int8", "int4"):
        record = Bundle(bundles[variant][precision]).info.parity
        names = [gate["name"] for gate in record["gates"]]
        assert "streaming loop, teacher-forced: greedy picks agree" in names
        assert any("one 26-frame window, cold" in name for name in names)
        loop = record["streaming_loop"]
        assert loop["windows"] == 6  # the 17.28 s fixture: ceil(N / 70400)
        if precision != "int4":
            assert record["passed"] and loop["disagreeing_steps"] == [], [g for g in record["gates"] if not g["passed"]]
        # int4's verdict on a tiny checkpoint sits near its limit (per-pick logits 0.979 against 0.98, after greedy
        # picks that may split at a near tie), so what is asserted is what is stable: int4 is farther from the
        # reference than int8 on the loop's logits and the LM, by much more than int8's own error
        logits = {p: next(g["cosine"] for g in Bundle(bundles[variant][p]).info.parity["gates"]
                          if g["name"] == "streaming loop, teacher-forced: per-pick logits") for p in ("int8", "int4")}
        assert logits["int4"] < 0.99 < logits["int8"], logits
        if not record["passed"]:
            with pytest.raises(VibeVoiceError, match="failed"):
                StreamingTranscriber(bundles[variant][precision])


@pytest.mark.parametrize("variant", VARIANTS)
def test_onnx_loop_fed_in_pieces_is_the_reference_loop_token_for_token(bundles, variant):
    """The bundle's loop, fed odd-sized pieces (windows encoded as they arrive: split at the chunk's end by
    default, the 7B's in 6-frame segments, or whole), against the fp32 reference running the shared loop over
    the whole recording's windows: the same tokens in every chunk."""
    from vibevoice_onnx.generation.asr_streaming import StreamingSession, split_windows
    from vibevoice_onnx.reference.asr import load_asr
    from vibevoice_onnx.runtime.bundle import Bundle

    audio = speech_samples()
    bundle = Bundle(bundles[variant]["fp32"])
    live = chunks_of(bundle, audio, 7919, hotwords="VibeVoice", encode_ahead=6 if variant == "7b" else None)
    whole = chunks_of(bundle, audio, 7919, hotwords="VibeVoice", encode_ahead=0)  # each window encoded complete
    reference = StreamingSession(load_asr(bundles[variant]["checkpoint"]), bundle.tokenizer, bundle.streaming_geometry,
                                 "VibeVoice", None, PER_CHUNK)
    expected = [reference.chunk(window).tokens for window in split_windows(audio, bundle.streaming_geometry)]
    assert [c.tokens for c in live.chunks] == [c.tokens for c in whole.chunks] == expected
    assert live.text == "".join(c.text for c in live.chunks) and live.seconds == pytest.approx(len(audio) / 24000)


def test_the_api_refuses_what_it_cannot_do(bundles, tmp_path):
    from vibevoice_onnx.errors import VibeVoiceError
    from vibevoice_onnx.runtime.asr import Transcriber
    from vibevoice_onnx.runtime.asr_streaming import StreamingTranscriber

    bundle = bundles["1.5b"]["fp32"]
    with pytest.raises(VibeVoiceError, match="ASR-Streaming bundle: transcribe it with --stream"):
        Transcriber(bundle)
    live = StreamingTranscriber(bundle, max_tokens_per_chunk=2)
    live.feed(np.zeros(1000, np.float32), 16000)
    with pytest.raises(VibeVoiceError, match="sample rate changed mid-session"):
        live.feed(np.zeros(1000, np.float32), 24000)
    with pytest.raises(VibeVoiceError, match="NaN"):
        live.feed(np.full(10, np.nan, np.float32), 16000)
    assert len(live.finish()) == 1  # 1000 samples at 16 kHz: one padded window
    with pytest.raises(VibeVoiceError, match="finished"):
        live.feed(np.zeros(10, np.float32), 16000)
    with pytest.raises(VibeVoiceError, match="max_tokens_per_chunk"):
        StreamingTranscriber(bundle, max_tokens_per_chunk=0)
    with pytest.raises(VibeVoiceError, match="encode_ahead is a number of frames from 0 to 25"):
        StreamingTranscriber(bundle, encode_ahead=26)


def test_iteration_yields_chunks_as_another_thread_feeds(bundles):
    import threading

    from vibevoice_onnx.runtime.asr_streaming import StreamingTranscriber

    audio = speech_samples()[: 2 * 70400 + 100]
    live = StreamingTranscriber(bundles["1.5b"]["int8"], mean_latents=True, max_tokens_per_chunk=PER_CHUNK)

    def feed():
        for start in range(0, len(audio), 24000):
            live.feed(audio[start:start + 24000], 24000)
        live.finish()

    feeder = threading.Thread(target=feed)
    feeder.start()
    seen = [chunk.index for chunk in live]
    feeder.join()
    assert seen == [0, 1, 2] and len(live.chunks) == 3


@pytest.mark.parametrize("encode_ahead", [None, 0])
def test_a_bundles_first_session_has_run_every_graph_before_the_audio_comes(bundles, encode_ahead):
    """A graph's first run is slow (full size: seconds): it must not land on the first chunk's text. The first
    session of a Bundle runs, on its own encode path, every graph its chunks call; a second one does not again."""
    from vibevoice_onnx.runtime.asr import ENCODERS
    from vibevoice_onnx.runtime.asr_streaming import StreamingTranscriber
    from vibevoice_onnx.runtime.bundle import Bundle

    bundle = Bundle(bundles["1.5b"]["int8"])
    calls = bundle.time_calls()
    live = StreamingTranscriber(bundle, mean_latents=True, max_tokens_per_chunk=PER_CHUNK, encode_ahead=encode_ahead)
    warmed = set(calls)
    calls.clear()
    live.feed(speech_samples()[:83200], 24000)  # one whole window
    assert len(live.chunks) == 1 and set(calls) <= warmed and set(ENCODERS) <= warmed
    calls.clear()
    StreamingTranscriber(bundle, encode_ahead=encode_ahead)
    assert not set(calls) & set(ENCODERS)  # only its prompt's prefill ran


def test_pcm_from_standard_input_is_read_while_the_consumer_is_busy():
    """arecord blocks on a full pipe (~1.4 s of PCM) and then drops audio: the reader must keep reading while a
    chunk decodes, and hand over every sample, in order, with a stream error raised in the consumer."""
    import io

    from vibevoice_onnx.runtime.asr_streaming import pcm_pieces

    pcm = (np.arange(24000 * 3) % 2000 - 1000).astype("<i2")

    at_the_end = threading.Event()

    class Capture(io.BytesIO):
        reads = 0

        def read(self, size=-1):
            Capture.reads += 1
            data = super().read(size)
            if not data:
                at_the_end.set()
            return data

    pieces = pcm_pieces(Capture(pcm.tobytes()), 24000)
    first, _ = next(pieces)
    # the consumer takes nothing more (a chunk decoding) while the reader reads on to the end of the input;
    # the deadline only bounds a reader that never gets there
    assert at_the_end.wait(timeout=60), f"the reader stopped after {Capture.reads} reads"
    assert Capture.reads == 31  # 30 pieces of 0.1 s and the end, all read meanwhile
    rest = [piece for piece, _ in pieces]
    assert np.array_equal(np.concatenate([first, *rest]), pcm / 32768.0)

    class Broken(io.BytesIO):
        def read(self, size=-1):
            raise OSError("the device went away")

    with pytest.raises(OSError, match="went away"):
        list(pcm_pieces(Broken(), 24000))


def cli(*args: str, stdin: bytes | None = None, env: dict | None = None):
    done = subprocess.run([sys.executable, "-m", "vibevoice_onnx.cli", *args], input=stdin, capture_output=True, env=env)
    assert done.returncode == 0, done.stderr.decode()
    return done


def test_transcribe_stream_prints_each_chunk_from_a_file_and_from_stdin(bundles, tmp_path):
    bundle = bundles["7b"]["fp32"]  # one onnxruntime thread here, two in the API: fp32 keeps their sums' order moot
    audio = speech_samples()
    expected = chunks_of(bundle, audio, 24000)
    options = ["--stream", "--mean-latents", "--max-tokens-per-chunk", str(PER_CHUNK), "--threads", "1"]
    done = cli("transcribe", str(bundle), str(tmp_path / "speech.wav"), *options, "--format", "json") \
        if sf.write(tmp_path / "speech.wav", audio, 24000, subtype="FLOAT") is None else None
    lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert [(l["chunk"], l["text"]) for l in lines] == [(c.index, c.text) for c in expected.chunks]
    assert lines[1]["start"] == pytest.approx(2.9333, abs=1e-4) and "text" in done.stderr.decode()
    # standard input: S16_LE at the model's rate, as arecord gives it; the same samples through the API; and with
    # torch and transformers impossible to import, as on the runtime-only install
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2")
    done = cli("transcribe", str(bundle), "-", *options, "--format", "json", stdin=pcm.tobytes(),
               env=torch_blocked_environment(tmp_path))
    expected = chunks_of(bundle, pcm.astype(np.float32) / 32768.0, 24000)
    assert [json.loads(line)["text"] for line in done.stdout.decode().splitlines()] == [c.text for c in expected.chunks]


def test_realtime_paces_a_file_at_the_speed_of_speech(bundles, tmp_path):
    clip = tmp_path / "clip.wav"
    sf.write(clip, speech_samples()[: 3 * 24000], 24000)
    started = time.monotonic()
    done = cli("transcribe", "--stream", "--realtime", str(bundles["1.5b"]["int8"]), str(clip), "--max-tokens-per-chunk",
               "2", "--threads", "1")
    assert time.monotonic() - started >= 3.0  # the clip's 3 s, however fast the model
    assert "paced at the speed of speech" in done.stderr.decode() and done.stdout.decode().startswith("[   0.00 -    2.93] ")
    assert "chunk 1: text" in done.stderr.decode()  # 3 s: a whole chunk, then the rest padded


@pytest.fixture(scope="module")
def server(bundles, tmp_path_factory):
    pytest.importorskip("fastapi")
    log = tmp_path_factory.mktemp("server") / "server.log"
    running = Server([bundles["1.5b"]["int8"], bundles["7b"]["fp32"]], log)
    yield running
    assert running.stop() == 0, log.read_text()


def test_server_streams_a_transcription_chunk_by_chunk_to_the_openai_client(server, bundles, tmp_path):
    pytest.importorskip("openai")
    audio = speech_samples()
    path = tmp_path / "speech.wav"
    sf.write(path, audio, 24000, subtype="FLOAT")
    expected = chunks_of(bundles["1.5b"]["int8"], audio, 24000, threads=1)  # the server's one thread: the same sums
    model = "vibevoice-asr-streaming-cpu-int8"
    extra = {"mean_latents": True, "max_new_tokens": PER_CHUNK}
    with open(path, "rb") as f:
        events = list(server.client().audio.transcriptions.create(model=model, file=f, stream=True, extra_body=extra))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert deltas == [c.text for c in expected.chunks if c.text]
    assert events[-1].type == "transcript.text.done" and events[-1].text == expected.text
    with open(path, "rb") as f:
        whole = server.client().audio.transcriptions.create(model=model, file=f, response_format="verbose_json",
                                                            extra_body=extra)
    assert whole.text == expected.text and whole.segments[0].start == 0.0


def test_live_websocket_takes_pcm_frames_and_answers_each_chunk_as_upstreams_does(server, bundles):
    from websockets.sync.client import connect

    audio = speech_samples()
    expected = chunks_of(bundles["7b"]["fp32"], audio, 24000, threads=1)
    headers = {"Authorization": f"Bearer {KEY}"}
    with connect(f"ws://127.0.0.1:{server.port}/v1/stream", additional_headers=headers) as ws:
        ws.send(json.dumps({"model": "vibevoice-asr-streaming-cpu-fp32", "max_tokens": PER_CHUNK, "mean_latents": True}))
        for start in range(0, len(audio), 6000):
            ws.send(audio[start:start + 6000].astype("<f4").tobytes())
        first = json.loads(ws.recv(timeout=60))  # a window's text arrives before the audio is over
        ws.send("end")
        messages = [first] + [json.loads(ws.recv(timeout=60)) for _ in range(len(expected.chunks))]
    assert [(m["chunk"], m["text"]) for m in messages[:-1]] == [(c.index, c.text) for c in expected.chunks]
    assert messages[-1]["done"] and messages[-1]["total_chunks"] == 6 and messages[-1]["text"] == expected.text


def test_live_websocket_errors_are_messages(server):
    from websockets.sync.client import connect

    headers = {"Authorization": f"Bearer {KEY}"}
    with connect(f"ws://127.0.0.1:{server.port}/v1/stream", additional_headers=headers) as ws:
        ws.send(json.dumps({"sample_rate": 16000, "format": "s16le"}))
        ws.send(b"\x00\x01\x02")  # not whole 16-bit samples
        error = json.loads(ws.recv(timeout=30))
    assert error["type"] == "error" and "multiple of 2" in error["error"]["message"]
    with connect(f"ws://127.0.0.1:{server.port}/v1/stream", additional_headers=headers) as ws:
        ws.send(json.dumps({"chunk_seconds": 2}))
        error = json.loads(ws.recv(timeout=30))
    assert "unknown setting(s) chunk_seconds" in error["error"]["message"]


ANSWER_WITHIN = 60  # seconds: a socket silent this long after the client's last word is hung, not waiting


def test_random_message_sequences_on_the_live_socket_end_cleanly(server):
    """Hypothesis drives upstream's /v1/stream with random sequences of settings, PCM frames (odd lengths
    among them), "end", text, JSON, truncated JSON and oversized messages, in any order: every answer is a
    chunk, the final message or an error event in OpenAI's shape, and every close a clean one (the log's
    freedom from tracebacks is checked when the server stops)."""
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as st
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    settings_message = json.dumps({"model": "vibevoice-asr-streaming-cpu-fp32", "max_tokens": 2, "mean_latents": True})
    messages = st.one_of(
        st.just(settings_message),
        st.builds(lambda cut: settings_message[:cut], st.integers(1, 30)),
        st.builds(lambda n: (np.sin(np.arange(n) / 9) * 0.3).astype("<f4").tobytes(), st.integers(1, 24000)),
        st.binary(max_size=33),
        st.sampled_from(["end", '"end"', "{}", "[]", "null", '{"format": "s16le"}']),
        st.text(max_size=20),
        st.just(b"\0" * ((1 << 20) + 4)),  # over the server's 1 MiB message limit
    )

    @hypothesis.settings(max_examples=fuzz_examples(20), deadline=None, derandomize=fuzz_seed() == 1,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(st.lists(messages, min_size=1, max_size=6))
    def drive(sequence):
        """The sequence, then "end" (the client's last word): the server owes an end to the exchange, and a wait
        of ANSWER_WITHIN seconds without an answer or a close fails the test as a hang."""
        headers = {"Authorization": f"Bearer {KEY}"}
        with connect(f"ws://127.0.0.1:{server.port}/v1/stream", additional_headers=headers, max_size=None) as ws:
            try:
                for message in [*sequence, "end"]:
                    ws.send(message)
                while True:
                    answer = json.loads(ws.recv(timeout=ANSWER_WITHIN))
                    if answer.get("type") == "error":
                        assert answer["error"]["type"] == "invalid_request_error", answer
                        assert set(answer["error"]) == {"message", "type", "param", "code"}
                    elif answer.get("done"):
                        assert set(answer) == {"done", "total_chunks", "text", "segments"}, answer
                    else:
                        assert set(answer) >= {"chunk", "text", "start", "end"}, answer
            except ConnectionClosed as closed:
                code = closed.rcvd.code if closed.rcvd else None
                oversized = any(len(m) > 1 << 20 for m in sequence)  # refused mid-send: the close may be lost
                assert code in (1000, 1008, 1009) or code is None and oversized, (code, closed)

    drive()
