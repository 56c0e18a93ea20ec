"""What every TTS kind's Python API shares: opening a bundle, the noise source, a streamed generation with its
timings, and whole-sequence decoding of saved latents."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ..audio import SAMPLE_RATE
from ..errors import VibeVoiceError
from ..families import family, kinds_that, load
from ..generation.common import require_finite
from ..options import check_optional
from ..sampling import NoiseSource
from .bundle import Bundle
from .pretrained import FromPretrained

F32 = np.float32


@dataclass
class AudioChunk:
    samples: np.ndarray  # float32 mono
    sample_rate: int
    frame: int  # 0-based latent index


class Speech:
    """One generation: iterate for audio chunks as they are decoded; `result` and timings fill as it runs.

    The clock starts at the first request for audio, so time to first audio includes whatever the generation
    does before its first latent (encoding voice samples, prefilling the prompt)."""

    def __init__(self, frames: Iterator[np.ndarray], result, seed: int | None, noise: NoiseSource):
        self._frames, self.result, self.seed, self.noise = frames, result, seed, noise
        self.segments = 1  # generations the text is spoken in (a text longer than the model's context: several)
        self.first_chunk_seconds: float | None = None
        self.seconds = 0.0

    def __iter__(self) -> Iterator[AudioChunk]:
        start = time.perf_counter()
        try:
            for index, samples in enumerate(self._frames):
                if self.first_chunk_seconds is None:
                    self.first_chunk_seconds = time.perf_counter() - start
                self.seconds = time.perf_counter() - start
                yield AudioChunk(samples, SAMPLE_RATE, index)
        finally:  # a reader that gives up stops the generation (a batched one leaves its batch) now, not at GC
            close = getattr(self._frames, "close", None)
            if close is not None:
                close()
        self.seconds = time.perf_counter() - start

    @property
    def audio_seconds(self) -> float:
        return self.result.samples / SAMPLE_RATE


class TtsModel(FromPretrained):
    """A TTS bundle of one kind, opened for generation (subclasses: RealtimeTTS, LongFormTTS)."""

    kind = ""
    sample_rate = SAMPLE_RATE

    def __init__(self, bundle: Bundle | str | Path, providers: list | None = None, threads: int | None = None,
                 session_options=None, force: bool = False):
        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle(Path(bundle), providers, session_options, threads)
        self.bundle.require_kind(self.kind)
        if not force:
            self.bundle.require_usable()
        self.backend = self._backend()
        self.latent_size = self.bundle.dims.head.latent

    def _backend(self):
        raise NotImplementedError

    @property
    def voices(self) -> list[str]:
        return self.bundle.voices()

    def noise_source(self, seed: int | None, noise: NoiseSource | None) -> tuple[NoiseSource, int | None]:
        """The given noise, or noise from `seed` (a random seed, reported, when none is given)."""
        seed = check_optional("seed", seed)
        if noise is not None:
            return noise, seed
        seed = secrets.randbelow(2**31) if seed is None else seed
        return NoiseSource.from_seed(seed, self.latent_size), seed

    def stream(self, *args, **kwargs) -> Speech:
        raise NotImplementedError

    def create(self, *args, **options) -> tuple[np.ndarray, int]:
        speech = self.stream(*args, **options)
        for _ in speech:
            pass
        return speech.result.audio, self.sample_rate

    def decode(self, latents: np.ndarray) -> tuple[np.ndarray, int]:
        """Whole-sequence decode of saved latents z [frames, 64] (as `speak --save-latents` writes them)."""
        latents = np.asarray(latents)
        if latents.ndim != 2 or latents.shape[1] != self.latent_size or not len(latents):
            raise VibeVoiceError(f"latents must have shape [frames, {self.latent_size}], got {list(latents.shape)}")
        if not np.issubdtype(latents.dtype, np.floating) or not np.isfinite(latents).all():
            raise VibeVoiceError("latents must hold finite floating-point values (this array holds NaN, infinity or non-numbers)")
        decoder_input = self.backend.unscale(latents.astype(F32)[None])
        audio, _ = self.backend.decode_frames(decoder_input, self.backend.new_decoder_state())
        require_finite(audio, "decoded audio", f"decoding {len(latents)} frames")
        return audio, self.sample_rate


def open_tts(bundle_dir: Path, threads: int | None = None, force: bool = False) -> TtsModel:
    """The API object for a TTS bundle of any kind."""
    bundle = Bundle(Path(bundle_dir), threads=threads)
    facts = family(bundle.kind)
    if not facts.capabilities.speaks:
        raise VibeVoiceError(f"{bundle.path}: is a bundle of kind '{bundle.kind}', which does not speak (TTS kinds: "
                             f"{', '.join(kinds_that(speaks=True))})")
    return load(facts.runtime)(bundle, force=force)
