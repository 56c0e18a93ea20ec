"""What a VibeVoice-ASR bundle holds (either hub layout; the same graphs from the same weights): the language
model with KV cache, its head, both encoders (streaming: a segment of any length with its conv states in and
out) and the connectors' sum, from transformers' model loaded strictly.

The LM's layers and its head (7.6 B of the 8.3 B parameters at full size) are never loaded: the model is a
skeleton with placeholders there, and the export streams those weights from the shards (export/streaming.py),
quantizing them on the way for int8 and int4, so a build peaks far below the fp32 model's 33 GB."""

from __future__ import annotations

import numpy as np
import torch

from ..reference.asr import AsrReference
from .graphs import BATCH, FRAMES, GraphSpec, lm_spec, streaming_encoder_spec
from .streaming import deferred_weights as streamed_weights  # noqa: F401 (the build streams these)

# Seconds and peak GB per billion parameters of a first build + verify on 2 cores (build_cost), from the
# full-size synthetic ASR (8.7 B parameters; int8 build 452 s at 20.6 GB, verify 265 s at 22.1 GB, docs/benchmarks.md).
BUILD_COST = {"fp32": (85.0, 2.6)}


def load_model(checkpoint) -> AsrReference:
    from ..reference.asr import load_asr_skeleton

    return load_asr_skeleton(checkpoint)


def graph_specs(reference: AsrReference) -> list[GraphSpec]:
    """The LM and its head apart (the host runs the greedy pick), both encoders with their conv states, the
    connectors' sum."""
    dims, parts, g = reference.dims, reference.parts, torch.Generator().manual_seed(0)
    hop, latents = dims.acoustic_encoder.hop, (dims.acoustic_encoder.vae_dim, dims.semantic_encoder.vae_dim)
    head_input = (torch.randn(1, dims.lm.hidden, generator=g),)
    connector_inputs = tuple(torch.randn(1, 2, size, generator=g) for size in latents)
    return [
        lm_spec("lm", parts.language_model, dims.lm, g),
        GraphSpec("lm_head", reference.model.lm_head, head_input, ["hidden_states"], ["logits"], ({0: BATCH},)),
        # One graph per encoder serves both of upstream's paths: up to 60 s in one pass (one segment from zero
        # states is exactly upstream's non-streaming padding), longer audio in 60 s segments with the states.
        streaming_encoder_spec("acoustic_encoder_stream", parts.acoustic_tokenizer_encoder, hop, g, any_length=True),
        streaming_encoder_spec("semantic_encoder_stream", parts.semantic_tokenizer_encoder, hop, g, any_length=True),
        GraphSpec("audio_connector", parts.multi_modal_projector, connector_inputs, ["acoustic_latents", "semantic_latents"],
                  ["embeddings"], ({0: BATCH, 1: FRAMES}, {0: BATCH, 1: FRAMES})),
    ]


def host_tensors(files, reference: AsrReference) -> dict[str, np.ndarray]:
    """The token embedding (looked up on the host, one row per token)."""
    return {"embed_tokens": reference.parts.language_model.embed_tokens.weight.detach().numpy()}
