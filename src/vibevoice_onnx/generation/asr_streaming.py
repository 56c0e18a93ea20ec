"""VibeVoice-ASR-Streaming's loop (facts sheet 12.6-12.10), written once and run on both backends (an
AsrBackend: generation/asr.py).

A plain-text prompt (no chat template) is prefilled once into one growing KV cache. Then, window after window
(window k: samples [k·chunk, k·chunk + chunk + lookahead), the last zero-padded to a whole window), each
window encoded cold by both encoders (no conv state carried), the acoustic means given upstream's σ-VAE
noise unless the caller asks for the means, the connectors' sum appended between the speech-start and
speech-end tokens; greedy tokens until <|text_chunk_end|> or <|endoftext|> or the per-chunk limit; then
<|text_chunk_end|> fed once whatever ended the chunk (EOS does not end the session), as the first row of the
next window's (facts 12.12.9: its logits are unused, so the cache is the same and a chunk's text is ready one LM
step sooner). Each chunk's text has
the special tokens stripped; its time span is the chunk's, and `Speaker N:` labels carry across chunks.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ..checkpoints.configs import StreamingGeometry
from ..errors import VibeVoiceError
from ..options import check
from ..text import special_ids
from ..transcription import Segment
from .asr import AsrBackend, acoustic_sample, cut_back, greedy_pick, resume
from .repetition import Repetition, RepetitionGuard

PROMPT = ("You are a helpful assistant that transcribes audio input into text output. Please transcribe the "
          "following audios streamingly with these keys: speaker, content\n")
CHUNK_END, SPEECH_START, SPEECH_END, END_OF_TEXT = ("<|text_chunk_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                                                    "<|endoftext|>")
# What upstream's server deletes from a chunk's decoded text (decoding skips the special tokens already).
RESIDUAL_SPECIALS = ("<|text_chunk_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
                     "<|speech_start|>", "<|speech_end|>", "<|speech_pad|>")
MAX_TOKENS_PER_CHUNK = 256  # upstream's default
# ENCODE_AHEAD: a window encoded while its audio arrives, in segments of N frames, so that its text waits only for
# the frames after its last whole segment. Live on the full-size 1.5B int8 bundle on 2 cores (8 text tokens a
# chunk): the whole window encoded once complete, 2.71 s of work a 2.93 s chunk and the text 3.41 s after the
# chunk's last sample (median); in segments of 6 frames 2.98 s of work (each segment call carries the encoders'
# states), falling behind; in two segments split at the chunk's end (the runtime's default: the chunk encoded
# while its lookahead arrives, then the 4 lookahead frames) 2.61 s and 2.56 s: no more work, the text sooner.
ENCODE_AHEAD_FRAMES = 6  # WindowEncoder's default segment
SPEAKER = re.compile(r"Speaker\s+(\d+)\s*:")


def prompt_text(hotwords: str | None = None) -> str:
    """The prompt, hotwords (one comma-separated string) inserted before its final newline (an empty string
    is none, as upstream's `if context_info:`)."""
    return PROMPT[:-1] + f" and extra info: {hotwords}\n" if hotwords else PROMPT


@dataclass(frozen=True)
class StreamingTokens:
    chunk_end: int
    speech_start: int
    speech_end: int
    end_of_text: int

    @classmethod
    def of(cls, tokenizer) -> "StreamingTokens":
        return cls(*special_ids(tokenizer, (CHUNK_END, SPEECH_START, SPEECH_END, END_OF_TEXT),
                                "so it is not an ASR-Streaming model's own tokenizer (the stock Qwen2.5 one has no "
                                "<|text_chunk_end|>, so no chunk would end)"))


@dataclass
class ChunkResult:
    index: int
    start: float  # seconds: the chunk's span (the lookahead belongs to the next chunk)
    end: float
    text: str
    speaker: int | None  # the speaker label in force at the chunk's end (carried from earlier chunks)
    tokens: list[int] = field(default_factory=list)  # greedy picks, the stop token included
    margins: list[float] = field(default_factory=list)  # top-2 logit margin of each pick
    stop_reason: str = ""  # "chunk_end", "end_of_text", "max_tokens" or "repetition" (the guard stopped a loop)
    logits: list[np.ndarray] = field(default_factory=list)  # each pick's logits, when kept (verify)
    seconds: float = 0.0  # wall time from the complete window to the chunk's text
    ready_at: float = 0.0  # time.monotonic() when the text was ready
    repetition: Repetition = field(default_factory=Repetition)  # the repetition guard's loops in this chunk

    def message(self) -> dict:
        """The chunk as upstream's socket sends it ({"chunk", "text"}), with its span and speaker: the server's
        messages and `transcribe --stream --format json`'s lines; "repetition" too where the guard found a loop."""
        message = {"chunk": self.index, "text": self.text, "start": round(self.start, 4), "end": round(self.end, 4),
                   "speaker": self.speaker}
        if self.repetition.detected:
            message["repetition"] = self.repetition.as_dict()
        return message


def split_windows(samples: np.ndarray, geometry: StreamingGeometry) -> Iterator[np.ndarray]:
    """Window k = samples [k·chunk, k·chunk + window) while k·chunk < N; the last one zero-padded."""
    for start in range(0, len(samples), geometry.chunk_samples):
        yield pad_window(samples[start:start + geometry.window_samples], geometry)


def pad_window(window: np.ndarray, geometry: StreamingGeometry) -> np.ndarray:
    if len(window) > geometry.window_samples:
        raise VibeVoiceError(f"a window holds at most {geometry.window_samples} samples, got {len(window)}")
    padded = np.zeros(geometry.window_samples, np.float32)
    padded[:len(window)] = window
    return padded


class StreamingSession:
    """One transcription session: `chunk(window)` for each window in order, each returning its ChunkResult.
    `repetition_guard`: a loop in a chunk's tokens is cut back and decoding resumed (generation.repetition), each
    chunk guarded on its own (a chunk's text follows new audio)."""

    def __init__(self, backend: AsrBackend, tokenizer, geometry: StreamingGeometry, hotwords: str | None = None,
                 rng: np.random.Generator | None = None, max_tokens_per_chunk: int = MAX_TOKENS_PER_CHUNK,
                 max_positions: int | None = None, keep_logits: bool = False, repetition_guard: bool = False):
        check("max_tokens_per_chunk", max_tokens_per_chunk)
        self.backend, self.tokenizer, self.geometry = backend, tokenizer, geometry
        self.ids, self.rng, self.limit = StreamingTokens.of(tokenizer), rng, max_tokens_per_chunk
        self.max_positions, self.keep_logits, self.repetition_guard = max_positions, keep_logits, repetition_guard
        self.stream = backend.lm_stream()
        self.stream.step(backend.embed(tokenizer.encode(prompt_text(hotwords), add_special_tokens=False).ids))
        self.chunks, self.speaker = 0, None
        self.pending = backend.embed([self.ids.chunk_end])[:, :0]  # the last chunk's <|text_chunk_end|>, fed with the next window

    def check_room(self) -> None:
        """Refuse a chunk that could pass the model's positions (about 16 a second of audio; upstream grows its
        cache without bound and fails opaquely), before any work on it."""
        needed = self.stream.position + self.geometry.window_frames + 2 + self.limit + 1
        if self.max_positions is not None and needed > self.max_positions:
            minutes = self.chunks * self.geometry.chunk_samples / self.geometry.sample_rate / 60
            raise VibeVoiceError(f"the session would outgrow the model's {self.max_positions} positions after "
                                 f"{self.chunks} chunks ({minutes:.1f} min of audio); start a new session")

    def chunk(self, window: np.ndarray, means: tuple[np.ndarray, np.ndarray] | None = None) -> ChunkResult:
        """`means`: the window's encoder means when they were computed as it arrived (WindowEncoder)."""
        ids, backend, started = self.ids, self.backend, time.perf_counter()
        self.check_room()
        features = window_features(backend, window, self.geometry, self.rng, means)
        hidden = self.stream.step(np.concatenate([self.pending, window_embeds(backend, ids, features)], axis=1))[:, -1]
        seconds = self.geometry.chunk_samples / self.geometry.sample_rate
        result = ChunkResult(self.chunks, self.chunks * seconds, (self.chunks + 1) * seconds, "", None)
        guard, first = RepetitionGuard() if self.repetition_guard else None, self.stream.position
        if guard is not None:
            result.repetition = guard.report
        while True:
            logits = backend.logits(hidden)
            index = len(result.tokens)
            token, margin = greedy_pick(logits, f"chunk {self.chunks}", guard.banned(index) if guard else None)
            if self.keep_logits:
                result.logits.append(np.asarray(logits, np.float32))
            result.tokens.append(token)
            result.margins.append(margin)
            if token in (ids.chunk_end, ids.end_of_text):
                result.stop_reason = "chunk_end" if token == ids.chunk_end else "end_of_text"
                break
            loop = guard.check(result.tokens) if guard else None
            if loop is not None:
                cut_back(result, loop.keep)
                hidden = resume(backend, self.stream, first, result.tokens)  # the kept tokens, and only they, cached
                if guard.stopped:
                    result.stop_reason = "repetition"
                    break
                continue
            hidden = self.stream.step(backend.embed([token]))[:, -1]  # every text token enters the cache (12.7.5)
            if len(result.tokens) == self.limit:
                result.stop_reason = "max_tokens"
                break
        self.pending = backend.embed([ids.chunk_end])  # always, whatever ended the chunk: the trained layout
        result.text = clean_text(self.tokenizer.decode(text_tokens(result, ids), skip_special_tokens=True))
        labels = SPEAKER.findall(result.text)
        self.speaker = int(labels[-1]) if labels else self.speaker
        result.speaker, self.chunks = self.speaker, self.chunks + 1
        result.seconds, result.ready_at = time.perf_counter() - started, time.monotonic()
        return result


def window_features(backend: AsrBackend, window: np.ndarray, geometry: StreamingGeometry,
                    rng: np.random.Generator | None, means: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """The window encoded cold: [1, frames, H], the connectors' sum of both encoders' outputs (of `means`, the
    encoders' outputs, where they are already known)."""
    acoustic, semantic = means or backend.encode(pad_window(np.asarray(window, np.float32), geometry)[None, None])
    return backend.connect(acoustic_sample(acoustic, backend.acoustic_std, rng), semantic)


class WindowEncoder:
    """One window's encoder means computed while its samples arrive: its whole frames through both encoders'
    streaming graphs, their conv states cold at the window's start. The encoders are causal, so this equals
    encoding the complete window at once (verify gates it), and a window's text then waits only for its last
    frames to be encoded, not all 26."""

    def __init__(self, backend: AsrBackend, geometry: StreamingGeometry, segment_frames: int = ENCODE_AHEAD_FRAMES):
        self.step, self.geometry, self.encoded, self.parts = backend.encoder_stream(), geometry, 0, []
        self.segment = segment_frames * geometry.hop

    def advance(self, samples: np.ndarray, last: bool = False) -> None:
        """`samples`: the window's samples so far; the whole segments among them not yet encoded are (`last`:
        the rest too). Segments lie on a grid from the window's start, so the means are
        the same however the audio was cut into pieces (8-bit graphs round a call's activations together)."""
        size = self.segment
        available = min(len(samples), self.geometry.window_samples)
        ready = available if last else available // size * size
        for start in range(self.encoded, ready, size):
            self.parts.append(self.step(np.asarray(samples[start:min(start + size, ready)], np.float32)[None, None]))
        self.encoded = max(self.encoded, ready)

    def means(self, window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The complete window's means (zero-padded to a whole window, as the loop pads its last)."""
        self.advance(pad_window(window, self.geometry), last=True)
        return tuple(np.concatenate(parts, axis=1) for parts in zip(*self.parts))


def window_embeds(backend: AsrBackend, ids: StreamingTokens, features: np.ndarray) -> np.ndarray:
    """What a window appends to the cache: speech-start, its features, speech-end."""
    return np.concatenate([backend.embed([ids.speech_start]), features, backend.embed([ids.speech_end])], axis=1)


def text_tokens(chunk: ChunkResult, ids: StreamingTokens) -> list[int]:
    """A chunk's picks but a stop token: its text, and what it fed back into the cache."""
    return [t for t in chunk.tokens if t not in (ids.chunk_end, ids.end_of_text)]


def forced_logits(backend: AsrBackend, tokenizer, geometry: StreamingGeometry, windows: list[np.ndarray],
                  chunks: list[ChunkResult], hotwords: str | None = None) -> list[np.ndarray]:
    """Per chunk, [picks, V]: the logits each of `chunks`' picks was made from, with the whole session (the
    prompt, each window's encoder means and the chunks' own fed-back tokens) in one pass of `backend`'s LM
    (teacher forcing: a verifier needs one pass of the reference instead of one per token)."""
    ids = StreamingTokens.of(tokenizer)
    parts = [backend.embed(tokenizer.encode(prompt_text(hotwords), add_special_tokens=False).ids)]
    decisions, length = [], parts[0].shape[1]
    for window, chunk in zip(windows, chunks):
        parts.append(window_embeds(backend, ids, window_features(backend, window, geometry, None)))
        fed = text_tokens(chunk, ids) + [ids.chunk_end]  # then <|text_chunk_end|>, fed with the next window
        parts.append(backend.embed(fed))
        length += parts[-2].shape[1]
        decisions.append(range(length - 1, length - 1 + len(chunk.tokens)))  # speech-end's, then each fed token's
        length += len(fed)
    hidden = backend.lm_stream().step(np.concatenate(parts, axis=1))[0]
    return [np.stack([backend.logits(hidden[i][None]) for i in rows]) for rows in decisions]


def chunk_segments(chunk: ChunkResult, speaker: int | None) -> list[Segment]:
    """The chunk's text as segments, one per speaker turn in it, the labels taken out: a turn's span is cut from
    the chunk's in proportion to its place in the text (upstream's rule; the model writes no timestamps), and
    text before the first label belongs to `speaker`, the one in force when the chunk began."""
    turns, cursor, text = [], 0, chunk.text
    for label in SPEAKER.finditer(text):
        turns.append((speaker, cursor, label.start()))
        speaker, cursor = int(label.group(1)), label.end()
    turns.append((speaker, cursor, len(text)))
    duration, length = chunk.end - chunk.start, max(len(text), 1)
    return [Segment(round(chunk.start + duration * begin / length, 3), round(chunk.start + duration * end / length, 3),
                    who, text[begin:end].strip())
            for who, begin, end in turns if text[begin:end].strip()]


def clean_text(text: str) -> str:
    for special in RESIDUAL_SPECIALS:
        text = text.replace(special, "")
    return text


class WindowFeeder:
    """Audio arriving in pieces, cut into the windows `split_windows` cuts from the whole: a window as soon as
    the buffer holds one (then a chunk's samples are dropped, the lookahead kept), the rest at `finish`. Each
    comes with its encoder means, computed as its samples arrived in segments of `encode_ahead` frames
    (WindowEncoder), when the feeder has a `backend` to encode with, else None (encoded once complete)."""

    def __init__(self, geometry: StreamingGeometry, backend: AsrBackend | None = None,
                 encode_ahead: int = ENCODE_AHEAD_FRAMES):
        self.geometry, self.backend, self.buffer = geometry, backend, np.zeros(0, np.float32)
        self.encode_ahead = encode_ahead
        self.open: list[WindowEncoder] = []  # the windows begun in the buffer, at offsets 0, chunk, ...

    def feed(self, samples: np.ndarray) -> list[tuple[np.ndarray, tuple | None]]:
        self.buffer = np.concatenate([self.buffer, np.asarray(samples, np.float32).reshape(-1)])
        windows = []
        while len(self.buffer) >= self.geometry.window_samples:
            window = self.buffer[:self.geometry.window_samples].copy()
            windows.append((window, self._means(window)))
            self.buffer = self.buffer[self.geometry.chunk_samples:]
        if self.backend is not None:  # the begun windows' frames so far, after the complete ones' text
            for index, start in enumerate(range(0, len(self.buffer), self.geometry.chunk_samples)):
                self._encoder(index).advance(self.buffer[start:start + self.geometry.window_samples])
        return windows

    def finish(self) -> list[tuple[np.ndarray, tuple | None]]:
        """What is left (the kept lookahead and any partial chunk), windowed and padded; none if nothing came."""
        rest, self.buffer = self.buffer, np.zeros(0, np.float32)
        return [(window, self._means(window)) for window in split_windows(rest, self.geometry)] if len(rest) else []

    def _encoder(self, index: int) -> WindowEncoder:
        while len(self.open) <= index:
            self.open.append(WindowEncoder(self.backend, self.geometry, self.encode_ahead))
        return self.open[index]

    def _means(self, window: np.ndarray) -> tuple | None:
        """The oldest begun window's means (it is `window`), and it is no longer open."""
        if self.backend is None:
            return None
        means = self._encoder(0).means(window)
        self.open.pop(0)
        return means
