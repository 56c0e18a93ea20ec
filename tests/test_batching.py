"""Many streams on one model: each batched stream must give exactly what it gives alone, whatever joins,
leaves, waits for text or fails beside it."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from conftest import SHARED, copy_bundle, write_voice_sample
from helpers import eventually
from vibevoice_onnx.generation.batching import read_together

SPEECH = SHARED / "fixtures" / "audio" / "demo3-hotwords.wav"
JOBS = [  # text, voice, seed, frame limit: different voices, lengths and limits
    ("Hello there, how are you today?", "synthetic", 7, 20),
    ("A second voice speaks a longer sentence, and on and on it goes.", "second", 8, 33),
    ("Short.", "synthetic", 9, 12),
]


@pytest.fixture(scope="module")
def two_voice_tts(tiny_bundle, tiny_checkpoints, realtime_reference, tmp_path_factory):
    """The tiny realtime bundle with a second voice (another synthetic prompt: other lengths, other values)."""
    from vibevoice_onnx.reference.presets import write_synthetic_preset
    from vibevoice_onnx.runtime.realtime import RealtimeTTS
    from vibevoice_onnx.runtime.voice_store import import_voice
    from vibevoice_onnx.text import load_tokenizer

    root = tmp_path_factory.mktemp("two-voices")
    bundle = copy_bundle(tiny_bundle, root / "bundle")
    tokenizer = load_tokenizer(tiny_checkpoints["realtime"] / "tokenizer.json")
    import_voice(bundle, write_synthetic_preset(realtime_reference, tokenizer, root / "second.pt", seed=1), "second")
    return RealtimeTTS(bundle)


def lone_speeches(model, jobs, **options) -> list:
    """Each (text or script, voice or speakers, seed, frame limit) spoken by itself: the lone stream's loop."""
    speeches = []
    for text, voice, seed, frames in jobs:
        speeches.append(model.stream(text, voice, seed=seed, max_frames=frames, **options))
        list(speeches[-1])
    return speeches


@pytest.fixture(scope="module")
def alone(two_voice_tts):
    return [speech.result for speech in lone_speeches(two_voice_tts, JOBS)]


def assert_same(batched, single):
    assert batched.stop_reason == single.stop_reason and batched.eos_frame == single.eos_frame
    assert_same_audio(batched, single)


def assert_same_audio(batched, single):
    assert batched.frames == single.frames
    a, b = np.stack(batched.latents).ravel(), np.stack(single.latents).ravel()
    assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) >= 0.99999
    x, y = batched.audio, single.audio
    assert len(x) == len(y) and x @ y / np.linalg.norm(x) / np.linalg.norm(y) >= 0.99999


def test_batched_streams_give_each_its_own_audio_whoever_joins_late(two_voice_tts, alone):
    batch = two_voice_tts.batch(max_streams=4)
    speeches = [two_voice_tts.stream(text, voice, seed=seed, max_frames=frames, batch=batch)
                for text, voice, seed, frames in JOBS]
    read_together(speeches, late=2, after=3)  # the third joins once the first has made three frames
    for speech, single in zip(speeches, alone):
        assert_same(speech.result, single)
    sizes = batch.batcher.batches["lm_step"]
    # one upper-LM call served several streams: the weights were read once for them
    assert max(sizes) >= 2 and len(sizes) < sum(sizes)
    assert sum(sizes) == sum(result.frames for result in alone) - sum(r.stop_reason == "max_frames" for r in alone)


def test_a_stream_that_stops_frees_its_place_for_a_waiting_one(two_voice_tts, alone):
    batch = two_voice_tts.batch(max_streams=2)
    speeches = [two_voice_tts.stream(text, voice, seed=seed, max_frames=frames, batch=batch)
                for text, voice, seed, frames in JOBS]
    read_together(speeches)  # the third waits for a free place, then runs
    for speech, single in zip(speeches, alone):
        assert_same(speech.result, single)
    assert max(batch.batcher.batches["lm_step"]) == 2


def test_a_cancelled_stream_leaves_and_the_others_run_on_unchanged(two_voice_tts, alone):
    batch = two_voice_tts.batch(max_streams=4)
    speeches = [two_voice_tts.stream(text, voice, seed=seed, max_frames=frames, batch=batch)
                for text, voice, seed, frames in JOBS]
    others = threading.Thread(target=read_together, args=([speeches[0], speeches[2]],))
    others.start()
    cancelled = iter(speeches[1])
    for _ in range(3):
        next(cancelled)
    cancelled.close()  # the reader gives up: its loop stops at its next model call, the others run on
    others.join(timeout=120)
    for index in (0, 2):
        assert_same(speeches[index].result, alone[index])
    assert speeches[1].result.frames < JOBS[1][3]
    eventually(lambda: not batch.batcher.live(), 30, every=0.01)
    assert batch.batcher.live() == []  # its place is free


