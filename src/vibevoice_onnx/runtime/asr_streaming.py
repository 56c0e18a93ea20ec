"""VibeVoice-ASR-Streaming without PyTorch: text chunk by chunk as the audio arrives (generation/asr_streaming.py's
loop on the bundle's graphs).

    live = StreamingTranscriber("onnx/asr-streaming/cpu_int8", hotwords="Zorblax")
    for piece in microphone():            # any rate; resampled to the model's as it streams
        for chunk in live.feed(piece, 16000):
            print(chunk.text, end="", flush=True)
    live.finish()                          # the held lookahead and any partial chunk, zero-padded
    print(live.text)

Or feed from one thread and iterate `for chunk in live:` in another (iteration ends after `finish()`).
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np

from ..errors import VibeVoiceError
from ..options import check
from ..generation.asr_streaming import (MAX_TOKENS_PER_CHUNK, ChunkResult, StreamingSession, WindowFeeder,
                                        chunk_segments)
from ..generation.repetition import Repetition
from .asr import OnnxAsrBackend, Transcript, joined
from .bundle import Bundle
from .pretrained import FromPretrained

F32 = np.float32
KIND = "asr-streaming"
PIECE_SECONDS = 0.1  # how much audio a paced file or standard input hands over at a time
_warm: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Bundle -> the encode_ahead paths already run


def warm_up(bundle: Bundle, encode_ahead: int) -> None:
    """Run every graph a session uses once, on a silent window decoded to one token, the first time a Bundle
    object serves a session on this encode path: onnxruntime's first run of a graph is slow (buffers allocated,
    weights paged in), and without this it lands on the first chunk of live audio (full-size 1.5B int8: ~2 s late)."""
    done = _warm.setdefault(bundle, set())
    if encode_ahead in done:
        return
    geometry = bundle.streaming_geometry
    session = StreamingSession(OnnxAsrBackend(bundle), bundle.tokenizer, geometry, max_tokens_per_chunk=1)
    feeder = window_feeder(geometry, session.backend, encode_ahead)
    for piece in np.array_split(np.zeros(geometry.window_samples, F32), 4):  # in pieces, as audio arrives
        for window, means in feeder.feed(piece):
            session.chunk(window, means)
    done.add(encode_ahead)


def encode_path(geometry, encode_ahead: int | None) -> int:
    """The frames a session encodes at a time as a window arrives: `encode_ahead`, by default (None) the chunk's,
    so the chunk is encoded while its lookahead arrives; 0: each window once complete."""
    ahead = geometry.chunk_frames if encode_ahead is None else encode_ahead
    if not isinstance(ahead, int) or not 0 <= ahead < geometry.window_frames:
        raise VibeVoiceError(f"encode_ahead is a number of frames from 0 to {geometry.window_frames - 1}, "
                             f"got {encode_ahead!r}")
    return ahead


def window_feeder(geometry, backend: OnnxAsrBackend, ahead: int) -> WindowFeeder:
    """The windows of arriving audio, encoded by `backend` in segments of `ahead` frames (0: none, each window
    encoded whole once complete)."""
    return WindowFeeder(geometry, backend if ahead else None, ahead or 1)


def open_streaming_bundle(bundle: Bundle | str | Path, threads: int | None = None, force: bool = False) -> Bundle:
    bundle = bundle if isinstance(bundle, Bundle) else Bundle(Path(bundle), threads=threads)
    bundle.require_kind(KIND)
    if not force:
        bundle.require_usable()
    bundle.streaming_geometry  # noqa: B018 (refuses a bundle without its window geometry now, not at the first window)
    return bundle


class StreamingTranscriber(FromPretrained):
    """One live transcription session on an ASR-Streaming bundle (onnxruntime + numpy only). A Bundle object
    may be shared by many sessions: its graphs are opened once. `seed` seeds upstream's acoustic noise (random
    without it); `mean_latents` uses the encoder means instead (deterministic). `encode_ahead=N`: encode each
    window while its audio arrives, in segments of N frames, so its text comes sooner after its last sample;
    by default (None) the window's chunk is encoded as soon as it is complete, while the lookahead arrives, and
    the lookahead's frames after it; 0: each window encoded once complete (generation.asr_streaming's
    ENCODE_AHEAD note has the measurements). `warm` (default): the first session of a Bundle object runs its
    graphs once on silence before it takes audio (see warm_up). `repetition_guard` (default): a decoding loop in a
    chunk is cut back and decoding resumed (generation.repetition), reported in the chunk's `repetition`."""

    def __init__(self, bundle: Bundle | str | Path, hotwords: str | None = None, seed: int | None = None,
                 mean_latents: bool = False, max_tokens_per_chunk: int = MAX_TOKENS_PER_CHUNK,
                 threads: int | None = None, force: bool = False, encode_ahead: int | None = None,
                 warm: bool = True, repetition_guard: bool = True):
        self.bundle = open_streaming_bundle(bundle, threads, force)
        self.geometry = self.bundle.streaming_geometry
        rng = None if mean_latents else np.random.default_rng(seed)
        self.session = StreamingSession(OnnxAsrBackend(self.bundle), self.bundle.tokenizer, self.geometry, hotwords,
                                        rng, max_tokens_per_chunk, self.bundle.dims.lm.max_positions,
                                        repetition_guard=repetition_guard)
        ahead = encode_path(self.geometry, encode_ahead)
        if warm:
            warm_up(self.bundle, ahead)
        self.feeder = window_feeder(self.geometry, self.session.backend, ahead)
        self.resampler, self.rate = None, None
        self.chunks: list[ChunkResult] = []
        self.finished, self.samples = False, 0
        self._lock, self._ready = threading.Lock(), threading.Condition()

    @property
    def text(self) -> str:
        """The transcript so far: the chunks' texts concatenated (upstream's full transcript)."""
        return "".join(chunk.text for chunk in self.chunks)

    @property
    def seconds(self) -> float:
        """Audio received so far, at the model's rate."""
        return self.samples / self.geometry.sample_rate

    def feed(self, samples: np.ndarray, sample_rate: int) -> list[ChunkResult]:
        """Take the next piece of audio (float samples in [-1, 1], mono, or [N, channels] averaged); return
        the chunks it completed, each decoded before this returns. The rate may not change mid-session."""
        with self._lock:
            if self.finished:
                raise VibeVoiceError("this session is finished; start a new StreamingTranscriber")
            return self._decode(self.feeder.feed(self._resampled(samples, sample_rate)))

    def finish(self) -> list[ChunkResult]:
        """End of audio: the held lookahead and any partial chunk as upstream's padded last windows."""
        with self._lock:
            if self.finished:
                return []
            tail = self.feeder.feed(self._flush_resampler()) if self.resampler is not None else []
            try:
                return self._decode(tail + self.feeder.finish())
            finally:
                with self._ready:
                    self.finished = True
                    self._ready.notify_all()

    def __iter__(self) -> Iterator[ChunkResult]:
        """Every chunk, in order, as it is decoded; ends once `finish()` has run."""
        taken = 0
        while True:
            with self._ready:
                self._ready.wait_for(lambda: len(self.chunks) > taken or self.finished)
                fresh, done = self.chunks[taken:], self.finished
            yield from fresh
            taken += len(fresh)
            if done and taken == len(self.chunks):
                return

    def transcript(self) -> Transcript:
        """The chunks so far as one transcript: the text upstream's loop gives (the chunks' concatenated), and a
        segment per speaker turn of each chunk (see chunk_segments)."""
        segments, speaker = [], None
        for chunk in self.chunks:
            segments += chunk_segments(chunk, speaker)
            speaker = chunk.speaker
        cut = [str(c.index) for c in self.chunks if c.stop_reason == "max_tokens"]
        note = f"chunk(s) {', '.join(cut)} stopped at the {self.session.limit}-token limit" if cut else None
        repetition = Repetition.of_chunks([c.repetition for c in self.chunks], self.session.repetition_guard)
        decode_seconds = sum(c.seconds for c in self.chunks)
        tokens = [t for c in self.chunks for t in c.tokens]
        return Transcript(segments, self.text, self.text, tokens, joined(note, repetition.describe()), self.seconds,
                          {"decode_seconds": decode_seconds, "chunks": len(self.chunks),
                           "tokens_per_second": len(tokens) / max(decode_seconds, 1e-9)}, readable=self.text,
                          repetition=repetition)

    def _decode(self, windows: list[tuple[np.ndarray, tuple]]) -> list[ChunkResult]:
        fresh = []
        for window, means in windows:
            chunk = self.session.chunk(window, means)
            fresh.append(chunk)
            with self._ready:
                self.chunks.append(chunk)
                self._ready.notify_all()
        return fresh

    def _resampled(self, samples: np.ndarray, rate: int) -> np.ndarray:
        samples = np.asarray(samples, F32)
        if samples.ndim == 2:
            samples = samples.mean(axis=1, dtype=F32)
        if samples.ndim != 1:
            raise VibeVoiceError(f"audio pieces are [samples] or [samples, channels], got shape {samples.shape}")
        if not np.isfinite(samples).all():
            raise VibeVoiceError("the audio holds NaN or infinite samples")
        if self.rate is None:
            check("sample_rate", rate)
            self.rate = int(rate)
            if self.rate != self.geometry.sample_rate:
                import soxr

                self.resampler = soxr.ResampleStream(self.rate, self.geometry.sample_rate, 1, dtype="float32",
                                                     quality="HQ")
        elif rate != self.rate:
            raise VibeVoiceError(f"the sample rate changed mid-session ({self.rate} Hz, then {rate} Hz)")
        out = samples if self.resampler is None else self.resampler.resample_chunk(samples, last=False)
        self.samples += len(out)
        return out

    def _flush_resampler(self) -> np.ndarray:
        tail = self.resampler.resample_chunk(np.zeros(0, F32), last=True)
        self.samples += len(tail)
        return tail


