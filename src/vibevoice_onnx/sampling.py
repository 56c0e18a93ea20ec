"""Diffusion sampling shared by the PyTorch reference and the torch-free runtime (numpy only).

DPM-Solver++ exactly as upstream constructs it (facts sheet 4.1): 1000 training steps, cosine ("Glide
squaredcos_cap_v2") betas, v-prediction, order 2 with the midpoint rule, first order on the first and on the
final step, final sigma zero, linspace timesteps, history reset for every latent. The arithmetic is fp32 as
on upstream's CPU path. Classifier-free guidance runs the head on one noise sample duplicated (trap 8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import VibeVoiceError

F32 = np.float32


def cosine_betas(train_steps: int = 1000, max_beta: float = 0.999) -> np.ndarray:
    def alpha_bar(t: float) -> float:
        return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

    betas = [min(1 - alpha_bar((i + 1) / train_steps) / alpha_bar(i / train_steps), max_beta) for i in range(train_steps)]
    return np.asarray(betas, dtype=F32)


def rounded(function, value) -> np.float32:
    """`function` (log or exp) of an fp32 scalar in double, rounded once to fp32: the correctly rounded result, on
    every CPU. numpy's float32 log and exp are SIMD approximations (an ulp off on some inputs, and which inputs
    depends on the instruction set), and JavaScript's loop rounds Math.log and Math.exp this way (web/static)."""
    return F32(function(np.float64(value)))


@dataclass(frozen=True)
class DpmSolverSchedule:
    """Timesteps and per-step constants of an N-step DPM-Solver++(2M) run."""

    timesteps: np.ndarray  # int64 [N], descending
    sigmas: np.ndarray  # fp32 [N+1], last is 0

    @classmethod
    def create(cls, steps: int, train_steps: int = 1000, beta_schedule: str = "cosine") -> "DpmSolverSchedule":
        if beta_schedule != "cosine":
            raise VibeVoiceError(f"beta schedule '{beta_schedule}' is not supported (VibeVoice uses 'cosine')")
        if not 1 <= steps < train_steps:
            raise VibeVoiceError(f"diffusion steps must be from 1 to {train_steps - 1}, got {steps}")
        # torch's CPU cumprod accumulates fp32 in double; matching it matters near t=0 where 1-ᾱ is tiny.
        alphas_cumprod = np.cumprod((F32(1.0) - cosine_betas(train_steps)).astype(np.float64)).astype(F32)
        sigma_table = ((F32(1.0) - alphas_cumprod) / alphas_cumprod) ** F32(0.5)
        timesteps = np.linspace(0, train_steps - 1, steps + 1).round()[::-1][:-1].copy().astype(np.int64)
        sigmas = np.interp(timesteps, np.arange(train_steps), sigma_table)
        return cls(timesteps, np.concatenate([sigmas, [0.0]]).astype(F32))

    @property
    def steps(self) -> int:
        return len(self.timesteps)

    def alpha_sigma(self, k: int) -> tuple[np.float32, np.float32]:
        """(α, σ̂) of sigma k: α = 1/sqrt(σ²+1), σ̂ = σ·α."""
        sigma = self.sigmas[k]
        alpha = F32(1.0) / np.sqrt(sigma * sigma + F32(1.0))
        return alpha, sigma * alpha

    def lam(self, k: int) -> np.float32:
        alpha, sigma_hat = self.alpha_sigma(k)
        return rounded(np.log, alpha) - rounded(np.log, sigma_hat)

    def to_x0(self, k: int, x: np.ndarray, v: np.ndarray) -> np.ndarray:
        """v-prediction -> data prediction at step k."""
        alpha, sigma_hat = self.alpha_sigma(k)
        return alpha * x - sigma_hat * v

    def update(self, k: int, x: np.ndarray, x0: np.ndarray, x0_prev: np.ndarray | None) -> np.ndarray:
        """One solver step from sigma k to sigma k+1, given the data predictions of steps k and k-1."""
        if self.sigmas[k + 1] == 0:
            return x0  # the final step lands exactly on the data prediction
        alpha_t, sigma_t = self.alpha_sigma(k + 1)
        _, sigma_s = self.alpha_sigma(k)
        h = self.lam(k + 1) - self.lam(k)
        coeff = alpha_t * (rounded(np.exp, -h) - F32(1.0))
        x_next = (sigma_t / sigma_s) * x - coeff * x0
        if x0_prev is not None and k > 0 and k < self.steps - 1:
            r0 = (self.lam(k) - self.lam(k - 1)) / h
            d1 = (F32(1.0) / r0) * (x0 - x0_prev)
            x_next = x_next - F32(0.5) * coeff * d1
        return x_next.astype(F32)