def test_text_streamed_into_a_batched_stream_waits_without_holding_the_others(two_voice_tts, alone):
    batch = two_voice_tts.batch(max_streams=4)
    text, voice, seed, frames = JOBS[1]
    fed = two_voice_tts.text_stream(voice, seed=seed, max_frames=frames, batch=batch)
    whole = two_voice_tts.stream(*JOBS[0][:2], seed=JOBS[0][2], max_frames=JOBS[0][3], batch=batch)
    whole_done = threading.Event()

    def feed():
        fed.feed(text[:9])  # less than a text window: the stream waits for more
        whole_done.wait(timeout=60)  # the rest comes only once the other stream is done: it must not wait
        fed.feed(text[9:])
        fed.finish()

    def read_whole():
        list(whole)
        whole_done.set()

    feeder = threading.Thread(target=feed)
    feeder.start()
    reader = threading.Thread(target=read_together, args=([fed],))
    reader.start()
    eventually(batch.batcher.live, 30, every=0.01)
    assert len(batch.batcher.live()) == 1  # the fed stream is in the batch, waiting for its text
    read_whole()
    reader.join(timeout=120)
    feeder.join(timeout=60)
    assert_same(whole.result, alone[0])
    assert_same(fed.result, alone[1])


def test_an_error_in_a_batch_reaches_every_stream_in_it_and_none_hangs():
    from vibevoice_onnx.generation.batching import Batcher, member_frames

    def failing(payloads):
        raise RuntimeError("the model failed")

    batcher = Batcher({"step": failing}, 3)

    def loop(member):
        yield batcher.call(member, "step", member.slot)

    errors = []

    def guarded(stream):
        try:
            yield from stream
        except RuntimeError as error:
            errors.append(str(error))

    read_together([guarded(member_frames(batcher, loop)) for _ in range(3)], timeout=60)  # raises if one hangs
    assert errors == ["the model failed"] * 3
    assert batcher.live() == []  # all left: a failed batch leaves no member behind


def test_the_verify_gate_catches_a_batch_that_hands_streams_each_others_rows(tiny_bundle, tiny_checkpoints,
                                                                              realtime_reference, monkeypatch):
    from vibevoice_onnx.runtime.bundle import Bundle
    from vibevoice_onnx.runtime.batch import StreamBatch
    from vibevoice_onnx.runtime.realtime import OnnxRealtimeBackend
    from vibevoice_onnx.text import load_tokenizer
    from vibevoice_onnx.verify.realtime import batched_streams

    runtime = OnnxRealtimeBackend(Bundle(tiny_bundle))
    tokenizer = load_tokenizer(tiny_checkpoints["realtime"] / "tokenizer.json")
    assert batched_streams(realtime_reference, runtime, tokenizer).passed
    lm_step = StreamBatch._lm_step
    monkeypatch.setattr(StreamBatch, "_lm_step", lambda self, payloads: lm_step(self, payloads)[::-1])
    assert not batched_streams(realtime_reference, runtime, tokenizer).passed


def test_bench_streams_reports_each_batched_stream_and_one_alone(two_voice_tts, tiny_15b_bundle):
    from vibevoice_onnx.errors import VibeVoiceError
    from vibevoice_onnx.runtime.bench import bench, format_report

    report = bench(two_voice_tts.bundle.path, frames=8, streams=3)
    assert [len(times) for times in report["together"]["chunk_times"]] == [8, 8, 8]
    assert len(report["alone"]["chunk_times"]) == 1 and len(report["alone"]["chunk_times"][0]) == 8
    assert report["together"]["batches"]["lm_step"]["largest"] == 3  # the three ran as one batch
    assert report["together"]["voices"] == ["second", "synthetic", "second"]  # the bundle's voices in turn
    assert "3 streams" in format_report(report)
    long_form = bench(tiny_15b_bundle, frames=4, streams=2)  # two scripts, one with two speakers
    assert [len(times) for times in long_form["together"]["chunk_times"]] == [4, 4]
    assert long_form["together"]["batches"]["lm_step"]["largest"] == 2
    with pytest.raises(VibeVoiceError, match="--audio is for ASR"):
        bench(tiny_15b_bundle, frames=4, streams=2, audio=[SPEECH])


