"""A VibeVoice-1.5B bundle's eight graphs and host tensors, written from the checkpoint without PyTorch (the graphs
of export/tts15b.py, operator for operator where it matters: the same products, norms and convs)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from . import write_graph
from .blocks import (Weights, decoder_stream, encoder, encoder_stream, head_conditioning, head_step, language_model,
                     lm_weight_bytes, speech_connector, speech_host_tensors)

ACOUSTIC, SEMANTIC = "model.acoustic_tokenizer.", "model.semantic_tokenizer."


def graphs(checkpoint, directory: Path, log: Callable[[str], None], schemes: dict) -> dict[str, tuple[Path, dict]]:
    """Every graph of the bundle, written into `directory` with its weights quantized as `schemes` (graph ->
    export.precision's Scheme; a graph not named stays fp32) says: {name: (path, manifest additions)}."""
    dims, weights = checkpoint.dims, Weights(checkpoint.files)
    lm, head = weights.under("model.language_model."), weights.under("model.prediction_head.")
    acoustic_encoder, decoder = weights.under(ACOUSTIC + "encoder."), weights.under(ACOUSTIC + "decoder.")
    semantic_encoder = weights.under(SEMANTIC + "encoder.")
    connectors = {name: (weights.under(f"model.{name}."), encoder_dims.vae_dim) for name, encoder_dims in
                  (("acoustic_connector", dims.acoustic_encoder), ("semantic_connector", dims.semantic_encoder))}

    def connector_graph(name: str):
        w, width = connectors[name]
        return lambda g: speech_connector(g, w, width, dims.lm.hidden)

    plan = [
        ("lm", lm_weight_bytes(lm), lambda g: language_model(g, lm, dims.lm, final_norm=True)),
        ("diffusion_head_conditioning", head.nbytes(), lambda g: head_conditioning(g, head, dims.head)),
        ("diffusion_head_step", head.nbytes(), lambda g: head_step(g, head, dims.head)),
        *((name, connectors[name][0].nbytes(), connector_graph(name)) for name in connectors),
        ("acoustic_encoder", acoustic_encoder.nbytes(), lambda g: encoder(g, acoustic_encoder, dims.acoustic_encoder)),
        ("acoustic_decoder_stream", decoder.nbytes(), lambda g: decoder_stream(g, decoder, dims.acoustic_decoder)),
        ("semantic_encoder_stream", semantic_encoder.nbytes(),
         lambda g: encoder_stream(g, semantic_encoder, dims.semantic_encoder)),
    ]
    return {name: write_graph(name, directory, size, body, log, schemes.get(name)) for name, size, body in plan}


def host_tensors(checkpoint) -> dict[str, np.ndarray]:
    """The token embedding (the tied head's four choice rows come from it) and the latent scale and bias."""
    return speech_host_tensors(checkpoint.files)


# Seconds and peak GB per billion parameters of a build without torch on 2 cores (export.build.build_cost),
# measured on the full-size synthetic checkpoint (2.70 B parameters; AMD EPYC, 2026-12-07): fp32 written in 63 s at
# 0.99 GB (`build --graphs written`, /usr/bin/time); int8, a first use: the fp32 teacher and the int8 bundle written
# and the int8 gates run against the teacher in 427 s, at 9.65 GB (a phase holding the whole fp32 teacher;
# benchmarks/results/2026-12-07-first-use-1.5b-default-int8-without-torch.json).
BUILD_COST = {"fp32": (23.0, 0.37), "int8": (158.0, 3.6)}
