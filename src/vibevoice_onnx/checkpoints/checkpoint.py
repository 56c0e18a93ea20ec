"""A checkpoint directory opened once: what build, verify, inspect and the reference loaders all read of it.

Opening reads config.json, the weight index and the safetensors headers (files.open_checkpoint); what is
derived from them (the family, the dimensions, the layout) is computed on first use and kept, and so is the
hash, which reads every weight byte. Pass the object down rather than the path, so nothing reopens it.
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path

from ..families import Family, recognise
from .configs import ModelDims, model_dims
from .files import CheckpointFiles, StoredTensor, checkpoint_hash, open_checkpoint
from .layouts import Layout, layout_for
from .names import normalise_key


class Checkpoint:
    def __init__(self, files: CheckpointFiles):
        self.files = files

    @classmethod
    def open(cls, source: Checkpoint | str | os.PathLike) -> Checkpoint:
        """`source` opened, or returned unchanged when it is already open (so public functions take either)."""
        return source if isinstance(source, Checkpoint) else cls(open_checkpoint(Path(source)))

    @property
    def root(self) -> Path:
        return self.files.root

    @property
    def config(self) -> dict:
        return self.files.config

    @property
    def config_source(self) -> str:
        """How errors about config.json name it."""
        return str(self.root / "config.json")

    @cached_property
    def family(self) -> Family:
        return recognise(self.config, self.config_source)

    @cached_property
    def dims(self) -> ModelDims:
        return model_dims(self.config, self.config_source)

    @property
    def kind(self) -> str:
        return self.family.name

    @cached_property
    def stored(self) -> dict[str, StoredTensor]:
        """The stored tensors by the names the layouts use (some kinds' hub names are normalised)."""
        return {normalise_key(self.kind, name): t for name, t in self.files.tensors.items()}

    @cached_property
    def layout(self) -> Layout:
        return layout_for(self.dims, set(self.stored))

    @cached_property
    def hash(self) -> str:
        """sha256 over config.json and the weight files, as bundles record it; read once, on first use."""
        return checkpoint_hash(self.root, self.files)

    def __fspath__(self) -> str:  # helpers that only need the directory (copies, tokenizer lookup) take it as a path
        return str(self.root)

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.root)!r})"