def test_a_frame_is_late_when_ready_after_a_listener_starting_at_the_first_audio_reaches_it():
    from vibevoice_onnx.runtime.bench import FRAME_SECONDS, late_frames

    on_time, late = 1.0 + FRAME_SECONDS - 0.01, 1.0 + 2 * FRAME_SECONDS + 0.01
    assert late_frames([1.0, on_time, late]) == 1
    assert late_frames([5.0]) == 0  # the first frame sets the clock: it is never late


def test_a_stream_whose_reader_stalls_runs_only_a_little_ahead_and_holds_nobody_up(two_voice_tts, alone):
    from vibevoice_onnx.generation.batching import AHEAD
    from vibevoice_onnx.runtime.realtime import DECODE_GROUP

    batch = two_voice_tts.batch(max_streams=2)
    stalled = two_voice_tts.stream("A reader that stops reading, and never comes back for more of it.", "second",
                                   seed=3, max_frames=60, batch=batch)
    reading = iter(stalled)
    next(reading)  # joined, and then not read again
    running = two_voice_tts.stream(*JOBS[0][:2], seed=JOBS[0][2], max_frames=JOBS[0][3], batch=batch)
    read_together([running], timeout=60)  # finishes although the other stream's reader is gone
    assert_same(running.result, alone[0])
    # the chunk read, AHEAD waiting, a decoder group's latents made before their audio, and one being made
    assert stalled.result.frames <= 1 + AHEAD + DECODE_GROUP + 1
    reading.close()
    eventually(lambda: not batch.batcher.live(), 30, every=0.01)
    assert batch.batcher.live() == []  # cancelled while it waited for its reader


SCRIPTS = [  # script, speakers, seed, latent limit: other lengths, speaker counts and voices
    ("Speaker 1: Hello there, how are you today?", "alice", 3, 14),
    ("Speaker 1: A second script.\nSpeaker 2: With two speakers, and a longer line than the first.",
     {1: "bob", 2: "alice"}, 4, 25),
    ("Speaker 1: Short.", "bob", 5, 9),
]


@pytest.fixture(scope="module")
def long_form_tts(tiny_15b_bundle, tmp_path_factory):
    """The tiny 1.5B bundle with a second voice sample (another length and pitch)."""
    from vibevoice_onnx.runtime.tts15b import LongFormTTS
    from vibevoice_onnx.runtime.voice_store import import_voice

    root = tmp_path_factory.mktemp("long-form-voices")
    bundle = copy_bundle(tiny_15b_bundle, root / "bundle")
    import_voice(bundle, write_voice_sample(root / "bob.flac", seconds=1.7, pitch=120.0), "bob")
    return LongFormTTS(bundle)


def assert_same_long_form(batched, single):
    assert batched.tokens == single.tokens and batched.stop_reason == single.stop_reason
    assert_same_audio(batched, single)


def test_long_form_scripts_batched_each_give_what_they_give_alone(long_form_tts):
    """Sampled voice latents (each stream's own voice noise), one or two speakers, the last joining late."""
    alone = [speech.result for speech in lone_speeches(long_form_tts, SCRIPTS)]
    batch = long_form_tts.batch(max_streams=3)
    speeches = [long_form_tts.stream(script, speakers, seed=seed, max_frames=frames, batch=batch)
                for script, speakers, seed, frames in SCRIPTS]
    read_together(speeches, late=2, after=3, timeout=120)
    for speech, single in zip(speeches, alone):
        assert_same_long_form(speech.result, single)
    assert max(batch.batcher.batches["lm_step"]) == 3 and batch.batcher.live() == []


def test_a_script_in_segments_restarts_its_rows_inside_the_batch(long_form_tts, monkeypatch):
    """A script longer than the (shrunk) context runs in parts, each from a fresh prefill of its rows, beside
    a stream that runs on through the other's restarts."""
    lines = [f"Speaker {1 + i % 2}: Sentence number {i} is here, with a few more words." for i in range(4)]
    script, speakers = "\n".join(lines), {1: "alice", 2: "bob"}
    # A part's prompt may take a third of the positions: room for all lines but the last, which goes on in a second
    # part (two parts, each running to upstream's cap of twice its prompt: as few steps as a restart can take).
    head = long_form_tts.stream("\n".join(lines[:-1]), speakers, voice_latents="mean", seed=2)
    monkeypatch.setattr(long_form_tts.backend, "max_positions", 3 * head.prompt_tokens)
    runs = [(script, speakers, 2, None), SCRIPTS[1]]
    alone = lone_speeches(long_form_tts, runs, voice_latents="mean")
    assert alone[0].segments == len(alone[0].result.segments) == 2  # it did run in parts
    batch = long_form_tts.batch(max_streams=2)
    speeches = [long_form_tts.stream(text, voices, voice_latents="mean", seed=seed, max_frames=frames, batch=batch)
                for text, voices, seed, frames in runs]
    read_together(speeches, timeout=120)
    for speech, single in zip(speeches, alone):
        assert speech.result.segments == single.result.segments
        assert_same_long_form(speech.result, single.result)