class StreamingModel:
    """An ASR-Streaming bundle opened once for many sessions (a server's): `session()` starts one live
    transcription, `transcribe()` runs a whole recording through one. Sessions are not batched with each other:
    each holds its own cache and decodes in its own thread."""

    def __init__(self, bundle: Bundle | str | Path, threads: int | None = None, force: bool = False):
        self.bundle, self.force = open_streaming_bundle(bundle, threads, force), force
        self.tokenizer = self.bundle.tokenizer
        warm_up(self.bundle, encode_path(self.bundle.streaming_geometry, None))  # the default path, before any audio

    def batch(self, max_streams: int) -> None:
        return None  # nothing to share between sessions' steps yet (see the class docstring)

    def session(self, hotwords: str | None = None, **options) -> StreamingTranscriber:
        return StreamingTranscriber(self.bundle, hotwords=hotwords, force=self.force, **options)

    def transcribe(self, audio: np.ndarray, sample_rate: int, hotwords: str | None = None, on_chunk=None,
                   piece_seconds: float = 1.0, **options) -> Transcript:
        """A whole recording through one session, handed over `piece_seconds` at a time; `on_chunk(chunk)` as each
        chunk's text is ready."""
        live = self.session(hotwords, **options)
        step = max(1, int(piece_seconds * sample_rate))
        for start in range(0, len(audio), step):
            for chunk in live.feed(audio[start:start + step], sample_rate):
                if on_chunk is not None:
                    on_chunk(chunk)
        for chunk in live.finish():
            if on_chunk is not None:
                on_chunk(chunk)
        return live.transcript()


