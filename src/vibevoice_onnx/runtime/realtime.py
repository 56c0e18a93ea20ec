"""Torch-free realtime TTS: the shared generation loop on onnxruntime sessions of a bundle.

    tts = RealtimeTTS("onnx/realtime/cpu_fp32")
    for chunk in tts.stream("Hello there.", voice="en-Davis_man"):
        play(chunk.samples, chunk.sample_rate)
    audio, sample_rate = tts.create("Hello there.", voice="en-Davis_man", seed=7)
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import VibeVoiceError
from ..generation.common import LmStream, require_finite
from ..generation.realtime import GenerationResult, realtime_frames
from ..options import check, check_optional
from ..sampling import NoiseSource
from ..text import encode_tts_text
from .bundle import Bundle
from .lm import BatchedGuidedStreams, OnnxLm, StreamingConv, flat_cache

SAMPLE_RATE = 24_000
F32 = np.float32


class OnnxRealtimeBackend:
    """Evaluates each component with its ONNX graph; KV caches and conv states are lists of arrays."""

    def __init__(self, bundle: Bundle):
        bundle.require_kind("realtime")
        self.bundle = bundle
        self.embed, types, scale, bias = bundle.host_tensors(
            "embed_tokens", "tts_input_types", "speech_scaling_factor", "speech_bias_factor")
        self.types, self.scale, self.bias = types.astype(F32), F32(scale), F32(bias)
        self.max_positions = bundle.dims.tts_lm.max_positions
        self.train_steps = bundle.dims.head.train_steps
        self.sessions = {name: bundle.session(name) for name in bundle.manifest["graphs"] if name != "acoustic_decoder"}
        self.lms = {name: OnnxLm(bundle, name) for name in ("lower_lm", "upper_lm")}
        self.decoder = StreamingConv(bundle, "acoustic_decoder_stream")

    def embed_text(self, ids):
        return self.embed[np.asarray(ids)].astype(F32)[None]

    def type_embedding(self, index):
        return self.types[index]

    @staticmethod
    def flat_cache(layers) -> list[np.ndarray]:
        return flat_cache(layers)

    def unbatched(self, name):
        """`run(embeds, positions, cache)` for a batch-1 stream without padding."""
        return self.lms[name].unbatched

    def text_stream(self, layers):
        return LmStream(self.unbatched("lower_lm"), self.flat_cache(layers), layers[0][0].shape[2])

    def guided_streams(self, positive, negative):
        return BatchedGuidedStreams(self.lms["upper_lm"], flat_cache(positive), flat_cache(negative))

    def velocity(self, noisy, timesteps, conditions):
        feeds = {"noisy_latents": noisy, "timesteps": timesteps, "condition": np.ascontiguousarray(conditions, dtype=F32)}
        return self.sessions["diffusion_head"].run(None, feeds)[0]

    def connect(self, latent):
        return self.sessions["acoustic_connector"].run(None, {"latents": latent.astype(F32)})[0]

    def eos_logit(self, hidden):
        return float(self.sessions["eos_classifier"].run(None, {"hidden_states": hidden.astype(F32)})[0][0, 0])

    def new_decoder_state(self):
        return self.decoder.new_state()

    def decode_frame(self, latent, state):
        audio, state = self.decoder.run(latent, state)
        return audio[0, 0], state

    def unscale(self, latent):
        return (latent / self.scale - self.bias).astype(F32)


@dataclass
class AudioChunk:
    samples: np.ndarray  # float32 mono
    sample_rate: int
    frame: int  # 0-based speech frame index


class Speech:
    """One generation: iterate for audio chunks as they are decoded; `result` and timings fill as it runs."""

    def __init__(self, backend: OnnxRealtimeBackend, prompt, ids, noise: NoiseSource, cfg_scale, steps, max_frames,
                 seed: int | None):
        self.result = GenerationResult()
        self.seed = seed
        self.noise = noise
        self.first_chunk_seconds: float | None = None
        self.seconds = 0.0
        self._frames = realtime_frames(backend, prompt, ids, noise, cfg_scale, steps, max_frames, self.result)

    def __iter__(self) -> Iterator[AudioChunk]:
        start = time.perf_counter()
        for index, samples in enumerate(self._frames):
            if self.first_chunk_seconds is None:
                self.first_chunk_seconds = time.perf_counter() - start
            self.seconds = time.perf_counter() - start
            yield AudioChunk(samples, SAMPLE_RATE, index)
        self.seconds = time.perf_counter() - start

    @property
    def audio_seconds(self) -> float:
        return sum(len(c) for c in self.result.chunks) / SAMPLE_RATE


class RealtimeTTS:
    """VibeVoice-Realtime from an ONNX bundle, with onnxruntime and numpy only."""

    sample_rate = SAMPLE_RATE

    def __init__(self, bundle: Bundle | str | Path, providers: list | None = None, threads: int | None = None,
                 session_options=None):
        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle(Path(bundle), providers, session_options, threads)
        self.backend = OnnxRealtimeBackend(self.bundle)
        self.latent_size = self.bundle.dims.head.latent

    @property
    def voices(self) -> list[str]:
        return self.bundle.voices()

    def stream(self, text: str, voice: str, cfg_scale: float = 1.5, steps: int = 5, seed: int | None = None,
               noise: NoiseSource | None = None, max_frames: int | None = None) -> Speech:
        cfg_scale, steps = check("cfg_scale", cfg_scale), check("steps", steps)
        seed, max_frames = check_optional("seed", seed), check_optional("max_frames", max_frames)
        prompt = self.bundle.voice(voice)
        ids = encode_tts_text(self.bundle.tokenizer, text)
        if noise is None:
            seed = secrets.randbelow(2**31) if seed is None else int(seed)
            noise = NoiseSource.from_seed(seed, self.latent_size)
        return Speech(self.backend, prompt, ids, noise, cfg_scale, steps, max_frames, seed)

    def create(self, text: str, voice: str, **options) -> tuple[np.ndarray, int]:
        speech = self.stream(text, voice, **options)
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
        latents = latents.astype(F32)
        decoder_input = self.backend.unscale(latents[None])
        audio = self.bundle.session("acoustic_decoder").run(None, {"latents": decoder_input})[0][0, 0]
        require_finite(audio, "decoded audio", f"decoding {len(latents)} frames")
        return audio, self.sample_rate