def transcription_clips():
    rng = np.random.default_rng(0)
    return [(0.3 * np.sin(np.arange(n) * f) + 0.01 * rng.standard_normal(n)).astype(np.float32)
            for n, f in ((24000 * 3, 0.01), (24000 * 5 + 777, 0.02), (24000 * 2, 0.05))]


def test_transcriptions_batched_each_give_the_tokens_they_give_alone(tiny_asr_bundle):
    from vibevoice_onnx.runtime.asr import Transcriber

    transcriber = Transcriber(tiny_asr_bundle, force=True)
    clips, limits = transcription_clips(), [40, 25, 60]
    alone = [transcriber.transcribe(clip, 24000, max_new_tokens=limit, seed=k)
             for k, (clip, limit) in enumerate(zip(clips, limits))]
    batch = transcriber.batch(max_streams=3)
    batched = [None] * len(clips)

    def transcribe(k):
        batched[k] = transcriber.transcribe(clips[k], 24000, max_new_tokens=limits[k], seed=k, batch=batch)

    threads = [threading.Thread(target=transcribe, args=(k,)) for k in range(len(clips))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [t.tokens for t in batched] == [t.tokens for t in alone]
    assert [len(t.tokens) for t in alone] == limits  # the tiny model never stops early: every step compared
    assert max(batch.batcher.batches["lm_step"]) == 3 and max(batch.batcher.batches["logits"]) == 3


@pytest.mark.parametrize("kind", ["1.5b", "asr"])
def test_the_verify_gates_catch_a_batch_that_hands_streams_each_others_rows(kind, tiny_15b_bundle, tiny_asr_bundle,
                                                                             monkeypatch):
    from vibevoice_onnx.runtime.batch import StreamBatch
    from vibevoice_onnx.runtime.bundle import Bundle

    if kind == "asr":
        from vibevoice_onnx.runtime.asr import OnnxAsrBackend
        from vibevoice_onnx.verify.asr import batched_streams, verification_audio

        bundle = Bundle(tiny_asr_bundle)
        gate = lambda: batched_streams(bundle, OnnxAsrBackend(bundle), verification_audio(None)[0])  # noqa: E731
    else:
        from vibevoice_onnx.runtime.tts15b import OnnxTts15bBackend
        from vibevoice_onnx.verify.tts15b import batched_streams, synthetic_voices

        bundle = Bundle(tiny_15b_bundle)
        gate = lambda: batched_streams(bundle, OnnxTts15bBackend(bundle), synthetic_voices())  # noqa: E731
    assert gate().passed
    lm_step = StreamBatch._lm_step
    monkeypatch.setattr(StreamBatch, "_lm_step", lambda self, payloads: lm_step(self, payloads)[::-1])
    assert not gate().passed


def test_bench_of_an_asr_bundle_times_batched_transcriptions(tiny_asr_bundle, tmp_path):
    import soundfile

    from vibevoice_onnx.errors import VibeVoiceError
    from vibevoice_onnx.runtime.bench import bench, format_report

    paths = []
    for k, clip in enumerate(transcription_clips()[:2]):
        paths.append(tmp_path / f"clip{k}.wav")
        soundfile.write(paths[-1], clip, 24000)
    report = bench(tiny_asr_bundle, frames=6, streams=3, audio=paths)
    assert [len(times) for times in report["together"]["token_times"]] == [6, 6, 6]
    assert [s["recording"] for s in report["together"]["per_stream"]] == [str(p) for p in paths + paths[:1]]
    assert report["together"]["batches"]["lm_step"]["largest"] == 3
    assert "3 streams" in format_report(report) and "tokens/s" in format_report(report)
    with pytest.raises(VibeVoiceError, match="--audio"):
        bench(tiny_asr_bundle, frames=6, streams=2)
