"""The realtime reference: the model composed from transformers modules, and the shared generation loop
(generation/realtime.py) run on it in fp32.

transformers has no realtime VibeVoice class, so the model is composed here: two `Qwen2Model`s (the lower
one with its final norm replaced by Identity), the native diffusion head, acoustic decoder and connector,
plus the small glue that is ours (EOS classifier, type embedding, scaling buffers).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import DynamicCache
from transformers.models.vibevoice.modeling_vibevoice import VibeVoiceMultiModalProjector

from ..checkpoints.configs import ModelDims
from ..generation.common import LmStream, Steering, whole_head_at
from ..generation.realtime import GenerationResult, GuidedStreams, realtime_frames
from ..sampling import NoiseSource
from ..voices import VoicePrompt
from .modules import ConvState, acoustic_decoder, as_tensor, conv_state_specs, diffusion_head, qwen_model


class EosClassifier(nn.Module):
    """Realtime `tts_eos_classifier`: fc2(ReLU(fc1(h))) -> one logit; EOS when sigmoid > 0.5."""

    def __init__(self, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, hidden)
        self.fc2 = nn.Linear(hidden, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(hidden)))


class RealtimeModel(nn.Module):
    """VibeVoice-Realtime-0.5B: every component, callable on its own."""

    TEXT, SPEECH = 1, 0  # rows of tts_input_types

    def __init__(self, dims: ModelDims):
        super().__init__()
        self.dims = dims
        hidden = dims.lm.hidden
        self.language_model = qwen_model(dims.lm, final_norm=False)
        self.tts_language_model = qwen_model(dims.tts_lm)
        self.tts_input_types = nn.Embedding(2, hidden)
        self.acoustic_connector = VibeVoiceMultiModalProjector(dims.acoustic_decoder.vae_dim, hidden)
        self.diffusion_head = diffusion_head(dims.head)
        self.acoustic_decoder = acoustic_decoder(dims.acoustic_decoder)
        self.eos_classifier = EosClassifier(hidden)
        # Upstream initialises these to NaN: the values must come from the checkpoint (trap 6).
        self.register_buffer("speech_scaling_factor", torch.tensor(float("nan")))
        self.register_buffer("speech_bias_factor", torch.tensor(float("nan")))

    # -- language models -------------------------------------------------------------------------------
    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        return self.language_model.embed_tokens(ids)

    @staticmethod
    def _run(lm: Qwen2Model, embeds: torch.Tensor, positions: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        out = lm(inputs_embeds=embeds, position_ids=positions, past_key_values=cache, use_cache=True)
        return out.last_hidden_state

    def lower_step(self, embeds, positions, cache) -> torch.Tensor:
        """4-layer text LM; returns un-normed hidden states [1, S, H] and extends `cache` in place."""
        return self._run(self.language_model, embeds, positions, cache)

    def upper_step(self, embeds, positions, cache) -> torch.Tensor:
        """20-layer TTS LM with final norm; returns normed hidden states [1, S, H]."""
        return self._run(self.tts_language_model, embeds, positions, cache)

    def type_embedding(self, index: int) -> torch.Tensor:
        return self.tts_input_types.weight[index]

    # -- speech ----------------------------------------------------------------------------------------
    def predict_velocity(self, noisy: torch.Tensor, timesteps: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        return self.diffusion_head(noisy, timesteps, condition)

    def connect(self, latents: torch.Tensor) -> torch.Tensor:
        return self.acoustic_connector(latents)

    def eos_logit(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.eos_classifier(hidden)

    def unscale(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalised diffusion latent -> decoder input: divide by the scale first, then subtract the bias."""
        return latents / self.speech_scaling_factor - self.speech_bias_factor

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Whole-sequence decode: decoder latents [B, T, 64] -> audio [B, 1, T*hop]."""
        return self.acoustic_decoder(latents.transpose(1, 2)).audio

    def decode_stream(self, latents: torch.Tensor, state: "ConvState") -> torch.Tensor:
        """Decode F new frames [B, F, 64] -> audio [B, 1, F*hop], carrying `state` across calls."""
        return self.acoustic_decoder(latents.transpose(1, 2), padding_cache=state).audio



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

    def text_stream(self, layers, planned=None):  # transformers' DynamicCache grows as it goes
        return self._stream(self.model.lower_step, layers)

    def guided_streams(self, positive, negative, planned=None):
        # Upstream runs the two CFG streams as separate batch-1 forwards; so does the reference.
        return GuidedStreams(self._stream(self.model.upper_step, positive), self._stream(self.model.upper_step, negative))

    def velocity(self, noisy, timesteps, conditions):
        return self.model.predict_velocity(as_tensor(noisy), as_tensor(timesteps), as_tensor(conditions)).numpy()

    def head_at(self, conditions, timesteps):
        return whole_head_at(self.velocity, conditions)

    def connect(self, latent):
        return self.model.connect(as_tensor(latent)).numpy()

    def eos_logit(self, hidden):
        return float(self.model.eos_logit(as_tensor(hidden))[0, 0])

    def new_decoder_state(self):
        return ConvState.zeros(conv_state_specs(self.model.acoustic_decoder))

    def decode_frames(self, latent, state):
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
    result: GenerationResult | None = None,
    steering: Steering | None = None,
) -> GenerationResult:
    result = GenerationResult() if result is None else result
    frames = realtime_frames(TorchRealtimeBackend(model), prompt, text_ids, noise, cfg_scale, steps, max_frames, result,
                             stop_on_eos, steering=steering)
    for _ in frames:
        pass
    return result
