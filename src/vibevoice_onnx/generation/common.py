"""Pieces every generation loop shares: a language-model stream, one latent sampled and decoded, and the\nper-frame finiteness check."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import VibeVoiceError
from ..sampling import DpmSolverSchedule, NoiseSource, sample_latent


@dataclass
class SpeechResult:
    """What every loop fills as it runs: the latents, their audio, and why it stopped."""

    latents: list[np.ndarray] = field(default_factory=list)  # normalised diffusion outputs z, [64] each
    chunks: list[np.ndarray] = field(default_factory=list)  # decoded audio per latent, [3200] each
    stop_reason: str = ""
    # Teacher forcing (verify): the latent the backend sampled at each frame, while `latents` holds the
    # teacher's, which were decoded and fed back instead.
    sampled: list[np.ndarray] = field(default_factory=list)
    # The CFG conditions each latent was sampled from, [2, H] (positive, negative), when a list is given.
    conditions: list[np.ndarray] | None = None
    # False: the audio is handed out and not kept (a long stream's memory stays bounded); `samples` still counts.
    keep_audio: bool = True
    samples: int = 0
    # The first frame of each segment, when a text longer than the model's context is spoken in several.
    segments: list[int] = field(default_factory=list)

    @property
    def frames(self) -> int:
        return len(self.latents)

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, dtype=np.float32)

    def add(self, z: np.ndarray, chunk: np.ndarray) -> None:
        self.latents.append(z)
        self.keep([chunk])

    def keep(self, chunks: list[np.ndarray]) -> None:
        self.samples += sum(len(c) for c in chunks)
        if self.keep_audio:
            self.chunks += chunks

    def reached(self, max_frames: int | None) -> bool:
        """True (and the stop recorded) once `max_frames` latents are out."""
        if max_frames is not None and self.frames >= max_frames:
            self.stop_reason = "max_frames"
        return self.stop_reason == "max_frames"


class LmStream:
    """One language-model stream: its KV cache and its next position.

    `run(embeds, positions, cache) -> (hidden, cache)` evaluates the model; positions continue after the
    cached prompt, consecutively (facts sheet 2.3 bookkeeping). `truncate(cache, length) -> cache` keeps the
    cache's first `length` positions (`rewind`: the ASR repetition guard's), where the backend can.
    """

    def __init__(self, run: Callable, cache: Any, length: int, truncate: Callable | None = None):
        self.run, self.cache, self.position, self.truncate = run, cache, length, truncate

    def rewind(self, position: int) -> None:
        """Take back every position from `position` on: the next step is fed there."""
        if self.truncate is None:
            raise VibeVoiceError("this language-model stream cannot take positions back")
        if not 0 <= position <= self.position:
            raise VibeVoiceError(f"cannot rewind a stream at position {self.position} to {position}")
        self.cache, self.position = self.truncate(self.cache, position), position

    def step(self, embeds: np.ndarray) -> np.ndarray:
        count = embeds.shape[1]
        positions = np.arange(self.position, self.position + count, dtype=np.int64)[None]
        hidden, self.cache = self.run(embeds, positions, self.cache)
        self.position += count
        return hidden


class Steering:
    """A hook verify puts into a loop (a plain run has none): what it changes at each frame. The plain form
    changes nothing; teacher forcing (Teacher) and verify's calibration runs (verify.calibration) are its kinds.
    `frames`: the run's length where the steering fixes it (EOS is then recorded, not acted on); `tokens`: the
    tokens fed at each step where it decides them (1.5B)."""

    frames: int | None = None
    tokens: list[int] | None = None

    def latent(self, own: np.ndarray, result: SpeechResult) -> np.ndarray:
        """The latent decoded and fed back in place of the one the backend sampled."""
        return own

    def features(self, own: np.ndarray, result: SpeechResult) -> np.ndarray:
        """The semantic features of the latest latent's audio fed back in place of the backend's (1.5B, Large)."""
        return own

    def eos_logit(self, logit: float, frame: int) -> float:
        return logit

    def choice_logits(self, logits: np.ndarray, step: int) -> np.ndarray:
        return logits


class Teacher(Steering):
    """A reference trajectory to run a loop along (teacher forcing): at every frame the backend samples its own
    latent from its own conditions, then the teacher's latent is decoded and fed back in its place, so every
    frame compares one step of the backend's error instead of errors compounded through the feedback."""

    def __init__(self, latents: list[np.ndarray], tokens: list[int] | None = None):
        self.latents, self.tokens = list(latents), tokens
        self.frames = len(self.latents)

    def latent(self, own: np.ndarray, result: SpeechResult) -> np.ndarray:
        frame = len(result.latents)
        if frame >= len(self.latents):
            raise VibeVoiceError(f"teacher forcing ran past the teacher's {len(self.latents)} latents")
        result.sampled.append(own)
        return np.asarray(self.latents[frame], np.float32)


def emitted_latent(own: np.ndarray, result: SpeechResult, steering: Steering | None) -> np.ndarray:
    """The latent a loop decodes and feeds back: its own, or the one its steering gives."""
    return own if steering is None else steering.latent(own, result)


def record_conditions(result: SpeechResult, positive: np.ndarray, negative: np.ndarray) -> None:
    if result.conditions is not None:
        result.conditions.append(np.concatenate([positive, negative]).astype(np.float32))


def require_finite(array: np.ndarray, what: str, where: str) -> None:
    """Stop with a sentence naming `where` (e.g. "frame 3") if `array` holds NaN or infinity."""
    if not np.isfinite(array).all():
        raise VibeVoiceError(
            f"{where}: the {what} holds NaN or infinity, so it was not used or written "
            "(the model or its options produce invalid values; `vibevoice-onnx verify` checks the bundle)"
        )


def whole_head_at(velocity: Callable, conditions: np.ndarray) -> Callable[[np.ndarray, float], np.ndarray]:
    """A backend's `head_at` when it evaluates the whole head at every step (the PyTorch reference)."""
    return lambda noisy, t: velocity(noisy, np.full(len(noisy), t, np.float32), conditions)


def sample_next(backend, schedule: DpmSolverSchedule, noise: NoiseSource, positive: np.ndarray, negative: np.ndarray,
                cfg_scale: float, frame: int) -> np.ndarray:
    """Sample latent `frame` with CFG on the (positive, negative) conditions [1, H]: the normalised z [64]."""
    velocity = backend.head_at(np.concatenate([positive, negative]), schedule.timesteps.astype(np.float32))

    def guided_velocity(x: np.ndarray, t: float):
        v = velocity(np.stack([x, x]), t)
        return v[0], v[1]

    z = sample_latent(schedule, noise(frame), guided_velocity, cfg_scale)
    require_finite(z, "sampled latent", f"frame {frame}")
    return z


def decode_latents(backend, latents: list[np.ndarray], state, first_frame: int) -> tuple[list[np.ndarray], object]:
    """Stream-decode consecutive latents in one call (the decoder's weights are read once): a chunk per latent."""
    audio, state = backend.decode_frames(backend.unscale(np.stack(latents)[None]), state)
    where = f"frame {first_frame}" if len(latents) == 1 else f"frames {first_frame}-{first_frame + len(latents) - 1}"
    require_finite(audio, "decoded audio", where)
    return np.split(audio, len(latents)), state
