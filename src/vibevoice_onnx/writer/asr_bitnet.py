"""A VibeVoice-ASR-BitNet bundle written from the checkpoint without PyTorch (the graphs of export/asr_bitnet.py):
the ASR graphs (writer/asr.py), the seven projections of every LM layer as the reference's BitLinear, their ternary
codes computed from the F32 latent weights as each is read and packed as 2-bit MatMulNBits over int8 activations
headed by 127s, exactly (export.precision.pack_ternary's form, written tensor by tensor: the fp32 LM never
exists)."""

from __future__ import annotations

from functools import partial

from . import asr

graphs = partial(asr.graphs, ternary=True)
host_tensors = asr.host_tensors

# Seconds and peak GB per billion parameters of a first use without torch on 2 cores (export.build.build_cost),
# measured on the full-size synthetic checkpoint (2.81 B values, F32; AMD EPYC, 2026-12-07): fp32 written in 71 s at
# 1.92 GB; int8: the fp32 teacher, then int8 written in 97 s at 2.18 GB and its gates against the teacher in 64 s at
# 4.67 GB (benchmarks/results/2026-12-07-asr-bitnet-full-without-torch.json).
BUILD_COST = {"fp32": (25.3, 0.68), "int8": (82.6, 1.66)}
