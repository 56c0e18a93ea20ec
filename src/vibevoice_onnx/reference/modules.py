"""PyTorch building blocks of the reference, built from transformers 5.23 modules, shared by every kind:
Qwen2 stacks, the diffusion head, the σ-VAE conv stacks, and explicit conv states for streaming."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from transformers import Qwen2Config, Qwen2Model
from transformers.cache_utils import DynamicCache
from transformers.models.vibevoice.configuration_vibevoice import VibeVoiceDiffusionHeadConfig
from transformers.models.vibevoice.modeling_vibevoice import VibeVoiceDiffusionHead
from transformers.models.vibevoice_acoustic_tokenizer.configuration_vibevoice_acoustic_tokenizer import (
    VibeVoiceAcousticTokenizerDecoderConfig,
)
from transformers.models.vibevoice_acoustic_tokenizer.modeling_vibevoice_acoustic_tokenizer import (
    VibeVoiceAcousticTokenizerCausalConv1d,
    VibeVoiceAcousticTokenizerCausalConvTranspose1d,
    VibeVoiceAcousticTokenizerDecoderModel,
)

from ..checkpoints.configs import ConvStackDims, HeadDims, QwenDims

ATTENTION = "sdpa"


def as_tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))


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


class ConvState:
    """Explicit streaming state of a causal conv stack: the inputs each conv still needs from the past.

    transformers' conv modules call `padding_cache.update(x, key, module)` and convolve what it returns; this
    object answers with `cat([state, x])` and keeps the tail that the next call needs. The states live in a
    plain dict, so an exporter can pass them in and out of a graph as tensors.

    `pad_to_stride`: a strided conv's input is also zero-padded on the right to a whole number of strides, as
    upstream does for the final segment of a long recording (`is_final_chunk`): a chunk of whole frames gets
    no padding, so one graph serves every segment, and the segments together equal one pass with
    upstream's non-streaming padding (UpstreamPadding).
    """

    def __init__(self, tensors: dict[str, torch.Tensor], pad_to_stride: bool = False):
        self.tensors = dict(tensors)
        self.pad_to_stride = pad_to_stride

    @classmethod
    def zeros(cls, specs: list[tuple[str, int, int]], batch: int = 1, dtype=torch.float32,
              pad_to_stride: bool = False) -> "ConvState":
        return cls({key: torch.zeros(batch, channels, length, dtype=dtype) for key, channels, length in specs},
                   pad_to_stride)

    def update(self, x: torch.Tensor, key: str, module: nn.Module) -> torch.Tensor:
        full = torch.cat([self.tensors[key], x], dim=-1)
        self.tensors[key] = full[..., full.shape[-1] - self.tensors[key].shape[-1] :]
        if self.pad_to_stride and hasattr(module, "conv") and module.conv.stride[0] > 1:
            full = nn.functional.pad(full, (0, (-x.shape[-1]) % module.conv.stride[0]))
        return full

    def update_channels_last(self, x: torch.Tensor, key: str) -> torch.Tensor:
        """`update` for frames [B, T, C] (an exported decoder's channels-last stages); the state keeps its
        channels-first layout, the graphs' interface."""
        kept = self.tensors[key].shape[-1]
        full = torch.cat([self.tensors[key].transpose(1, 2), x], dim=1)
        self.tensors[key] = full[:, full.shape[1] - kept :].transpose(1, 2)
        return full


class UpstreamPadding:
    """Upstream's non-streaming padding for transformers' causal convs, passed where a padding cache goes.

    Upstream pads every conv input with zeros: the causal amount on the left and, for a strided conv, on the
    right up to a whole number of strides ("extra padding"), so N samples give ceil(N / 3200) frames.
    transformers instead zero-pads the waveform to a multiple of 3200 once: the last frame then differs
    (facts trap 21). A 1.5B voice prompt is encoded this way upstream.
    """

    def update(self, x: torch.Tensor, key: str, module: nn.Module) -> torch.Tensor:
        stride = module.conv.stride[0]
        return nn.functional.pad(x, (module.left_pad, (-x.shape[-1]) % stride))


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
