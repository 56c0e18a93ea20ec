"""VibeVoice-ASR's transcription loop (facts 5.3-5.4), written once and run on both backends.

The audio (normalised 24 kHz samples) goes through the acoustic and semantic encoders in one pass with
upstream's non-streaming padding, or, over 60 s, in upstream's 60 s segments with the encoders' conv states
carried from one to the next (the last padded as upstream pads its final segment); a backend may feed a segment
in smaller pieces with its states carried (the ONNX one does, to bound its activations: the encoders are causal,
so that is the same computation). The acoustic means get upstream's σ-VAE noise (one N(0, std²) scale per item
times unit noise) unless the caller asks for the means; the connectors' sum fills the prompt's placeholders;
the prefill (in calls of PREFILL_CHUNK tokens); then greedy tokens with the KV cache until `<|endoftext|>` or
`<|im_end|>` or the token limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import numpy as np

from ..errors import VibeVoiceError
from ..transcription import SAMPLE_RATE, STOP_TOKENS, AsrPrompt
from .common import LmStream
from .repetition import Repetition, RepetitionGuard

SINGLE_PASS_SAMPLES = 60 * SAMPLE_RATE  # upstream encodes up to 60 s in one pass, longer audio in segments
# Prompt tokens per LM call of the prefill: a call's activations grow with its tokens (tiny ASR bundle, a 32,000-token
# prompt: +164 MB in one call, +13 MB in calls of 512, the same hidden state), and an hour of audio is a 27,000-token
# prompt; each call attends to what came before, so the work is the same.
PREFILL_CHUNK = 512


class AsrBackend(Protocol):
    acoustic_std: float  # σ-VAE noise scale std of the acoustic encoder

    def embed(self, ids: list[int]) -> np.ndarray: ...  # [1, S, H]
    def encode(self, audio: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...  # [1, 1, N] -> [1, T, 64], [1, T, 128]
    def encoder_stream(self) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]: ...  # the same, per segment
    def connect(self, acoustic: np.ndarray, semantic: np.ndarray) -> np.ndarray: ...  # -> [1, T, H]
    def lm_stream(self, positions: int = 0) -> LmStream: ...  # an empty stream, room made for `positions` where it can
    def logits(self, hidden: np.ndarray) -> np.ndarray: ...  # [1, H] -> [V]


@dataclass
class TranscriptionResult:
    tokens: list[int] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)  # top-2 logit margin of each greedy pick
    logits: list[np.ndarray] = field(default_factory=list)  # every step's logits, when kept (verify)
    stop_reason: str = ""  # "eos", "max_new_tokens" or "repetition" (the guard stopped a loop it could not leave)
    repetition: Repetition = field(default_factory=Repetition)  # what the repetition guard found and did


def stop_ids(tokenizer) -> set[int]:
    return {tokenizer.token_to_id(token) for token in STOP_TOKENS} - {None}


def encoder_means(backend: AsrBackend, samples: np.ndarray, segment: int = SINGLE_PASS_SAMPLES,
                  on_segment: Callable[[int, int], None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The acoustic and semantic means [1, T, C] of the whole recording: one pass up to `segment` samples,
    else segment by segment through the streaming encoders (`on_segment(done, total)` after each)."""
    audio = np.asarray(samples, np.float32)[None, None]
    if audio.shape[-1] <= segment:
        return backend.encode(audio)
    step, starts = backend.encoder_stream(), range(0, audio.shape[-1], segment)
    parts = []
    for done, start in enumerate(starts, 1):
        parts.append(step(audio[..., start:start + segment]))
        if on_segment is not None:
            on_segment(done, len(starts))
    return tuple(np.concatenate(means, axis=1) for means in zip(*parts))


def audio_embeddings(backend: AsrBackend, samples: np.ndarray, rng: np.random.Generator | None,
                     on_segment: Callable[[int, int], None] | None = None) -> np.ndarray:
    """[T, H] for T = ceil(N / 3200): what fills the prompt's placeholders. `rng` None: the encoder means."""
    acoustic, semantic = encoder_means(backend, samples, on_segment=on_segment)
    return backend.connect(acoustic_sample(acoustic, backend.acoustic_std, rng), semantic)[0]


def acoustic_sample(means: np.ndarray, std: float, rng: np.random.Generator | None) -> np.ndarray:
    """Upstream's σ-VAE sample of the acoustic means: one N(0, std²) scale per item times unit noise; the means
    themselves without `rng`."""
    if rng is None:
        return means
    scale = np.float32(rng.standard_normal() * std)
    return means + scale * rng.standard_normal(means.shape, dtype=np.float32)


def greedy_pick(logits: np.ndarray, where: str, banned: set[int] | None = None) -> tuple[int, float]:
    """The argmax token and its top-2 logit margin, none of `banned` (the repetition guard's) picked; logits
    holding NaN or infinity stop with a sentence."""
    if not np.all(np.isfinite(logits)):
        raise VibeVoiceError(f"{where}: the language model's logits hold NaN or infinity")
    if banned:
        logits = np.array(logits, copy=True)
        logits[sorted(banned)] = -np.inf
    top2 = np.partition(logits, -2)[-2:]
    return int(np.argmax(logits)), float(top2[1] - top2[0])


