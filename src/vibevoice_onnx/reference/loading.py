"""Strict, shard-streaming loading of a checkpoint into the PyTorch reference modules.

Two levels of strictness: the stored tensors must match the layout exactly (0 missing, 0 unexpected, no
shape error), and every renamed key must land on a parameter or buffer of the target module, each of which
must be filled. Tensors are read one at a time from each shard and copied into the module, so loading
needs the module's own memory plus one tensor.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from torch import nn

from ..checkpoints.checkpoint import Checkpoint
from ..checkpoints.files import CheckpointFiles
from ..checkpoints.inspect import check_layout, listing as _listing
from ..checkpoints.names import normalise_key, realtime_to_reference
from ..errors import CheckpointError
from ..families import family, load
from ..runtime.device import MEMORY_ROOM, available_memory

Rename = Callable[[str], "str | None"]  # None: a stored tensor the reference deliberately does not load
HEAD = "lm_head.weight"


HALF = (torch.bfloat16, torch.float16)
COMPACT_MIN_VALUES = 1 << 16  # compact loading keeps tensors this large in their stored half precision


def keeps_stored_dtype(target: str, tensor: torch.Tensor) -> bool:
    """In a compact load: large half-precision weights stay as stored; embedding tables (gathered per token,
    and tied to the LM head) and small tensors become fp32."""
    return tensor.dtype in HALF and tensor.numel() >= COMPACT_MIN_VALUES and not target.endswith("embed_tokens.weight")


class _Upcast(nn.Module):
    def forward(self, stored: torch.Tensor) -> torch.Tensor:
        return stored.float()


def compute_in_fp32(module: nn.Module) -> None:
    """Every half-precision parameter reads as fp32 where a layer uses it: the math is the fp32 reference's
    (bf16 -> fp32 is exact), the memory only the stored weights' plus one layer's fp32 copy at a time."""
    from torch.nn.utils import parametrize

    for sub in list(module.modules()):
        for name, param in list(sub.named_parameters(recurse=False)):
            if param.dtype in HALF:
                parametrize.register_parametrization(sub, name, _Upcast(), unsafe=True)


@dataclass(frozen=True)
class DeferredWeight:
    """A weight left in its shard: the export streams it into the bundle instead of holding the model."""

    shard: Path
    name: str  # as stored
    shape: tuple[int, ...]

    def read(self) -> torch.Tensor:
        with safe_open(str(self.shard), framework="pt") as f:
            return f.get_tensor(self.name)


def placeholder(shape) -> torch.Tensor:
    """A tensor of the right shape that holds no memory (one zero, broadcast): enough to trace a graph."""
    return torch.zeros((), dtype=torch.float32).expand(*shape)


def is_placeholder(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is a placeholder: one value, broadcast (a real weight of more than one value never is)."""
    return tensor.numel() > 1 and all(stride == 0 for stride in tensor.stride())


def _assign(module: nn.Module, target: str, slot: torch.Tensor, value: torch.Tensor) -> None:
    if not slot.is_meta:
        slot.data = value
        return
    # A skeleton built on the meta device: a meta tensor cannot take data, so the parameter itself is replaced.
    owner_name, _, leaf = target.rpartition(".")
    owner = module.get_submodule(owner_name)
    if leaf in owner._parameters:
        owner._parameters[leaf] = nn.Parameter(value, requires_grad=False)
    else:
        owner._buffers[leaf] = value


def load_into(module: nn.Module, files: CheckpointFiles, kind: str, rename: Rename,
              allowed_absent: tuple[str, ...] = (), dtype=torch.float32, compact: bool = False,
              defer: Callable[[str], bool] | None = None) -> dict[str, DeferredWeight]:
    """Fill `module` strictly; `compact` keeps large half-precision weights as stored and computes with them
    in fp32 (compute_in_fp32), for a reference that must fit beside a bundle's sessions. Targets for which
    `defer` is true are checked (name, shape) but not read: they get a placeholder and are returned, by
    target name, for the export to stream (the module may then be a skeleton built on the meta device)."""
    targets = module.state_dict(keep_vars=True)
    filled: set[str] = set()
    unexpected: list[str] = []
    deferred: dict[str, DeferredWeight] = {}
    for shard in files.shards:
        with safe_open(str(files.root / shard), framework="pt") as f:
            for stored_name in f.keys():
                target = rename(normalise_key(kind, stored_name))
                if target is None:
                    continue
                if target not in targets:
                    unexpected.append(f"{stored_name} -> {target}")
                    continue
                slot = targets[target]
                shape = tuple(f.get_slice(stored_name).get_shape())
                if shape != tuple(slot.shape):
                    raise CheckpointError(
                        f"{files.root / shard}: '{stored_name}' has shape {list(shape)}, "
                        f"the reference expects {list(slot.shape)} for '{target}'"
                    )
                with torch.no_grad():
                    if defer is not None and defer(target):
                        deferred[target] = DeferredWeight(files.root / shard, stored_name, shape)
                        value = placeholder(shape)
                    else:
                        tensor = f.get_tensor(stored_name)
                        keep = compact and keeps_stored_dtype(target, tensor)
                        value = tensor.clone() if keep or not slot.dtype.is_floating_point else tensor.to(dtype).clone()
                    _assign(module, target, slot, value)
                filled.add(target)
    missing = sorted(set(targets) - filled - set(allowed_absent))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} reference tensors not filled ({_listing(missing)})")
        if unexpected:
            parts.append(f"{len(unexpected)} stored tensors with no place ({_listing(unexpected)})")
        raise CheckpointError(f"{files.root}: strict load failed: " + "; ".join(parts))
    if compact:
        compute_in_fp32(module)
    return deferred


