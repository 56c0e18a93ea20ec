"""How a bundle's graphs are made, as manifests record it under tools["graphs"], and whether this install can trace
them: what the runtime's side (the bundle cache) asks before a build, without importing onnx or torch."""

from __future__ import annotations

# traced from the PyTorch reference by torch.onnx, or written from the checkpoint by the torch-free writer (writer/)
TRACED, WRITTEN = "torch.onnx", "vibevoice-onnx writer"


def torch_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("torch") is not None
    except ImportError:  # an import hook that refuses it
        return False
