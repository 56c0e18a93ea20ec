"""The VibeVoice-1.5B generation loop, written once and run on two backends (numpy in, numpy out, no torch).

The PyTorch reference (reference/tts15b.py) and the onnxruntime runtime (runtime/tts15b.py) each supply a
backend; this module owns the algorithm of upstream's original 1.5B `generate` (facts sheet 3.3, 3.4, 4;
batch 1):

* the prompt (script.build_prompt) is embedded; its `<|vision_pad|>` slots take the voice samples: encoded as
  upstream's zero-padded batch encodes them, the σ-VAE noise drawn or not, then "add the bias, then multiply
  by the scale" and the acoustic connector (no semantic term in the prompt);
* each step the LM (28 layers + norm) picks greedily among `<|endoftext|>`, `<|vision_start|>`,
  `<|vision_end|>` and `<|vision_pad|>` with the tied head (ties go to the lowest id, as torch.argmax);
* `<|endoftext|>` ends; `<|vision_end|>` zeroes the decoder's and the semantic encoder's conv states;
  `<|vision_start|>` restarts the negative (CFG) stream, whose next token then sits at position 0;
* `<|vision_pad|>`: the negative stream takes the positive stream's latest input, one latent is sampled
  with CFG on the two last hidden states, decoded (divide by the scale, subtract the bias) into 3200 samples,
  the semantic encoder streams that chunk into one frame, and the next input is acoustic_connector(z) +
  semantic_connector(frame), z being the normalised diffusion output;
* any other token feeds its own embedding back; the run stops after min(max positions − L, 2 L) steps for a
  prompt of L tokens (upstream's max_length_times = 2), or at --max-frames latents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from ..errors import VibeVoiceError
from ..sampling import DpmSolverSchedule, NoiseSource
from ..script import SPEECH_END, SPEECH_PAD, SPEECH_START, Prompt
from ..text import special_ids
from .common import SpeechResult, Steering, decode_latents, emitted_latent, record_conditions, sample_next

EOS = "<|endoftext|>"
MAX_LENGTH_TIMES = 2  # upstream stops after twice the prompt's length in steps


@dataclass(frozen=True)
class TokenIds:
    eos: int
    start: int
    end: int
    pad: int

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "TokenIds":
        return cls(*special_ids(tokenizer, (EOS, SPEECH_START, SPEECH_END, SPEECH_PAD)))

    @property
    def choices(self) -> list[int]:
        """The four tokens the LM may pick, by id: argmax ties then go to the lowest id, as over the full vocab."""
        return sorted((self.eos, self.start, self.end, self.pad))


class GuidedLm(Protocol):
    """The positive and the negative (CFG) stream of the LM; hidden states are [1, H] at the last position."""

    def prefill(self, embeds: np.ndarray) -> np.ndarray: ...  # the whole prompt, positive stream
    def positive(self, embed: np.ndarray) -> np.ndarray: ...  # one step, [1, 1, H]
    def negative(self, embed: np.ndarray) -> np.ndarray: ...  # one step with the positive's latest input
    def restart_negative(self) -> None: ...


class SeparateStreams:
    """Both CFG streams as upstream runs them: separate batch-1 forwards, the negative one restarted with a
    fresh cache (upstream masks its old entries, which attends to the same nothing). A model gives `new_cache`
    and `forward` (PyTorch's LM in the reference; a bundle's LM graph where verify holds the runtime's batched
    streams to this logic)."""

    def __init__(self, lm):
        self.lm = lm
        self.restart_negative()

    def new_cache(self):
        raise NotImplementedError

    def forward(self, embeds: np.ndarray, cache, start: int):
        """The last position's hidden state [1, H], and the cache with `embeds` in it."""
        raise NotImplementedError

    def prefill(self, embeds):
        self.length = embeds.shape[1]
        hidden, self.cache = self.forward(embeds, self.new_cache(), 0)
        return hidden

    def positive(self, embed):
        self.length += 1
        hidden, self.cache = self.forward(embed, self.cache, self.length - 1)
        return hidden

    def negative(self, embed):
        self.negative_length += 1
        hidden, self.negative_cache = self.forward(embed, self.negative_cache, self.negative_length - 1)
        return hidden

    def restart_negative(self):
        self.negative_cache, self.negative_length = self.new_cache(), 0


