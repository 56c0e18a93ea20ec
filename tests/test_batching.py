"""Many streams on one model: each batched stream must give exactly what it gives alone, whatever joins,
leaves, waits for text or fails beside it."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from conftest import copy_bundle
from vibevoice_onnx.generation.batching import read_together

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


@pytest.fixture(scope="module")
def alone(two_voice_tts):
    """Each job's result run by itself, the lone stream's loop."""
    results = []
    for text, voice, seed, frames in JOBS:
        speech = two_voice_tts.stream(text, voice, seed=seed, max_frames=frames)
        list(speech)
        results.append(speech.result)
    return results


def wait_until(condition, seconds: float = 30) -> None:
    """Poll `condition` until it holds or `seconds` pass (the assertion after it says what was awaited)."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def assert_same(batched, single):
    assert batched.stop_reason == single.stop_reason and batched.frames == single.frames
    assert batched.eos_frame == single.eos_frame
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
    sizes = batch.batcher.batches["upper_speech"]
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
    assert max(batch.batcher.batches["upper_speech"]) == 2


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
    wait_until(lambda: not batch.batcher.live())
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
    wait_until(batch.batcher.live)
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
    from vibevoice_onnx.runtime.realtime import OnnxRealtimeBackend, StreamBatch
    from vibevoice_onnx.text import load_tokenizer
    from vibevoice_onnx.verify.realtime import batched_streams

    runtime = OnnxRealtimeBackend(Bundle(tiny_bundle))
    tokenizer = load_tokenizer(tiny_checkpoints["realtime"] / "tokenizer.json")
    assert batched_streams(realtime_reference, runtime, tokenizer).passed
    upper_speech = StreamBatch._upper_speech
    monkeypatch.setattr(StreamBatch, "_upper_speech", lambda self, payloads: upper_speech(self, payloads)[::-1])
    assert not batched_streams(realtime_reference, runtime, tokenizer).passed


def test_bench_streams_reports_each_batched_stream_and_one_alone(two_voice_tts, tiny_15b_bundle):
    from vibevoice_onnx.errors import VibeVoiceError
    from vibevoice_onnx.runtime.bench import bench, format_report

    report = bench(two_voice_tts.bundle.path, frames=8, streams=3)
    assert [len(times) for times in report["together"]["chunk_times"]] == [8, 8, 8]
    assert len(report["alone"]["chunk_times"]) == 1 and len(report["alone"]["chunk_times"][0]) == 8
    assert report["together"]["batches"]["upper_speech"]["largest"] == 3  # the three ran as one batch
    assert report["together"]["voices"] == ["second", "synthetic", "second"]  # the bundle's voices in turn
    assert "3 streams" in format_report(report)
    with pytest.raises(VibeVoiceError, match="realtime"):
        bench(tiny_15b_bundle, frames=4, streams=2)


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
    wait_until(lambda: not batch.batcher.live())
    assert batch.batcher.live() == []  # cancelled while it waited for its reader