def file_pieces(path: Path, paced: bool) -> Iterator[tuple[np.ndarray, float]]:
    """A recording at the model's rate in pieces of PIECE_SECONDS, each with the wall-clock time its last sample
    is due; `paced`: handed over no sooner than that (a file played at the speed of speech)."""
    from ..audio import SAMPLE_RATE, read_audio

    samples, _ = read_audio(Path(path))
    step, started = int(PIECE_SECONDS * SAMPLE_RATE), time.monotonic()
    for start in range(0, len(samples), step):
        piece = samples[start:start + step]
        due = started + (start + len(piece)) / SAMPLE_RATE
        if paced and due > time.monotonic():
            time.sleep(due - time.monotonic())
        yield piece, (due if paced else time.monotonic())


def pcm_pieces(stream: BinaryIO, sample_rate: int) -> Iterator[tuple[np.ndarray, float]]:
    """Raw signed 16-bit little-endian mono PCM (`arecord -f S16_LE`) in pieces as it arrives, each with its
    arrival time. The stream is read on a thread of its own, whatever the consumer is doing: a pipe holds ~1.4 s
    of 24 kHz PCM, and a capture whose writes block while a chunk decodes overruns its buffer and drops audio."""
    import queue

    arrived: queue.SimpleQueue = queue.SimpleQueue()

    def drain():
        try:
            for piece in _pcm_blocks(stream, sample_rate):
                arrived.put(piece)
            arrived.put(None)
        except BaseException as e:  # handed to the consumer, raised there
            arrived.put(e)

    threading.Thread(target=drain, name="pcm-reader", daemon=True).start()
    while (item := arrived.get()) is not None:
        if isinstance(item, BaseException):
            raise item
        yield item


def _pcm_blocks(stream: BinaryIO, sample_rate: int) -> Iterator[tuple[np.ndarray, float]]:
    size = 2 * max(1, int(PIECE_SECONDS * sample_rate))
    carry = b""
    while block := stream.read(size):
        data, carry = carry + block, b""
        if len(data) % 2:
            data, carry = data[:-1], data[-1:]
        yield np.frombuffer(data, "<i2").astype(F32) / 32768.0, time.monotonic()


def audio_pieces(source: str, sample_rate: int, paced: bool) -> Iterator[tuple[np.ndarray, float]]:
    """`-`: PCM from standard input at `sample_rate`; anything else: a file (see file_pieces)."""
    return pcm_pieces(sys.stdin.buffer, sample_rate) if source == "-" else file_pieces(Path(source), paced)
