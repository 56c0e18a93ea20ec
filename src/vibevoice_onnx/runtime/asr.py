"""VibeVoice-ASR without PyTorch: the bundle's graphs under the shared transcription loop.

    Transcriber(bundle).transcribe("meeting.wav", hotwords="Zorblax")  ->  Transcript(segments, text, raw, tokens)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..audio import SAMPLE_RATE, db_normalize, read_audio
from ..errors import VibeVoiceError
from ..families import family, kinds_that
from ..generation.asr import TranscriptionResult, audio_embeddings, stop_ids, transcribe_tokens
from ..generation.repetition import Repetition, RepetitionGuard
from ..generation.common import LmStream
from ..transcription import Segment, prompt_builder, transcript_parser
from .bundle import Bundle
from .pretrained import FromPretrained
from .batch import BATCH_CAPACITY, MemberBackend, StreamBatch, row_executor
from .lm import KvCache, OnnxLm, StreamingConv

F32 = np.float32
ASR_KINDS = kinds_that(transcribes=True, streams=False)  # whole recordings (ASR-Streaming: runtime.asr_streaming)
MAX_NEW_TOKENS = 32768  # upstream's demo


ENCODERS = ("acoustic_encoder_stream", "semantic_encoder_stream")
# The encoders are causal, so a segment fed in pieces with their conv states carried gives the means of one call
# on it (verify gates it). One call on a 60 s segment held ~5.7 GB of activations per encoder in onnxruntime's
# arena (full-size synthetic int8 bundle, 2 cores: 14.2 GB peak for the two encoders and their 2.8 GB of
# weights); in pieces of 4 s, 3.6 GB, and faster: 0.32 s per second of audio against 0.43 (cache-sized
# activations). In pieces of 1.33 s, at the same speed, half the activations again (one full-size acoustic encoder
# over 12 s, 2 cores: 0.52-0.67 GB grown against 0.31-0.34 in fp32, 8-bit and dynamic int8; scratch timing).
# A whole number of frames, so that only the recording's last piece is padded.
PIECE_FRAMES = 10


class OnnxAsrBackend:
    """Evaluates each ASR component with its ONNX graph; the KV cache is a list of arrays."""

    def __init__(self, bundle: Bundle):
        bundle.require_kind(*kinds_that(transcribes=True))  # the same graphs; the streaming loop drives them its way
        self.bundle = bundle
        (self.embed_table,) = bundle.host_tensors("embed_tokens")
        self.acoustic_std = bundle.dims.acoustic_encoder.sample_std
        self.lm = OnnxLm(bundle, "lm")
        self.sessions = {name: bundle.session(name) for name in ("lm_head", "audio_connector")}
        missing = [n for n in ENCODERS if n not in bundle.info.graphs]
        if missing:
            raise VibeVoiceError(f"{bundle.path}: has no {missing[0]} graph (an ASR bundle of an earlier version); "
                                 "rebuild it with this version")
        self.encoders = [StreamingConv(bundle, name) for name in ENCODERS]

    def embed(self, ids):
        return self.embed_table[np.asarray(ids)].astype(F32)[None]

    def encode(self, audio):
        """One pass: the whole recording as one segment from zero states (upstream's non-streaming padding)."""
        return self.encoder_stream()(audio)

    def encoder_stream(self):
        """Both encoders fed segment after segment with their conv states (audio over 60 s), each segment in
        pieces of PIECE_FRAMES frames."""
        states = [encoder.new_state() for encoder in self.encoders]
        piece = PIECE_FRAMES * self.bundle.dims.acoustic_encoder.hop

        def step(segment):
            outputs = [[] for _ in self.encoders]
            for start in range(0, segment.shape[-1], piece):
                for i, encoder in enumerate(self.encoders):
                    latents, states[i] = encoder.run(segment[..., start:start + piece], states[i])
                    outputs[i].append(latents)
            return tuple(np.concatenate(parts, axis=1) for parts in outputs)

        return step

    def connect(self, acoustic, semantic):
        return self.sessions["audio_connector"].run(None, {"acoustic_latents": acoustic, "semantic_latents": semantic})[0]

    def lm_stream(self, positions: int = 0) -> LmStream:
        """An empty stream whose cache has room for twice `positions` (it doubles from there)."""
        cache = KvCache.planned(self.lm, 1, positions, None, 0)
        return LmStream(self.lm.unbatched, cache, 0, lambda cache, length: cache.truncated(0, length))

    def logits(self, hidden):
        return self.head_logits(hidden)[0]

    def head_logits(self, hidden):
        """[rows, H] -> [rows, V]."""
        return self.sessions["lm_head"].run(None, {"hidden_states": np.ascontiguousarray(hidden, dtype=F32)})[0]


class AsrBatch(StreamBatch):
    """Several transcriptions on one bundle at once (runtime.batch): after each file's own encoders and prefill
    (alone), the greedy steps of all that are decoding are one LM call over rows of one shared cache (a row
    each) and one call of the LM head, so the 7B's weights are read once a step for all of them.

        batch = transcriber.batch(max_streams=4)
        # from several threads: transcriber.transcribe(path, batch=batch)
    """

    def __init__(self, backend: OnnxAsrBackend, max_streams: int):
        super().__init__(backend, backend.lm, max_streams, 1, BATCH_CAPACITY,
                         {"logits": row_executor(backend.head_logits)})


class AsrMember(MemberBackend):
    """A transcription's backend in an AsrBatch."""

    alone_calls = frozenset({"encode", "connect"})

    def encoder_stream(self):
        step = self.base.encoder_stream()
        return lambda segment: self._alone(lambda: step(segment))

    def lm_stream(self, positions: int = 0) -> LmStream:  # the batch's cache: its rows grow together
        (row,) = self.rows
        cache = self.batch.cache
        cache.lengths[row] = 0  # this thread's row: no batch runs while it is here

        def run(embeds, positions, _):
            if embeds.shape[1] > 1:  # the prompt: one row takes many tokens alone
                return self._alone(lambda: self.batch.lm.run(embeds, cache, slice(row, row + 1))), cache
            return self._call("lm_step", ([row], embeds))[:, None], cache

        return LmStream(run, cache, 0, lambda cache, length: cache.truncated(row, length))

    def logits(self, hidden):
        return self._call("logits", np.ascontiguousarray(hidden, dtype=F32))[0]


AsrBatch.member_backend = AsrMember


@dataclass
class Transcript:
    segments: list[Segment]
    text: str  # the generated text without special tokens
    raw: str  # the generated text with its special tokens, exactly as decoded
    tokens: list[int]
    note: str | None  # what was off when parsing (a cut-off array, skipped items)
    audio_seconds: float
    timings: dict = field(default_factory=dict)
    readable: str | None = None  # the text to show where it is not the segments' (ASR-Streaming: the chunks' text)
    repetition: Repetition = field(default_factory=Repetition)  # the repetition guard's loops (ASR-Streaming: all chunks')


class Transcriber(FromPretrained):
    """An ASR bundle opened for transcription (onnxruntime + numpy only)."""

    def __init__(self, bundle: Bundle | str | Path, threads: int | None = None, force: bool = False):
        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle(Path(bundle), threads=threads)
        if family(self.bundle.kind).streams_audio:
            raise VibeVoiceError(f"{self.bundle.path}: is an ASR-Streaming bundle: transcribe it with --stream (the "
                                 "CLI) or StreamingTranscriber (the API); its model is trained on that loop only")
        self.bundle.require_kind(*ASR_KINDS)  # before the admission rule: a TTS bundle is told it is one
        if not force:
            self.bundle.require_usable()
        self.backend = OnnxAsrBackend(self.bundle)
        self.tokenizer = self.bundle.tokenizer
        # JSON segments, or prose (ASR-BitNet)
        self.build_prompt, self.parse = prompt_builder(self.bundle.kind), transcript_parser(self.bundle.kind)
        self.stops = stop_ids(self.tokenizer)

    def within_context(self, prompt, max_new_tokens: int) -> int:
        """`max_new_tokens`, capped at what the model's context leaves after the prompt (see context_room)."""
        room = context_room(len(prompt.ids), len(prompt.audio_positions), self.bundle.dims.lm.max_positions,
                            prompt.seconds)
        return min(max_new_tokens, room)

    def batch(self, max_streams: int = 4) -> AsrBatch:
        """Room for `max_streams` transcriptions whose greedy steps are batched (see AsrBatch)."""
        return AsrBatch(self.backend, max_streams)

    def load(self, audio: str | Path | np.ndarray, sample_rate: int | None = None) -> np.ndarray:
        """Normalised 24 kHz mono samples from a file, or from samples at `sample_rate`."""
        if isinstance(audio, (str, Path)):
            samples, _ = read_audio(Path(audio))
            where = str(audio)
        else:
            samples, where = _resampled(np.asarray(audio, F32), sample_rate), "the audio"
        if samples.size == 0:
            raise VibeVoiceError(f"{where}: holds no audio (zero samples)")
        if not np.any(samples):
            raise VibeVoiceError(f"{where}: is silent, so there is nothing to transcribe")
        return db_normalize(samples)

    def transcribe(self, audio: str | Path | np.ndarray, sample_rate: int | None = None, hotwords: str | None = None,
                   max_new_tokens: int = MAX_NEW_TOKENS, seed: int | None = None, mean_latents: bool = False,
                   progress=None, on_segment=None, on_token=None, batch: AsrBatch | None = None,
                   repetition_guard: bool = True) -> Transcript:
        """`progress(tokens, seconds)` is called after each token, `on_token(token_ids_so_far)` too (for text
        streamed as it decodes; after a repetition loop is cut back, the list is shorter again),
        `on_segment(done, total)` after each 60 s segment of audio over 60 s.
        Without `seed`, the acoustic noise is random. With `batch` (see `batch()`), the greedy steps run batched
        with those of the batch's other transcriptions (call from several threads), to the same tokens.
        `repetition_guard`: a decoding loop is cut back and decoding resumed (generation.repetition)."""
        samples = self.load(audio, sample_rate)
        prompt = self.build_prompt(self.tokenizer, len(samples), hotwords)
        limit = max_new_tokens
        max_new_tokens = self.within_context(prompt, max_new_tokens)  # before any encoding
        started = time.perf_counter()
        rng = None if mean_latents else np.random.default_rng(seed)
        result, encoded = TranscriptionResult(), [started]
        guard = RepetitionGuard() if repetition_guard else None

        def tokens(backend):
            embeddings = audio_embeddings(backend, samples, rng, on_segment)
            encoded[0] = time.perf_counter()
            yield from transcribe_tokens(backend, prompt, embeddings, self.stops, max_new_tokens, result, guard=guard)

        for count, _ in enumerate(tokens(self.backend) if batch is None else batch.frames(tokens), 1):
            if progress is not None:
                progress(count, time.perf_counter() - encoded[0])
            if on_token is not None:
                on_token(result.tokens)
        done, encoded = time.perf_counter(), encoded[0]
        raw = self.tokenizer.decode(result.tokens, skip_special_tokens=False)
        text = self.tokenizer.decode(result.tokens, skip_special_tokens=True)
        try:
            segments, note = self.parse(text)
        except VibeVoiceError as e:
            segments, note = [], str(e)
        if result.stop_reason == "max_new_tokens":
            note = joined(note, f"stopped at the {max_new_tokens}-token limit" if max_new_tokens == limit else
                          f"stopped at the end of the model's context ({self.bundle.dims.lm.max_positions} positions, of "
                          f"which the audio's prompt takes {len(prompt.ids)}): transcribe the recording in shorter parts "
                          "for the rest")
        return Transcript(segments, text, raw, result.tokens, joined(note, result.repetition.describe()),
                          len(samples) / SAMPLE_RATE,
                          {"encode_seconds": encoded - started, "decode_seconds": done - encoded,
                           "tokens_per_second": len(result.tokens) / max(done - encoded, 1e-9)},
                          repetition=result.repetition)


def joined(note: str | None, more: str | None) -> str | None:
    """Two notes in one ('; ' between), either of them None."""
    return "; ".join(part for part in (note, more) if part) or None


def context_room(prompt_tokens: int, audio_tokens: int, max_positions: int, seconds: float) -> int:
    """The transcript tokens the model's context leaves after a prompt, refused with one sentence where it leaves
    none (the longest recording that fits is named)."""
    room = max_positions - prompt_tokens
    if room < 1:
        fits = (max_positions - (prompt_tokens - audio_tokens) - 1) * 3200 / SAMPLE_RATE
        raise VibeVoiceError(f"{seconds / 60:.1f} minutes of audio take {prompt_tokens} of the model's {max_positions} "
                             f"positions, which leaves none for the transcript: transcribe at most {fits / 60:.1f} "
                             "minutes at a time (cut the recording into parts)")
    return room


def _resampled(samples: np.ndarray, rate: int | None) -> np.ndarray:
    if rate is None:
        raise VibeVoiceError("give sample_rate with raw samples")
    if samples.ndim == 2:
        samples = samples.mean(axis=1, dtype=F32)
    if rate == SAMPLE_RATE:
        return np.ascontiguousarray(samples, F32)
    import soxr

    return soxr.resample(samples, rate, SAMPLE_RATE, quality="HQ").astype(F32)
