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

# Seconds and peak GB per billion parameters of a first use without torch on 2 cores (export.build.build_cost):
# not yet measured at full size; the ASR writer's rates until it is.
BUILD_COST = asr.BUILD_COST
