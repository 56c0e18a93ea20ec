"""What a VibeVoice-1.5B bundle holds: its graphs and host tensors, from transformers' model loaded strictly."""

from __future__ import annotations

import numpy as np
import torch

from ..reference.tts15b import Tts15bReference
from .graphs import GraphSpec, connector_spec, decoder_specs, encoder_spec, head_specs, lm_spec, streaming_encoder_spec

# Seconds and peak GB per billion parameters of a first build + verify on 2 cores (build_cost): the full-size
# synthetic checkpoint (2.70 B parameters) built in 260 s and verified in 583 s at a 19.1 GB peak through the
# local stand-in for the Hub (benchmarks/first_use.py --kind 1.5b, 2026-12-04).
BUILD_COST = {"fp32": (312.0, 7.1)}


def load_model(checkpoint):
    from ..reference.tts15b import load_tts15b

    return load_tts15b(checkpoint)


def graph_specs(reference: Tts15bReference) -> list[GraphSpec]:
    dims, parts = reference.dims, reference.parts
    acoustic, semantic = dims.acoustic_encoder, dims.semantic_encoder
    g = torch.Generator().manual_seed(0)
    return [
        lm_spec("lm", parts.language_model, dims.lm, g),
        *head_specs(parts.diffusion_head, dims.head, g),
        connector_spec("acoustic_connector", parts.multi_modal_projector, acoustic.vae_dim, g),
        connector_spec("semantic_connector", parts.semantic_connector, semantic.vae_dim, g),
        encoder_spec("acoustic_encoder", reference.acoustic_encoder, acoustic.hop, g),
        *decoder_specs(reference.acoustic_decoder, dims.acoustic_decoder.vae_dim, g),
        streaming_encoder_spec("semantic_encoder_stream", reference.semantic_encoder, semantic.hop, g),
    ]


def host_tensors(files, reference: Tts15bReference) -> dict[str, np.ndarray]:
    """The token embedding (in its stored dtype; the tied head's four choice rows come from it) and the
    latent scale and bias."""
    return {
        "embed_tokens": files.read("model.language_model.embed_tokens.weight"),
        "speech_scaling_factor": reference.parts.latent_scaling_factor.detach().numpy(),
        "speech_bias_factor": reference.parts.latent_bias_factor.detach().numpy(),
    }