def transcribe_tokens(backend: AsrBackend, prompt: AsrPrompt, audio: np.ndarray, stops: set[int],
                      max_new_tokens: int, result: TranscriptionResult, keep_logits: bool = False,
                      guard: RepetitionGuard | None = None) -> Iterator[int]:
    """Yield each greedy token as it is picked (the stop token included), filling `result`. With `guard`, a
    repetition loop is cut back and decoding resumed (generation.repetition): the tokens after the cut,
    already yielded, are taken out of `result` again."""
    if max_new_tokens < 1:
        raise VibeVoiceError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if len(audio) != len(prompt.audio_positions):
        raise VibeVoiceError(f"the prompt has {len(prompt.audio_positions)} audio slots but the audio gives {len(audio)}")
    embeds = backend.embed(prompt.ids).copy()
    embeds[0, prompt.audio_positions] = audio
    stream = backend.lm_stream(len(prompt.ids))  # an hour's prompt is 27,000 positions: no doubling in its prefill
    hidden = prefill(stream, embeds)
    first = stream.position  # where the first generated token is fed
    if guard is not None:
        result.repetition = guard.report
    while len(result.tokens) < max_new_tokens:
        logits = backend.logits(hidden)
        index = len(result.tokens)
        token, margin = greedy_pick(logits, f"token {index}", guard.banned(index) if guard else None)
        result.tokens.append(token)
        result.margins.append(margin)
        if keep_logits:
            result.logits.append(np.asarray(logits, np.float32))
        yield token
        if token in stops:
            result.stop_reason = "eos"
            return
        loop = guard.check(result.tokens) if guard else None
        if loop is not None:
            cut_back(result, loop.keep)
            if guard.stopped:
                result.stop_reason = "repetition"
                return
            hidden = resume(backend, stream, first, result.tokens)
            continue
        hidden = stream.step(backend.embed([token]))[:, -1]
    result.stop_reason = "max_new_tokens"


def prefill(stream: LmStream, embeds: np.ndarray, chunk: int = PREFILL_CHUNK) -> np.ndarray:
    """Feed the prompt's embeddings [1, S, H] in calls of `chunk` tokens: the last position's hidden [1, H]."""
    for start in range(0, embeds.shape[1], chunk):
        hidden = stream.step(embeds[:, start:start + chunk])
    return hidden[:, -1]


def cut_back(result, keep: int) -> None:
    """`result` (a TranscriptionResult or a ChunkResult) with its first `keep` picks only."""
    del result.tokens[keep:], result.margins[keep:], result.logits[keep:]


def resume(backend: AsrBackend, stream: LmStream, first: int, tokens: list[int]) -> np.ndarray:
    """The hidden state after `tokens` (the picks kept, at least one; the first fed at position `first`): the
    cache rewound to before the last of them, which is fed again."""
    stream.rewind(first + len(tokens) - 1)
    return stream.step(backend.embed(tokens[-1:]))[:, -1]


def forced_logits(backend: AsrBackend, prompt: AsrPrompt, audio: np.ndarray, tokens: list[int]) -> np.ndarray:
    """[len(tokens), V]: the logits each token was picked from, with the prompt and the earlier tokens fed in
    one pass (teacher forcing). Greedy decoding on this backend gives `tokens` exactly when each row's
    argmax is its token; a verifier needs one pass of the model instead of one per token."""
    embeds = backend.embed(prompt.ids).copy()
    embeds[0, prompt.audio_positions] = audio
    if len(tokens) > 1:
        embeds = np.concatenate([embeds, backend.embed(tokens[:-1])], axis=1)
    hidden = backend.lm_stream().step(embeds)[0, -len(tokens):]
    return np.stack([backend.logits(row[None]) for row in hidden])


def greedy_agreement(tokens: list[int], logits: np.ndarray) -> int:
    """How many of `tokens` a greedy decoder with these forced logits (see forced_logits) picks too, before
    the first it would not."""
    picks = logits.argmax(axis=1)
    return next((i for i, (token, pick) in enumerate(zip(tokens, picks)) if token != pick), len(tokens))


def run_transcription(backend: AsrBackend, prompt: AsrPrompt, samples: np.ndarray, stops: set[int],
                      max_new_tokens: int, rng: np.random.Generator | None, keep_logits: bool = False,
                      repetition_guard: bool = False) -> TranscriptionResult:
    result = TranscriptionResult()
    guard = RepetitionGuard() if repetition_guard else None
    for _ in transcribe_tokens(backend, prompt, audio_embeddings(backend, samples, rng), stops, max_new_tokens, result,
                               keep_logits, guard):
        pass
    return result

