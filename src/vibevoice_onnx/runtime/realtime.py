"""Torch-free realtime TTS: the shared generation loop on onnxruntime sessions of a bundle.

    tts = RealtimeTTS("onnx/realtime/cpu_fp32")
    for chunk in tts.stream("Hello there.", voice="en-Davis_man"):
        play(chunk.samples, chunk.sample_rate)
    audio, sample_rate = tts.create("Hello there.", voice="en-Davis_man", seed=7)
"""

from __future__ import annotations

import numpy as np

from ..generation.common import LmStream
from ..generation.realtime import GenerationResult, realtime_frames
from ..options import check, check_optional
from ..sampling import NoiseSource
from ..text import encode_tts_text
from .bundle import Bundle
from .lm import BatchedGuidedStreams, OnnxDiffusionHead, OnnxLm, StreamingConv, flat_cache
from .speech import Speech, TtsModel

F32 = np.float32
# After the first frame, frames are decoded this many at a time: the decoder's weights are then read once per
# group (1.4 GB in fp32 at full size), for audio that arrives in bursts of a group. Measured with `bench`.
DECODE_GROUP = 3


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
        self.sessions = {name: bundle.session(name) for name in bundle.manifest["graphs"]}
        self.lms = {name: OnnxLm(bundle, name) for name in ("lower_lm", "upper_lm")}
        self.head = OnnxDiffusionHead(bundle)
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
        return self.head.velocity(noisy, timesteps, conditions)

    def head_at(self, conditions, timesteps):
        return self.head.at(conditions, timesteps)

    def connect(self, latent):
        return self.sessions["acoustic_connector"].run(None, {"latents": latent.astype(F32)})[0]

    def eos_logit(self, hidden):
        return float(self.sessions["eos_classifier"].run(None, {"hidden_states": hidden.astype(F32)})[0][0, 0])

    def new_decoder_state(self):
        return self.decoder.new_state()

    def decode_frames(self, latent, state):
        audio, state = self.decoder.run(latent, state)
        return audio[0, 0], state

    def unscale(self, latent):
        return (latent / self.scale - self.bias).astype(F32)


class RealtimeTTS(TtsModel):
    """VibeVoice-Realtime from an ONNX bundle, with onnxruntime and numpy only."""

    kind = "realtime"

    def _backend(self) -> OnnxRealtimeBackend:
        return OnnxRealtimeBackend(self.bundle)

    def stream(self, text: str, voice: str, cfg_scale: float = 1.5, steps: int = 5, seed: int | None = None,
               noise: NoiseSource | None = None, max_frames: int | None = None,
               decode_group: int = DECODE_GROUP) -> Speech:
        cfg_scale, steps = check("cfg_scale", cfg_scale), check("steps", steps)
        max_frames, decode_group = check_optional("max_frames", max_frames), check("decode_group", decode_group)
        prompt = self.bundle.voice(voice)
        ids = encode_tts_text(self.bundle.tokenizer, text)
        noise, seed = self.noise_source(seed, noise)
        result = GenerationResult()
        frames = realtime_frames(self.backend, prompt, ids, noise, cfg_scale, steps, max_frames, result,
                                 decode_group=decode_group)
        return Speech(frames, result, seed, noise)
