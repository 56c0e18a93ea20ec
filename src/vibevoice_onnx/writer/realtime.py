"""A realtime bundle's seven graphs and host tensors, written from the checkpoint without PyTorch (the graphs
of export/realtime.py, operator for operator)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from . import write_graph
from .blocks import (F32, Weights, decoder_stream, gemm, head_conditioning, head_step, language_model, lm_weight_bytes,
                     speech_connector, speech_host_tensors)

DECODER = "model.acoustic_tokenizer.decoder."
HEAD = "model.prediction_head."


def graphs(checkpoint, directory: Path, log: Callable[[str], None], schemes: dict) -> dict[str, tuple[Path, dict]]:
    """Every graph of the bundle, written into `directory` with its weights quantized as `schemes` (graph ->
    export.precision's Scheme; a graph not named stays fp32) says: {name: (path, manifest additions)}."""
    dims, weights = checkpoint.dims, Weights(checkpoint.files)
    lower, upper = weights.under("model.language_model."), weights.under("model.tts_language_model.")
    head, decoder = weights.under(HEAD), weights.under(DECODER)
    connector_weights, eos = weights.under("model.acoustic_connector."), weights.under("tts_eos_classifier.")
    hidden, latent = dims.lm.hidden, dims.head.latent

    def eos_classifier(g):
        x = g.input("hidden_states", F32, ["batch", hidden])
        logits = gemm(g, g.op("Relu", gemm(g, x, eos, "fc1", bias=True)), eos, "fc2", bias=True)
        g.output(logits, "logits", F32, ["batch", 1])

    plan = [
        ("lower_lm", lm_weight_bytes(lower), lambda g: language_model(g, lower, dims.lm, final_norm=False)),
        ("upper_lm", lm_weight_bytes(upper), lambda g: language_model(g, upper, dims.tts_lm, final_norm=True)),
        ("diffusion_head_conditioning", head.nbytes(), lambda g: head_conditioning(g, head, dims.head)),
        ("diffusion_head_step", head.nbytes(), lambda g: head_step(g, head, dims.head)),
        ("acoustic_connector", connector_weights.nbytes(),
         lambda g: speech_connector(g, connector_weights, latent, hidden)),
        ("eos_classifier", eos.nbytes(), eos_classifier),
        ("acoustic_decoder_stream", decoder.nbytes(), lambda g: decoder_stream(g, decoder, dims.acoustic_decoder)),
    ]
    return {name: write_graph(name, directory, size, body, log, schemes.get(name)) for name, size, body in plan}


def host_tensors(checkpoint) -> dict[str, np.ndarray]:
    """The text embedding (in its stored dtype), the type rows, the latent scale and bias (export/realtime.py's)."""
    return {**speech_host_tensors(checkpoint.files),
            "tts_input_types": Weights(checkpoint.files)("model.tts_input_types.weight")}


# Seconds and peak GB per billion parameters of a first use without torch on 2 cores (export.build.build_cost),
# measured on the full-size synthetic checkpoint (1.02 B parameters; benchmarks/first_use.py --without-torch,
# 2026-12-07, AMD EPYC): fp32 written in 18 s at 0.6 GB (not verified without torch); int8 (the fp32 teacher
# written first, the int8 bundle, its gates against the teacher one phase at a time) 111 s at 1.8 GB.
BUILD_COST = {"fp32": (25.0, 0.8), "int8": (110.0, 1.8)}
