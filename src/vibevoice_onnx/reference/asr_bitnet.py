"""The VibeVoice-ASR-BitNet reference (docs/bitnet.md): the ASR reference (transformers' model, loaded strictly),
the seven projections of every LM layer replaced by a BitLinear written from the published description:

    weights, once at load, one scale per tensor:   s = 1 / max(mean|W|, 1e-5),  Wt = clamp(round(W·s), -1, 1)
    activations, every call, one scale per token:  a = 127 / max(max|x|, 1e-5),  x_q = clamp(round(x·a), -128, 127)
    output:                                        y = (x_q · Wtᵀ) / (a·s) + bias

torch.round rounds half to even, as the reference runtime does. Everything else (embedding, head, norms, biases,
encoders, connectors) is the float model as stored.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..checkpoints.checkpoint import Checkpoint
from .asr import AsrReference, load_asr

PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
EPS = 1e-5  # the floor of mean|W| and of max|x|
ACTIVATION_LEVELS = 127.0  # int8: x_q in [-128, 127]


def ternarize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Wt, s): the codes {-1, 0, 1} (in the weight's float dtype) and the tensor's one scale s (0-d)."""
    scale = 1.0 / weight.abs().mean().clamp(min=EPS)
    return torch.clamp(torch.round(weight * scale), -1, 1), scale


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_q, a): x quantized to int8 per row of its last axis (integer values, x's dtype), and each row's a."""
    a = ACTIVATION_LEVELS / x.abs().amax(dim=-1, keepdim=True).clamp(min=EPS)
    return torch.clamp(torch.round(x * a), -128, 127), a


class BitLinear(nn.Module):
    """A linear layer with ternary weights and int8 per-token activations (W1.58A8), from a float nn.Linear whose
    weight is the latent one. `weight` holds the codes Wt, `weight_scale` the multiplier s (W' = Wt / s)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        codes, scale = ternarize(linear.weight.detach().to(torch.float32))
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(codes, requires_grad=False)
        self.register_buffer("weight_scale", scale.reshape(()))
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_q, a = quantize_activations(x)
        # Every product and partial sum of x_q · Wtᵀ is an integer below 2**24 (127 · 8960 at full size): exact in fp32
        y = F.linear(x_q, self.weight) / (a * self.weight_scale)
        return y if self.bias is None else y + self.bias


def bitlinearize(language_model: nn.Module) -> int:
    """Replace the seven projections of every layer by BitLinear (in place); the number replaced."""
    count = 0
    for layer in language_model.layers:
        for path in PROJECTIONS:
            owner, _, name = path.rpartition(".")
            parent = layer.get_submodule(owner)
            setattr(parent, name, BitLinear(getattr(parent, name)))
            count += 1
    return count


def load_asr_bitnet(checkpoint: Checkpoint | Path, compact: bool = False) -> AsrReference:
    """The fp32 model loaded strictly from the F32 latent weights, its projections then ternarized."""
    reference = load_asr(checkpoint, compact)
    bitlinearize(reference.parts.language_model)
    return reference
