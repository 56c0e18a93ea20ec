"""A VibeVoice-ASR bundle's five graphs and host tensors, written from the checkpoint without PyTorch (the graphs of
export/asr.py): the LM, its head (untied, or the embedding where the config ties it), both encoders streaming
a segment of any length with their conv states, and the connectors' sum. Both hub layouts: transformers' names are
read through the upstream ones they map from (checkpoints.names), so one writer serves ASR, ASR-HF and
ASR-Streaming."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np

from ..checkpoints.layouts import asr_codes_layout
from ..checkpoints.names import asr_codes_to_hf
from ..families import family
from . import write_graph
from .blocks import F32, Weights, connector, encoder_stream, gemm, language_model, lm_weight_bytes

LM, EMBEDDING = "model.language_model.", "model.language_model.embed_tokens.weight"


def upstream_weights(checkpoint) -> Weights:
    """The checkpoint's tensors by upstream name, whichever layout it stores."""
    if not family(checkpoint.kind).transformers_names:
        return Weights(checkpoint.files)
    # The upstream layout's names, each mapped to the stored one; its decoder (which transformers' layout lacks, so
    # its dims are the encoder's here) maps to none. The checkpoint's tensors are found by their normalised names
    # (`model.*`, whichever of transformers' spellings the file uses: its own save_pretrained writes llava-style
    # prefixes), each read under the name the file gives it.
    dims = replace(checkpoint.dims, acoustic_decoder=checkpoint.dims.acoustic_encoder)
    hf = {t.name: asr_codes_to_hf(t.name) for t in asr_codes_layout(dims).tensors}
    in_file = {upstream: checkpoint.stored[name].name if name in checkpoint.stored else name
               for upstream, name in hf.items() if name is not None}
    return Weights(checkpoint.files, stored=in_file)


def graphs(checkpoint, directory: Path, log: Callable[[str], None], schemes: dict,
           ternary: bool = False) -> dict[str, tuple[Path, dict]]:
    """Every graph of the bundle, written into `directory` with its weights quantized as `schemes` (graph ->
    export.precision's Scheme; a graph not named stays fp32) says: {name: (path, manifest additions)}. `ternary`:
    the LM's projections are BitNet's (writer/asr_bitnet.py)."""
    dims, weights = checkpoint.dims, upstream_weights(checkpoint)
    lm = weights.under(LM)
    head_name = "model.language_model.embed_tokens" if dims.lm.tied_embeddings else "lm_head"
    encoders = {"acoustic": (weights.under("model.acoustic_tokenizer.encoder."), dims.acoustic_encoder),
                "semantic": (weights.under("model.semantic_tokenizer.encoder."), dims.semantic_encoder)}
    connectors = {modality: weights.under(f"model.{modality}_connector.") for modality in encoders}

    def lm_head(g):
        x = g.input("hidden_states", F32, ["batch", dims.lm.hidden])
        g.output(gemm(g, x, weights, head_name), "logits", F32, ["batch", dims.lm.vocab])

    def audio_connector(g):
        summed = [connector(g, g.input(f"{modality}_latents", F32, ["batch", "frames", encoders[modality][1].vae_dim]),
                            connectors[modality]) for modality in encoders]
        g.output(g.op("Add", *summed), "embeddings", F32, ["batch", "frames", dims.lm.hidden])

    def encoder_graph(modality: str):
        w, d = encoders[modality]
        return lambda g: encoder_stream(g, w, d, any_length=True)

    plan = [
        ("lm", lm_weight_bytes(lm), lambda g: language_model(g, lm, dims.lm, final_norm=True, ternary=ternary)),
        ("lm_head", weights.nbytes([head_name + ".weight"]), lm_head),
        *((f"{modality}_encoder_stream", encoders[modality][0].nbytes(), encoder_graph(modality)) for modality in encoders),
        ("audio_connector", sum(c.nbytes() for c in connectors.values()), audio_connector),
    ]
    return {name: write_graph(name, directory, size, body, log, schemes.get(name)) for name, size, body in plan}


def host_tensors(checkpoint) -> dict[str, np.ndarray]:
    """The token embedding in fp32 (export/asr.py's: looked up on the host, one row per token)."""
    return {"embed_tokens": upstream_weights(checkpoint)(EMBEDDING)}


# Seconds and peak GB per billion parameters of a first use without torch on 2 cores (export.build.build_cost):
# not yet measured at full size. Seconds: the realtime writer's rates. int8's peak: its gates hold the whole fp32
# teacher in a phase, as the 1.5B's do (measured there: 3.6 GB per billion, writer/tts15b.py).
BUILD_COST = {"fp32": (25.0, 0.8), "int8": (110.0, 3.6)}
