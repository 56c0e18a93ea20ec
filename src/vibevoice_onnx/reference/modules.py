"""PyTorch building blocks of the reference, composed from transformers 5.23 modules.

transformers has no realtime VibeVoice class, so the realtime model is composed here: two `Qwen2Model`s
(the lower one with its final norm replaced by Identity), the native `VibeVoiceDiffusionHead`, the native
acoustic decoder and connector, plus the small glue that is ours (EOS classifier, type embedding, scaling
buffers) and an explicit conv-state cache for streaming decode.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import Qwen2Config, Qwen2Model
from transformers.cache_utils import DynamicCache
from transformers.models.vibevoice.configuration_vibevoice import VibeVoiceDiffusionHeadConfig
from transformers.models.vibevoice.modeling_vibevoice import VibeVoiceDiffusionHead, VibeVoiceMultiModalProjector
from transformers.models.vibevoice_acoustic_tokenizer.configuration_vibevoice_acoustic_tokenizer import (
    VibeVoiceAcousticTokenizerDecoderConfig,
)
from transformers.models.vibevoice_acoustic_tokenizer.modeling_vibevoice_acoustic_tokenizer import (
    VibeVoiceAcousticTokenizerCausalConv1d,
    VibeVoiceAcousticTokenizerCausalConvTranspose1d,
    VibeVoiceAcousticTokenizerDecoderModel,
)

from ..checkpoints.configs import ConvStackDims, HeadDims, ModelDims, QwenDims

ATTENTION = "sdpa"


def qwen_config(q: QwenDims) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=q.vocab,
        hidden_size=q.hidden,
        intermediate_size=q.intermediate,
        num_hidden_layers=q.layers,
        num_attention_heads=q.heads,
        num_key_value_heads=q.kv_heads,
        head_dim=q.head_dim,
        max_position_embeddings=q.max_positions,
        rms_norm_eps=q.rms_eps,
        rope_parameters={"rope_type": "default", "rope_theta": q.rope_theta},
        tie_word_embeddings=q.tied_embeddings,
        use_sliding_window=False,
        sliding_window=None,
        attn_implementation=ATTENTION,
    )


def qwen_model(q: QwenDims, final_norm: bool = True) -> Qwen2Model:
    model = Qwen2Model(qwen_config(q))
    if not final_norm:
        model.norm = nn.Identity()  # realtime lower LM: its output feeds the upper LM un-normalised (trap 3)
    return model


def diffusion_head(h: HeadDims) -> VibeVoiceDiffusionHead:
    return VibeVoiceDiffusionHead(
        VibeVoiceDiffusionHeadConfig(
            hidden_size=h.hidden,
            latent_size=h.latent,
            num_hidden_layers=h.layers,
            intermediate_size=h.ffn,
            rms_norm_eps=h.eps,
        )
    )


def _conv_stack_kwargs(d: ConvStackDims) -> dict:
    return dict(
        hidden_size=d.vae_dim,
        num_filters=d.n_filters,
        depths=list(d.depths),
        rms_norm_eps=d.eps,
        kernel_size=7,
        ffn_expansion=4,
        hidden_act="gelu",
    )


def acoustic_decoder(d: ConvStackDims) -> VibeVoiceAcousticTokenizerDecoderModel:
    # The transformers decoder upsamples by reversed(downsampling_ratios); ours are in application order.
    config = VibeVoiceAcousticTokenizerDecoderConfig(
        downsampling_ratios=list(reversed(d.ratios)), **_conv_stack_kwargs(d)
    )
    return VibeVoiceAcousticTokenizerDecoderModel(config)


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


class ConvState:
    """Explicit streaming state of a causal conv stack: the inputs each conv still needs from the past.

    transformers' conv modules call `padding_cache.update(x, key, module)` and convolve what it returns; this
    object answers with `cat([state, x])` and keeps the tail that the next call needs. The states live in a
    plain dict, so an exporter can pass them in and out of a graph as tensors.
    """

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = dict(tensors)

    @classmethod
    def zeros(cls, specs: list[tuple[str, int, int]], batch: int = 1, dtype=torch.float32) -> "ConvState":
        return cls({key: torch.zeros(batch, channels, length, dtype=dtype) for key, channels, length in specs})

    def update(self, x: torch.Tensor, key: str, module: nn.Module) -> torch.Tensor:
        full = torch.cat([self.tensors[key], x], dim=-1)
        self.tensors[key] = full[..., full.shape[-1] - self.tensors[key].shape[-1] :]
        return full


def state_length(module: nn.Module) -> int:
    """Past input samples a causal conv needs: its left padding; for a transposed conv (kernel k, stride s)
    only the ceil(k/s) - 1 previous frames overlap the new output (1 for VibeVoice's k = 2s), not the k - 1
    transformers keeps, which would make every streamed frame recompute 15 frames of the first upsampler."""
    if isinstance(module, VibeVoiceAcousticTokenizerCausalConvTranspose1d):
        kernel, stride = module.convtr.kernel_size[0], module.stride
        return -(-kernel // stride) - 1
    return module.left_pad


def conv_state_specs(stack: nn.Module) -> list[tuple[str, int, int]]:
    """(cache key, channels, kept samples) of every causal conv in a transformers conv stack, in run order."""
    specs = []
    for module in stack.modules():
        if isinstance(module, (VibeVoiceAcousticTokenizerCausalConv1d, VibeVoiceAcousticTokenizerCausalConvTranspose1d)):
            specs.append((module.cache_key, module.in_channels, state_length(module)))
    return specs
