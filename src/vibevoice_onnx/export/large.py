"""What a VibeVoice-Large bundle holds: the 1.5B's graphs (export/tts15b.py) from the 7B's weights, built within
a bounded memory.

The LM's 28 layers and its untied head (7.1 of the 9.3 B parameters, 28 GB in fp32) are never loaded: the model
is a skeleton with placeholders there, and the export streams the layers' weights from the shards
(export/streaming.py), quantized on the way. The diffusion head, the tokenizers and the connectors (1.8 B
parameters) are held and exported as the 1.5B's are."""

from __future__ import annotations

import numpy as np

from ..reference.tts15b import Tts15bReference
from .streaming import deferred_weights as streamed_weights  # noqa: F401 (the build streams these)
from .tts15b import graph_specs  # noqa: F401 (the 1.5B's graphs)
from .tts15b import host_tensors as tts15b_host_tensors

# Seconds and peak GB per billion parameters of a first build + verify on 2 cores (build_cost), from the
# full-size synthetic 7B (9.3 B parameters; int8 build at a 15.5 GB peak, verify at 22 GB, docs/benchmarks.md).
BUILD_COST = {"fp32": (160.0, 2.5)}


def load_model(checkpoint) -> Tts15bReference:
    from ..reference.tts15b import load_tts15b_skeleton

    return load_tts15b_skeleton(checkpoint)


def host_tensors(files, reference: Tts15bReference) -> dict[str, np.ndarray]:
    """The 1.5B's host tensors and the untied head in its stored dtype, memory-mapped at run time like the
    embedding: the loop reads only the rows of the four tokens it picks from (facts sheet 11.8)."""
    return {**tts15b_host_tensors(files, reference), "lm_head": files.read("lm_head.weight")}
