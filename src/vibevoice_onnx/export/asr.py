"""What a VibeVoice-ASR bundle holds (either hub layout; the same graphs from the same weights): the language
model with KV cache, its head, both encoders (one pass, upstream's non-streaming padding) and the connectors'
sum, from transformers' model loaded strictly."""

from __future__ import annotations

import numpy as np
import torch

from ..reference.asr import AsrReference
from .graphs import BATCH, FRAMES, GraphSpec, encoder_spec, lm_spec


def load_model(checkpoint) -> AsrReference:
    from ..reference.asr import load_asr

    return load_asr(checkpoint)


def graph_specs(reference: AsrReference) -> list[GraphSpec]:
    """The LM and its head apart (the host runs the greedy pick), both encoders, the connectors' sum."""
    dims, parts, g = reference.dims, reference.parts, torch.Generator().manual_seed(0)
    hop, latents = dims.acoustic_encoder.hop, (dims.acoustic_encoder.vae_dim, dims.semantic_encoder.vae_dim)
    head_input = (torch.randn(1, dims.lm.hidden, generator=g),)
    connector_inputs = tuple(torch.randn(1, 2, size, generator=g) for size in latents)
    return [
        lm_spec("lm", parts.language_model, dims.lm, g),
        GraphSpec("lm_head", reference.model.lm_head, head_input, ["hidden_states"], ["logits"], ({0: BATCH},)),
        encoder_spec("acoustic_encoder", parts.acoustic_tokenizer_encoder, hop, g),
        encoder_spec("semantic_encoder", parts.semantic_tokenizer_encoder, hop, g),
        GraphSpec("audio_connector", parts.multi_modal_projector, connector_inputs, ["acoustic_latents", "semantic_latents"],
                  ["embeddings"], ({0: BATCH, 1: FRAMES}, {0: BATCH, 1: FRAMES})),
    ]


def host_tensors(files, reference: AsrReference) -> dict[str, np.ndarray]:
    """The token embedding (looked up on the host, one row per token)."""
    return {"embed_tokens": reference.parts.language_model.embed_tokens.weight.detach().numpy()}