VelocityFn = Callable[[np.ndarray, float], tuple[np.ndarray, np.ndarray]]


def sample_latent(
    schedule: DpmSolverSchedule,
    noise: np.ndarray,
    predict: VelocityFn,
    cfg_scale: float,
) -> np.ndarray:
    """Run the sampler on one latent with CFG.

    `predict(x, t)` evaluates the head on the batch [x, x] with conditions [positive, negative] and the fp32
    timestep t, returning (v_positive, v_negative); the guided v is applied to the single sample.
    """
    x = np.asarray(noise, dtype=F32)
    x0_prev = None
    for k, t in enumerate(schedule.timesteps):
        v_pos, v_neg = predict(x, float(t))
        v = v_neg + F32(cfg_scale) * (v_pos - v_neg)
        x0 = schedule.to_x0(k, x, v)
        x = schedule.update(k, x, x0, x0_prev)
        x0_prev = x0
    return x


def read_npy(path: Path, what: str) -> np.ndarray:
    """One array from a .npy file, or a one-sentence error (never a pickle: allow_pickle stays off)."""
    try:
        array = np.load(path, allow_pickle=False)
    except Exception as e:  # OSError, ValueError, EOFError (empty file), ...: all mean "not a .npy we can use"
        raise VibeVoiceError(f"{path}: not a readable .npy {what} file ({type(e).__name__}: {e})") from None
    if not isinstance(array, np.ndarray):
        raise VibeVoiceError(f"{path}: holds several arrays (.npz); the {what} file must be one .npy array")
    return array


class NoiseSource:
    """The initial noise of each speech frame: from a seed (random access) or from rows of an array."""

    def __init__(self, rows: np.ndarray | None = None, seed: int | None = None, latent_size: int = 64, origin: str = ""):
        self.rows, self.seed, self.latent_size, self.origin = rows, seed, latent_size, origin

    @classmethod
    def from_seed(cls, seed: int, latent_size: int = 64) -> "NoiseSource":
        return cls(seed=int(seed), latent_size=latent_size, origin=f"seed {seed}")

    @classmethod
    def from_file(cls, path: Path, latent_size: int = 64) -> "NoiseSource":
        rows = read_npy(path, "noise")
        if rows.ndim != 2 or rows.shape[1] != latent_size or rows.shape[0] == 0:
            raise VibeVoiceError(
                f"{path}: noise must have shape [frames, {latent_size}] with at least one frame, got {list(rows.shape)}"
            )
        if not np.issubdtype(rows.dtype, np.floating) or not np.isfinite(rows).all():
            raise VibeVoiceError(f"{path}: noise must hold finite floating-point values")
        return cls(rows=rows.astype(F32), latent_size=latent_size, origin=str(path))

    @property
    def frames(self) -> int | None:
        """How many frames this source can serve (None: unlimited)."""
        return None if self.rows is None else len(self.rows)

    def __call__(self, frame: int) -> np.ndarray:
        if self.rows is not None:
            if frame >= len(self.rows):
                raise VibeVoiceError(
                    f"{self.origin}: the noise file has {len(self.rows)} rows, but generation reached frame "
                    f"{frame + 1}; pass a longer file or --max-frames {len(self.rows)}"
                )
            return self.rows[frame]
        return np.random.default_rng([self.seed, frame]).standard_normal(self.latent_size, dtype=F32)
