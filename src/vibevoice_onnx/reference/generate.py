"""The reference realtime generation: the shared loop (generation.py) on the fp32 PyTorch modules."""

from __future__ import annotations

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

from ..generation import GenerationResult, GuidedStreams, LmStream, realtime_frames
from ..sampling import NoiseSource
from ..voices import VoicePrompt
from .modules import ConvState, RealtimeModel, conv_state_specs


def as_tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))


class TorchRealtimeBackend:
    """Evaluates each component with the reference modules; caches are transformers DynamicCaches."""

    def __init__(self, model: RealtimeModel):
        self.model = model
        self.max_positions = model.dims.tts_lm.max_positions
        self.train_steps = model.dims.head.train_steps

    def embed_text(self, ids):
        return self.model.embed_text(torch.tensor([ids])).numpy()

    def type_embedding(self, index):
        return self.model.type_embedding(index).numpy()

    def _stream(self, step, layers) -> LmStream:
        cache = DynamicCache(ddp_cache_data=[(as_tensor(k), as_tensor(v)) for k, v in layers])
        run = lambda embeds, positions, cache: (step(as_tensor(embeds), torch.from_numpy(positions), cache).numpy(), cache)  # noqa: E731
        return LmStream(run, cache, layers[0][0].shape[2])

    def text_stream(self, layers):
        return self._stream(self.model.lower_step, layers)

    def guided_streams(self, positive, negative):
        # Upstream runs the two CFG streams as separate batch-1 forwards; so does the reference.
        return GuidedStreams(self._stream(self.model.upper_step, positive), self._stream(self.model.upper_step, negative))

    def velocity(self, noisy, timesteps, conditions):
        return self.model.predict_velocity(as_tensor(noisy), as_tensor(timesteps), as_tensor(conditions)).numpy()

    def connect(self, latent):
        return self.model.connect(as_tensor(latent)).numpy()

    def eos_logit(self, hidden):
        return float(self.model.eos_logit(as_tensor(hidden))[0, 0])

    def new_decoder_state(self):
        return ConvState.zeros(conv_state_specs(self.model.acoustic_decoder))

    def decode_frame(self, latent, state):
        return self.model.decode_stream(as_tensor(latent), state)[0, 0].numpy(), state

    def unscale(self, latent):
        return self.model.unscale(as_tensor(latent)).numpy()


@torch.no_grad()
def generate(
    model: RealtimeModel,
    prompt: VoicePrompt,
    text_ids: list[int],
    noise: NoiseSource,
    cfg_scale: float = 1.5,
    steps: int = 5,
    max_frames: int | None = None,
    stop_on_eos: bool = True,
) -> GenerationResult:
    result = GenerationResult()
    frames = realtime_frames(TorchRealtimeBackend(model), prompt, text_ids, noise, cfg_scale, steps, max_frames, result,
                             stop_on_eos)
    for _ in frames:
        pass
    return result
