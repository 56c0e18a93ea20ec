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


BLOCK_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError(f"blocked import of {name}")
sys.meta_path.insert(0, Block())
"""


def run_torch_free(code: str):
    """Run `code` in a fresh interpreter where torch and transformers cannot be imported; it must end with
    neither loaded. Returns the completed process (stdout has "torch-free ok" when all went well)."""
    import subprocess
    import sys

    check = """
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
assert not loaded, loaded
print("torch-free ok")
"""
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH + code + check], capture_output=True, text=True)
