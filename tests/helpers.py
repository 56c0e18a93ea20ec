"""Small helpers for tests that need a modified copy of a synthetic checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file


def copy_checkpoint(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("voices"))
    return dst


def set_tensor(checkpoint: Path, name: str, value: np.ndarray) -> None:
    path = checkpoint / "model.safetensors"
    tensors = load_file(path)
    tensors[name] = np.asarray(value).astype(tensors[name].dtype)
    save_file(tensors, path, metadata={"format": "pt"})


def set_config(checkpoint: Path, section: str, key: str, value) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    (config[section] if section else config)[key] = value
    (checkpoint / "config.json").write_text(json.dumps(config, indent=2))
