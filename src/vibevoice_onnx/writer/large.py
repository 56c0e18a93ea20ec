"""A VibeVoice-Large bundle written without PyTorch: the 1.5B's graphs (writer/tts15b.py) from the 7B's weights,
each tensor read as it is written, and with its untied head's rows in their stored dtype beside the embedding
(export/large.py's host tensors)."""

from __future__ import annotations

import numpy as np

from .tts15b import BUILD_COST, graphs  # noqa: F401 (the 1.5B's graphs; its rates until the 7B's are measured)
from .tts15b import host_tensors as tts15b_host_tensors


def host_tensors(checkpoint) -> dict[str, np.ndarray]:
    return {**tts15b_host_tensors(checkpoint), "lm_head": checkpoint.files.read("lm_head.weight")}