class Tts15bBackend(Protocol):
    """What the loop needs from an implementation. Arrays are float32 numpy; states are opaque."""

    max_positions: int
    train_steps: int
    voice_std: float  # σ-VAE noise scale std of the acoustic encoder

    def embed(self, ids: list[int]) -> np.ndarray: ...  # [1, S, H]
    def choice_logits(self, hidden: np.ndarray, ids: list[int]) -> np.ndarray: ...  # tied-head logits of `ids`
    def guided_lm(self, planned: int | None = None) -> GuidedLm: ...  # `planned`: steps the run may take, if known
    def velocity(self, noisy: np.ndarray, timesteps: np.ndarray, conditions: np.ndarray) -> np.ndarray: ...
    # velocity(noisy, t) for these conditions [rows, H] at any of these sampler timesteps:
    def head_at(self, conditions: np.ndarray, timesteps: np.ndarray) -> Callable[[np.ndarray, float], np.ndarray]: ...
    def encode_voices(self, audio: np.ndarray) -> np.ndarray: ...  # [n, 1, N] -> means [n, ceil(N/3200), 64]
    def connect_acoustic(self, latents: np.ndarray) -> np.ndarray: ...  # [B, T, 64] -> [B, T, H]
    def connect_semantic(self, features: np.ndarray) -> np.ndarray: ...  # [B, T, 128] -> [B, T, H]
    def scale(self, latents: np.ndarray) -> np.ndarray: ...  # encoder latents -> LM space: (x + bias) * scale
    def unscale(self, latents: np.ndarray) -> np.ndarray: ...  # LM space -> decoder input: x / scale - bias
    def new_decoder_state(self) -> Any: ...
    def decode_frames(self, latents: np.ndarray, state: Any) -> tuple[np.ndarray, Any]: ...  # [1, F, 64] -> [F·3200]
    def new_semantic_state(self) -> Any: ...
    def encode_semantic(self, chunk: np.ndarray, state: Any) -> tuple[np.ndarray, Any]: ...  # [3200] -> [1, 1, 128]


@dataclass
class LongFormResult(SpeechResult):
    """Stop reasons: "eos", "max_steps" or "max_frames"."""

    tokens: list[int] = field(default_factory=list)  # what the loop fed on, one per step
    greedy: list[int] = field(default_factory=list)  # the model's own greedy pick per step (== tokens unless forced)
    logits: list[np.ndarray] = field(default_factory=list)  # the four choices' logits per step, in id order
    # The semantic features fed back after each latent, [128] each, when a list is given (verify).
    features: list[np.ndarray] | None = None


