"""Audio in: any file soundfile reads, mixed to mono, resampled to 24 kHz and dB-normalised as upstream does.

Upstream loads voice samples (and ASR audio) with `librosa.load(path, sr=24000, mono=True)`: soundfile,
the channel mean, soxr's HQ resampler, and a length fixed to ceil(n · 24000 / rate); then it scales to
-25 dBFS by RMS (eps 1e-6) and, if a peak exceeds 1, divides by that peak (+eps). This module does the same
with soundfile and soxr directly (torch-free), and stores voice samples in the bundle's own format.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import VibeVoiceError

SAMPLE_RATE = 24_000
HOP = 3200  # samples per latent frame
TARGET_DBFS = -25.0
EPS = 1e-6


def read_audio(path: Path) -> tuple[np.ndarray, dict]:
    """float32 mono samples at 24 kHz, and what the file was (rate, channels, seconds)."""
    import soundfile as sf
    import soxr

    path = Path(path)
    if not path.is_file():
        raise VibeVoiceError(f"{path}: no such audio file")
    try:
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, ValueError) as e:
        raise VibeVoiceError(f"{path}: not an audio file this program can read ({e})") from None
    if data.size == 0:
        raise VibeVoiceError(f"{path}: holds no audio (zero samples)")
    if not np.isfinite(data).all():
        raise VibeVoiceError(f"{path}: holds NaN or infinite samples")
    mono = data.mean(axis=1, dtype=np.float32) if data.shape[1] > 1 else data[:, 0]
    if rate != SAMPLE_RATE:
        target = int(np.ceil(len(mono) * (float(SAMPLE_RATE) / rate)))  # librosa's float ratio, rounding included
        mono = soxr.resample(mono, rate, SAMPLE_RATE, quality="HQ").astype(np.float32)
        mono = np.pad(mono, (0, max(0, target - len(mono))))[:target]  # librosa's fix_length
    info = {"sample_rate": int(rate), "channels": int(data.shape[1]), "seconds": round(len(data) / rate, 3)}
    return np.ascontiguousarray(mono, dtype=np.float32), info


def db_normalize(samples: np.ndarray) -> np.ndarray:
    """Scale to -25 dBFS by RMS, then divide by the peak (+eps) if it exceeds 1 (upstream's AudioNormalizer)."""
    samples = np.asarray(samples, np.float32)
    rms = np.sqrt(np.mean(samples**2))
    samples = samples * (10 ** (TARGET_DBFS / 20) / (rms + EPS))
    peak = np.max(np.abs(samples))
    if peak > 1.0:
        samples = samples / (peak + EPS)
    return samples.astype(np.float32)


def to_pcm16(samples: np.ndarray) -> np.ndarray:
    """Little-endian 16-bit PCM, clipped to [-1, 1] and scaled by 32767 with round-half-even, as libsndfile writes
    PCM_16, so raw output, served audio and WAV files hold the same integers."""
    return np.round(np.clip(np.asarray(samples, np.float32), -1.0, 1.0) * 32767).astype("<i2")


def frames(samples: int) -> int:
    return math.ceil(samples / HOP)


@dataclass
class VoiceSample:
    """A voice for VibeVoice-1.5B: normalised 24 kHz mono samples and where they came from."""

    samples: np.ndarray
    metadata: dict = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE

    @property
    def frames(self) -> int:
        return frames(len(self.samples))


def voice_from_file(path: Path) -> VoiceSample:
    """Read, mix, resample and normalise an audio file into a voice; refuse what cannot be one."""
    samples, info = read_audio(path)
    if len(samples) < HOP:
        raise VibeVoiceError(
            f"{path}: is {len(samples) / SAMPLE_RATE:.3f} s long, shorter than one latent frame "
            f"({HOP / SAMPLE_RATE:.3f} s); a voice sample needs at least that (a few seconds works best)"
        )
    if not np.any(samples):
        raise VibeVoiceError(f"{path}: is silent, so it holds no voice to clone")
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return VoiceSample(db_normalize(samples), {"source": Path(path).name, "sha256": digest, **info})


def save_voice_sample(voice: VoiceSample, path: Path) -> None:
    from safetensors.numpy import save_file

    save_file({"samples": voice.samples}, str(path), metadata={k: str(v) for k, v in voice.metadata.items()})


def load_voice_sample(path: Path) -> VoiceSample:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            metadata = f.metadata() or {}
            samples = f.get_tensor("samples") if "samples" in f.keys() else None
    except Exception as e:  # SafetensorError on truncated or corrupt files
        raise VibeVoiceError(f"{path}: not a readable voice file ({e})") from None
    if samples is None or samples.ndim != 1 or samples.dtype != np.float32 or len(samples) < HOP:
        raise VibeVoiceError(f"{path}: not a vibevoice-onnx voice sample (no float32 'samples' of at least one frame)")
    if not np.isfinite(samples).all():
        raise VibeVoiceError(f"{path}: holds NaN or infinite samples")
    return VoiceSample(samples, dict(metadata))
