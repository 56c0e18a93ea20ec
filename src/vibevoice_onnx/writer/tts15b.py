"""A VibeVoice-1.5B bundle's eight graphs and host tensors, written from the checkpoint without PyTorch (the graphs
of export/tts15b.py, operator for operator where it matters: the same products, norms and convs)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from . import write_graph
from .blocks import (F32, Weights, connector, decoder_stream, encoder, encoder_stream, head_conditioning, head_step,
                     language_model)

ACOUSTIC, SEMANTIC = "model.acoustic_tokenizer.", "model.semantic_tokenizer."


def graphs(checkpoint, directory: Path, log: Callable[[str], None], schemes: dict) -> dict[str, tuple[Path, dict]]:
    """Every graph of the bundle, written into `directory` with its weights quantized as `schemes` (graph ->
    export.precision's Scheme; a graph not named stays fp32) says: {name: (path, manifest additions)}."""
    dims, weights = checkpoint.dims, Weights(checkpoint.files)
    lm, head = weights.under("model.language_model."), weights.under("model.prediction_head.")
    acoustic_encoder, decoder = weights.under(ACOUSTIC + "encoder."), weights.under(ACOUSTIC + "decoder.")
    semantic_encoder = weights.under(SEMANTIC + "encoder.")
    connectors = {name: weights.under(f"model.{name}.") for name in ("acoustic_connector", "semantic_connector")}
    widths = {"acoustic_connector": dims.acoustic_encoder.vae_dim, "semantic_connector": dims.semantic_encoder.vae_dim}

    def speech_connector(name: str):
        def body(g):
            x = g.input("latents", F32, ["batch", "frames", widths[name]])
            g.output(connector(g, x, connectors[name]), "embeddings", F32, ["batch", "frames", dims.lm.hidden])
        return body

    plan = [
        ("lm", lm.nbytes() - lm.nbytes(["embed_tokens.weight"]),
         lambda g: language_model(g, lm, dims.lm, final_norm=True)),
        ("diffusion_head_conditioning", head.nbytes(), lambda g: head_conditioning(g, head, dims.head)),
        ("diffusion_head_step", head.nbytes(), lambda g: head_step(g, head, dims.head)),
        *((name, connectors[name].nbytes(), speech_connector(name)) for name in connectors),
        ("acoustic_encoder", acoustic_encoder.nbytes(), lambda g: encoder(g, acoustic_encoder, dims.acoustic_encoder)),
        ("acoustic_decoder_stream", decoder.nbytes(), lambda g: decoder_stream(g, decoder, dims.acoustic_decoder)),
        ("semantic_encoder_stream", semantic_encoder.nbytes(),
         lambda g: encoder_stream(g, semantic_encoder, dims.semantic_encoder)),
    ]
    return {name: write_graph(name, directory, size, body, log, schemes.get(name)) for name, size, body in plan}


def host_tensors(checkpoint) -> dict[str, np.ndarray]:
    """The token embedding (in its stored dtype; the tied head's four choice rows come from it) and the latent
    scale and bias (export/tts15b.py's)."""
    files = checkpoint.files
    return {
        "embed_tokens": files.read("model.language_model.embed_tokens.weight"),
        "speech_scaling_factor": np.asarray(files.read("model.speech_scaling_factor")).astype(F32),
        "speech_bias_factor": np.asarray(files.read("model.speech_bias_factor")).astype(F32),
    }


# Seconds and peak GB per billion parameters of a build without torch on 2 cores (export.build.build_cost),
# measured on the full-size synthetic checkpoint (2.70 B parameters; AMD EPYC, 2026-12-07): fp32 written in 63 s at
# 0.99 GB (`build --graphs written`, /usr/bin/time). int8 is not measured at full size: the realtime writer's rate.
BUILD_COST = {"fp32": (23.0, 0.37), "int8": (110.0, 1.8)}