def voice_embeddings(backend: Tts15bBackend, voices: list[np.ndarray], rng: np.random.Generator | None) -> list[np.ndarray]:
    """The prompt embeddings of each voice sample, [frames_i, H].

    Upstream encodes all voices as one batch, each zero-padded to the longest. The encoder is causal, so a
    voice's frames in that batch equal its own encode once zero-padded to its last whole frame (or to the
    longest voice, if that ends sooner): the same numbers, for the cost of its own length. `rng` draws the
    σ-VAE noise as upstream does (one scale per voice, then a normal per value of the padded batch); None
    uses the encoder mean.
    """
    longest = max(len(v) for v in voices)
    counts = [-(-len(v) // 3200) for v in voices]
    latents = []
    for samples, count in zip(voices, counts):
        audio = np.zeros((1, 1, min(count * 3200, longest)), np.float32)
        audio[0, 0, : len(samples)] = samples
        latents.append(backend.encode_voices(audio)[0, :count])
    if rng is not None:
        scales = rng.standard_normal(len(voices)).astype(np.float32) * np.float32(backend.voice_std)
        noise = rng.standard_normal((len(voices), max(counts), latents[0].shape[-1]), dtype=np.float32)
        latents = [z + scale * n[: len(z)] for z, scale, n in zip(latents, scales, noise)]
    return [backend.connect_acoustic(backend.scale(z[None]))[0] for z in latents]


def prompt_embeddings(backend: Tts15bBackend, prompt: Prompt, voices: list[np.ndarray],
                      rng: np.random.Generator | None, slots: np.ndarray | None = None) -> np.ndarray:
    """[1, L, H]: the prompt's token embeddings with the voice slots filled, voice after voice (`slots`: the
    voices' embeddings made once for several prompts of the same voices)."""
    embeds = backend.embed(prompt.ids).copy()
    if slots is None:
        slots = np.concatenate(voice_embeddings(backend, voices, rng)) if voices else np.zeros((0, embeds.shape[2]), np.float32)
    if len(slots) != len(prompt.voice_positions):
        raise VibeVoiceError(f"the prompt has {len(prompt.voice_positions)} voice slots but the voices give {len(slots)} frames")
    embeds[0, prompt.voice_positions] = slots
    return embeds


Choose = Callable[[int, int], int]  # (step, greedy token) -> the token to feed on


def planned_steps(max_steps: int, max_frames: int | None, frames_done: int) -> int | None:
    """The steps a run bounded by `max_frames` may take: one per frame and a few turns' start and end tokens
    (a plan: a run that passes it still runs on); None where only EOS ends the run."""
    if max_frames is None:
        return None
    frames = max_frames - frames_done
    return min(max_steps, frames + frames // 8 + 16)


def long_form_frames(
    backend: Tts15bBackend,
    prompt_embeds: np.ndarray,
    ids: TokenIds,
    noise: NoiseSource,
    cfg_scale: float,
    steps: int,
    max_frames: int | None,
    result: LongFormResult,
    choose: Choose | None = None,
    max_steps: int | None = None,
    steering: Steering | None = None,
    upstream_cap: bool = True,
) -> Iterator[np.ndarray]:
    """Yield each latent's audio chunk as soon as it is decoded, filling `result` as it goes; `choose`
    overrides the token picks (verify forces a schedule), `max_steps` caps the steps below upstream's cap
    (`upstream_cap=False` lifts the cap of twice the prompt's length, so `bench` runs any number of latents
    on a short prompt; the model's positions still bound it); `steering` is verify's hook (Steering): one with
    tokens (a Teacher) decides every token, for its length, and each kind may change the fed-back latents
    and the logits each step decides on."""
    if steering is not None and steering.tokens is not None:
        tokens = steering.tokens
        choose, max_steps = (lambda step, greedy: tokens[step]), len(tokens)
    length = prompt_embeds.shape[1]
    limit = backend.max_positions - length
    if upstream_cap:
        limit = min(limit, MAX_LENGTH_TIMES * length)
    max_steps = limit if max_steps is None else min(max_steps, limit)
    if limit < 1:
        raise VibeVoiceError(f"the prompt is {length} tokens, which leaves no room below the model's "
                             f"{backend.max_positions} positions; shorten the script or the voice samples")
    schedule = DpmSolverSchedule.create(steps, backend.train_steps)
    choices = ids.choices
    lm = backend.guided_lm(planned_steps(max_steps, max_frames, result.frames))
    hidden, last_input = lm.prefill(prompt_embeds), prompt_embeds[:, -1:]
    decoder_state, semantic_state = backend.new_decoder_state(), backend.new_semantic_state()
    for step in range(max_steps):
        if step:
            hidden = lm.positive(last_input)
        logits = backend.choice_logits(hidden, choices)
        if steering is not None:
            logits = steering.choice_logits(logits, step)
        greedy = choices[int(np.argmax(logits))]
        token = choose(step, greedy) if choose else greedy
        result.tokens.append(token)
        result.greedy.append(greedy)
        result.logits.append(np.asarray(logits, np.float32))
        if token == ids.eos:
            result.stop_reason = "eos"
            return
        if token == ids.end:
            decoder_state, semantic_state = backend.new_decoder_state(), backend.new_semantic_state()
        if token == ids.start:
            lm.restart_negative()
        if token != ids.pad:
            last_input = backend.embed([token])
            continue
        negative = lm.negative(last_input)
        record_conditions(result, hidden, negative)
        z = emitted_latent(sample_next(backend, schedule, noise, hidden, negative, cfg_scale, result.frames), result, steering)
        (chunk,), decoder_state = decode_latents(backend, [z], decoder_state, result.frames)
        result.add(z, chunk)
        yield chunk
        if result.reached(max_frames):
            return
        features, semantic_state = backend.encode_semantic(chunk, semantic_state)
        if steering is not None:
            features = steering.features(features, result)
        if result.features is not None:
            result.features.append(np.asarray(features, np.float32).reshape(-1))
        last_input = backend.connect_acoustic(z[None, None]) + backend.connect_semantic(features)
    result.stop_reason = "max_steps"


def segmented_frames(backend: Tts15bBackend, prompts: list[Prompt], voices: list[np.ndarray],
                     rng: np.random.Generator | None, ids: TokenIds, noise: NoiseSource, cfg_scale: float, steps: int,
                     max_frames: int | None, result: LongFormResult) -> Iterator[np.ndarray]:
    """A script longer than the model's context, as consecutive prompts of its lines with the same voices (their
    embeddings made once, so every segment hears the same voices): each runs as a whole script would, until EOS
    or its step cap, and the next one carries the script on; the noise and frame count run across them."""
    slots = np.concatenate(voice_embeddings(backend, voices, rng)) if voices else None
    for prompt in prompts:
        if len(prompts) > 1:
            result.segments.append(result.frames)
        embeds = prompt_embeddings(backend, prompt, voices, None, slots)
        yield from long_form_frames(backend, embeds, ids, noise, cfg_scale, steps, max_frames, result)
        if result.stop_reason == "max_frames":
            return
