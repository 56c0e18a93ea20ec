"""Open a checkpoint directory: its config, its weight index and the safetensors headers.

Only headers are read (safetensors validates that the header covers the file exactly, so a truncated file
is caught here), which keeps `inspect` fast on a 16 GB checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from safetensors import SafetensorError, safe_open

from ..errors import CheckpointError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class StoredTensor:
    name: str
    shape: tuple[int, ...]
    dtype: str  # safetensors spelling: BF16, F32, F16, ...
    file: str  # shard file name inside the checkpoint directory


@dataclass(frozen=True)
class CheckpointFiles:
    root: Path
    config: dict
    shards: tuple[str, ...]
    tensors: dict[str, StoredTensor]
    sharded: bool

    def total_bytes(self) -> int:
        return sum((self.root / s).stat().st_size for s in self.shards)

    def parameters(self) -> int:
        """Values the stored tensors hold."""
        return sum(math.prod(t.shape) for t in self.tensors.values())

    def read(self, name: str):
        """One stored tensor as a numpy array in its stored dtype (bf16 through ml_dtypes)."""
        import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy for safetensors)

        stored = self.tensors[name]
        with safe_open(str(self.root / stored.file), framework="numpy") as f:
            return f.get_tensor(stored.name)


def read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: {what} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: {what} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: {what} must hold a JSON object")
    return data


def read_config(root: Path) -> dict:
    root = Path(root)
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a directory")
    if not (root / "config.json").is_file():
        raise CheckpointError(f"{root}: no config.json, so this is not a VibeVoice checkpoint directory")
    return read_json(root / "config.json", "config.json")


def shard_headers(path: Path) -> list[StoredTensor]:
    try:
        with safe_open(str(path), framework="numpy") as f:
            out = []
            for name in f.keys():
                s = f.get_slice(name)
                out.append(StoredTensor(name, tuple(s.get_shape()), s.get_dtype(), path.name))
            return out
    except SafetensorError as e:
        raise CheckpointError(f"{path}: truncated or corrupt safetensors file ({e})") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None


def open_checkpoint(root: Path) -> CheckpointFiles:
    root = Path(root)
    config = read_config(root)
    index_path = root / INDEX_FILE
    if index_path.is_file():
        index = read_json(index_path, "weight index")
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index_path}: no 'weight_map' in the weight index")
        shards = tuple(dict.fromkeys(weight_map.values()))
        for shard in shards:
            if not (root / shard).is_file():
                raise CheckpointError(f"{root / shard}: shard named in {INDEX_FILE} is missing")
        sharded = True
    elif (root / SINGLE_FILE).is_file():
        weight_map, shards, sharded = None, (SINGLE_FILE,), False
    else:
        raise CheckpointError(f"{root}: neither {SINGLE_FILE} nor {INDEX_FILE} is present")

    tensors: dict[str, StoredTensor] = {}
    for shard in shards:
        for t in shard_headers(root / shard):
            if t.name in tensors:
                raise CheckpointError(f"{root / shard}: tensor '{t.name}' is also stored in {tensors[t.name].file}")
            tensors[t.name] = t
    if weight_map is not None:
        for name, shard in weight_map.items():
            stored = tensors.get(name)
            if stored is None or stored.file != shard:
                raise CheckpointError(f"{index_path}: lists '{name}' in {shard}, but that shard does not hold it")
        stray = sorted(set(tensors) - set(weight_map))
        if stray:
            raise CheckpointError(f"{root / tensors[stray[0]].file}: holds '{stray[0]}', which {INDEX_FILE} does not list")
    return CheckpointFiles(root, config, shards, tensors, sharded)


def checkpoint_hash(root: Path, files: CheckpointFiles) -> str:
    """The checkpoint's identity: sha256 over config.json and its weight files, as bundles record it."""
    digest = hashlib.sha256()
    for name in ("config.json", *files.shards):
        with open(Path(root) / name, "rb") as f:
            while block := f.read(16 * 2**20):
                digest.update(block)
    return "sha256:" + digest.hexdigest()


def edited_copy(root: Path, out: Path, edits: dict[str, Callable]) -> Path:
    """A copy of the checkpoint at `root` in `out` with some tensors changed: `edits` maps a tensor's name to
    a function of its fp32 values, whose result is stored back in the tensor's own dtype and shard (the index
    and every other tensor unchanged). For checkpoints a test or a benchmark derives from a synthetic one."""
    import shutil

    import ml_dtypes  # noqa: F401 (numpy reads and writes bfloat16 through it)
    import numpy as np
    from safetensors.numpy import load_file, save_file

    files = open_checkpoint(root)
    missing = sorted(set(edits) - set(files.tensors))
    if missing:
        raise CheckpointError(f"{root}: has no tensor {', '.join(missing)}")
    shutil.copytree(root, out)
    for shard in sorted({files.tensors[name].file for name in edits}):
        tensors = load_file(str(out / shard))
        for name, edit in edits.items():
            if files.tensors[name].file == shard:
                stored = tensors[name]
                tensors[name] = np.asarray(edit(stored.astype(np.float32))).astype(stored.dtype)
        save_file(tensors, str(out / shard), metadata={"format": "pt"})
    return out