def fp32_model_fits(files: CheckpointFiles, bytes_per_parameter: int = 4, beside: int = 0) -> bool:
    """Whether this machine can hold the checkpoint's model in fp32 (or at `bytes_per_parameter`: 2 for a
    compact reference) with a margin for activations, next to `beside` bytes of something else."""
    available = available_memory()
    return available is None or files.parameters() * bytes_per_parameter * MEMORY_ROOM + beside <= available


def load_realtime(source: Checkpoint | Path, quiet: bool = False):
    """Load a realtime checkpoint into the fp32 reference RealtimeModel (strict); `quiet`: without the line that
    says so (a checkpoint still being written, whose folder's name is not the user's)."""
    from .realtime import RealtimeModel

    checkpoint = Checkpoint.open(source)
    check_layout(checkpoint)
    dims = checkpoint.dims
    if not checkpoint.family.split_lm:  # RealtimeModel: a text-only LM under the TTS LM
        raise CheckpointError(f"{checkpoint.root}: is a {dims.kind} checkpoint, not realtime")
    if not quiet:
        print(f"loading {checkpoint.root} into the PyTorch reference", file=sys.stderr, flush=True)
    model = RealtimeModel(dims)
    load_into(model, checkpoint.files, dims.kind, realtime_to_reference)
    return model.eval()


def load_transformers_model(source: Checkpoint | Path, compact: bool = False):
    """Load a 1.5B, codes-layout ASR or ASR-HF checkpoint into its transformers 5.23 class (strict); see
    load_into for `compact`."""
    checkpoint = Checkpoint.open(source)
    if checkpoint.family.split_lm:
        return load_realtime(checkpoint)  # transformers has no class for the realtime model
    return _load_hf(checkpoint, compact, None)[0]


def load_skeleton(source: Checkpoint | Path, defer: Callable[[str], bool]) -> tuple[nn.Module, dict[str, DeferredWeight]]:
    """The transformers model with the targets `defer` selects left in the shards (see load_into): only the
    rest is ever in memory, so a 7B model can be exported on a machine that could not hold it in fp32."""
    return _load_hf(Checkpoint.open(source), False, defer)


def stream_layers(model: nn.Module, deferred: dict[str, DeferredWeight], owners: list[str]) -> None:
    """Make a skeleton an exact fp32 reference that never holds its deferred weights: each owner module (an LM
    layer, a head) reads its weights from the shards just before it runs and drops them after, so memory holds
    the rest of the model and one owner. Slow (every call reads the deferred weights once), the same math."""
    for owner in owners:
        names = [target for target in deferred if target.startswith(owner + ".")]

        def load(module, args, names=names):
            for target in names:
                model.get_parameter(target).data = deferred[target].read().to(torch.float32)

        def drop(module, args, output, names=names):
            for target in names:
                model.get_parameter(target).data = placeholder(deferred[target].shape)

        model.get_submodule(owner).register_forward_pre_hook(load)
        model.get_submodule(owner).register_forward_hook(drop)


def _to_transformers(names: str | None, tied_head: bool) -> tuple[Rename, tuple[str, ...]]:
    """(hub name -> the transformers model's, the targets a checkpoint may lack). A tied head is the token
    embedding: the 1.5B ships no tensor for it, the ASR-Streaming 1.5B one that upstream never reads (12.4)."""
    rename = load(names) if names else (lambda name: name)
    if not tied_head:
        return rename, ()
    return (lambda name: None if name == HEAD else rename(name)), (HEAD,)


def _load_hf(checkpoint: Checkpoint, compact: bool, defer):
    report = check_layout(checkpoint)
    files, dims = checkpoint.files, checkpoint.dims
    from .hf_models import build_hf_model

    if defer is None:
        model = build_hf_model(dims)
    else:
        with torch.device("meta"):  # no memory until each tensor is loaded or given its placeholder
            model = build_hf_model(dims)
    rename, allowed_absent = _to_transformers(family(report["kind"]).to_transformers, dims.lm.tied_embeddings)
    deferred = load_into(model, files, dims.kind, rename, allowed_absent, compact=compact, defer=defer)
    # Tied before a skeleton is checked for tensors without data: the head has none of its own.
    if dims.lm.tied_embeddings:
        model.lm_head.weight = model.model.language_model.embed_tokens.weight
    if defer is not None:
        _materialise_computed_buffers(model)
    return model.eval(), deferred


def _materialise_computed_buffers(model: nn.Module) -> None:
    """Buffers no checkpoint stores (rotary inverse frequencies) are computed by their module's constructor:
    a skeleton rebuilds those modules on the CPU."""
    for owner in list(model.modules()):
        for name, child in list(owner.named_children()):
            if any(b.is_meta for b in child.buffers(recurse=False)) and hasattr(child, "config"):
                setattr(owner, name, type(child)(config=child.config))
    left = [name for name, t in model.state_dict(keep_vars=True).items() if t.is_meta]
    left += [name for name, b in model.named_buffers() if b.is_meta]
    if left:
        raise CheckpointError(f"a skeleton model still has tensors without data: {_listing(sorted(set(left)))}")
