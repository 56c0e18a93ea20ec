"""What a realtime bundle holds: the seven graphs and the host tensors, from the reference model."""

from __future__ import annotations

import numpy as np
import torch

from ..reference.realtime import RealtimeModel
from .graphs import BATCH, GraphSpec, connector_spec, decoder_specs, head_specs, lm_spec

# Seconds and peak GB per billion parameters of a first build + verify on 2 cores (build_cost): the full-size
# synthetic checkpoint (1.02 B parameters) built and verified in 216 s at an 11.2 GB peak through the local
# stand-in for the Hub (benchmarks/first_use.py, 2026-12-04).
BUILD_COST = {"fp32": (212.0, 11.0)}


def load_model(checkpoint):
    from ..reference.loading import load_realtime

    return load_realtime(checkpoint)


def graph_specs(model: RealtimeModel) -> list[GraphSpec]:
    dims = model.dims
    hidden, latent = dims.lm.hidden, dims.head.latent
    g = torch.Generator().manual_seed(0)
    return [
        lm_spec("lower_lm", model.language_model, dims.lm, g),
        lm_spec("upper_lm", model.tts_language_model, dims.tts_lm, g),
        *head_specs(model.diffusion_head, dims.head, g),
        connector_spec("acoustic_connector", model.acoustic_connector, latent, g),
        GraphSpec("eos_classifier", model.eos_classifier, (torch.randn(2, hidden, generator=g),), ["hidden_states"], ["logits"],
                  ({0: BATCH},)),
        *decoder_specs(model.acoustic_decoder, latent, g),
    ]


def host_tensors(files, model: RealtimeModel) -> dict[str, np.ndarray]:
    """Tensors the host uses directly: the text embedding (in its stored dtype), type rows, scale and bias."""
    return {
        "embed_tokens": files.read("model.language_model.embed_tokens.weight"),
        "tts_input_types": model.tts_input_types.weight.detach().numpy(),
        "speech_scaling_factor": model.speech_scaling_factor.numpy(),
        "speech_bias_factor": model.speech_bias_factor.numpy(),
    }
