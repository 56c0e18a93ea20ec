"""`vibevoice-onnx make-checkpoint`: synthetic checkpoints in the exact hub layout of each kind.

Weights are random but non-degenerate: whatever upstream initialises to zero or 1e-6 (adaLN modulation,
final layers, layer-scale gammas) and the NaN-initialised scaling buffers get values that make every
sub-block contribute, so parity checks on these checkpoints cannot pass trivially. Each tensor is drawn
from its own seeded stream, and shards are written one at a time so memory stays bounded by a shard.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Callable

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from ..errors import VibeVoiceError
from ..families import FAMILIES, family, load
from ..options import check
from ..outputs import atomic_directory
from .configs import (
    PREPROCESSOR_CONFIG, full_config, model_dims, tiny_config, tts_preprocessor,
)
from .files import INDEX_FILE, SINGLE_FILE
from .layouts import (
    BIAS, CONV, EMBED_TOKENS, EMBEDDING, EOS_BIAS, LAYER_SCALE, LINEAR, NORM, SCALING, SHIFT, TIED, WAVEFORM, Layout,
    TensorSpec, layout_for,
)
from .tokenizer import build_tokenizer

DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}


def shard_count(layout: Layout) -> int:
    """The hub checkpoint's shard count (its family's; ~2 GB each at full size). Tiny checkpoints keep the
    counts, so the sharded loading path is exercised in tests."""
    return family(layout.kind).shard_count(layout.dims.lm.tied_embeddings)
EOS_LOGIT_BIAS = -2.0  # with random weights the EOS logit has std ~1: EOS fires now and then, not at once


def _fan_in(spec: TensorSpec) -> int:
    if spec.init == CONV and "convtr" in spec.name:
        return spec.shape[0] * 2  # ConvTranspose1d [in, out, 2r] with stride r: each output sees in·2 taps
    return math.prod(spec.shape[1:]) or 1


def init_tensor(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    normal = lambda std: rng.standard_normal(spec.shape, dtype=np.float32) * np.float32(std)  # noqa: E731
    if spec.init in (LINEAR, CONV):
        return normal(1.0 / math.sqrt(_fan_in(spec)))
    if spec.init == EMBEDDING:
        return normal(0.5)
    if spec.init == NORM:
        return 1.0 + normal(0.1)
    if spec.init == BIAS:
        return normal(0.05)
    if spec.init == LAYER_SCALE:
        return rng.uniform(0.05, 0.3, spec.shape).astype(np.float32)
    if spec.init == SCALING:
        return np.asarray(rng.uniform(0.15, 0.35), dtype=np.float32)
    if spec.init == SHIFT:
        return np.asarray(rng.choice([-1.0, 1.0]) * rng.uniform(0.05, 0.2), dtype=np.float32)
    if spec.init == WAVEFORM:
        return normal(0.01 / math.sqrt(_fan_in(spec)))
    if spec.init == EOS_BIAS:
        return np.full(spec.shape, EOS_LOGIT_BIAS, dtype=np.float32)
    raise ValueError(f"no initialiser for {spec.init}")


def plan_shards(layout: Layout, itemsize: int, count: int) -> list[list[TensorSpec]]:
    """Split the tensors, in layout order, into `count` shards of roughly equal size: exactly `count`, as the hub
    has, even where a few tensors dwarf the rest (a tiny checkpoint's embedding): the fullest shards split."""
    target = layout.parameters * itemsize / count
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in layout.tensors:
        if shards[-1] and len(shards) < count and size >= target:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec.numel * itemsize
    while len(shards) < min(count, len(layout.tensors)):
        fullest = max(range(len(shards)), key=lambda i: len(shards[i]))
        half = len(shards[fullest]) // 2
        shards[fullest : fullest + 1] = [shards[fullest][:half], shards[fullest][half:]]
    return shards


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


Adjust = Callable[[TensorSpec, np.ndarray], np.ndarray]


def speaking_lm(special_ids: dict[str, int]) -> Adjust:
    """Make a random 1.5B or Large LM speak: with a tied head a random LM repeats its last input token, so after
    the prompt's `<|vision_start|>` it would pick `<|vision_start|>` forever and never produce audio. The
    `<|vision_pad|>` row becomes 1.5x the `<|vision_start|>` row (so it wins whenever start would), and both
    connectors' output biases lean toward it (so generated speech asks for more speech). Large's untied head
    gets the same two rows, each its embedding row plus a random one of its own (so the untied rows are not
    the embedding's, and tying them would change the logits). It never learned to end a turn: speak caps the
    length with --max-frames."""
    start, pad = special_ids["<|vision_start|>"], special_ids["<|vision_pad|>"]
    rows: dict[str, np.ndarray] = {}

    def adjust(spec: TensorSpec, value: np.ndarray) -> np.ndarray:
        if spec.name == "model.language_model.embed_tokens.weight":
            value[pad] = 1.5 * value[start]
            rows["start"], rows["pad"] = value[start].copy(), value[pad].copy()
        elif spec.name == "lm_head.weight":
            value[start] = rows["start"] + 0.25 * value[start] / value[start].std() * rows["start"].std()
            value[pad] = 1.5 * value[start]
        elif spec.name in ("model.acoustic_connector.fc2.bias", "model.semantic_connector.fc2.bias"):
            value = value + rows["pad"]
        return value

    return adjust


def write_weights(layout: Layout, out: Path, seed: int, dtype: str, adjust: Adjust | None = None) -> list[str]:
    np_dtype = DTYPES[dtype]
    index = {spec.name: i for i, spec in enumerate(layout.tensors)}
    by_name = layout.by_name()
    shards = plan_shards(layout, np.dtype(np_dtype).itemsize, shard_count(layout))
    names = [SINGLE_FILE] if len(shards) == 1 else [
        f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))
    ]
    weight_map, total = {}, 0
    for shard_name, specs in zip(names, shards):
        tensors = {}
        for spec in specs:
            drawn = by_name[EMBED_TOKENS] if spec.init == TIED else spec  # a tied copy: the embedding's own draw
            value = init_tensor(drawn, np.random.default_rng([seed, index[drawn.name]]))
            tensors[spec.name] = (adjust(spec, value) if adjust else value).astype(np_dtype)
            weight_map[spec.name] = shard_name
            total += tensors[spec.name].nbytes
        _log(f"  writing {shard_name}: {len(specs)} tensors")
        save_file(tensors, str(out / shard_name), metadata={"format": "pt"})
        del tensors
    if len(names) > 1:
        (out / INDEX_FILE).write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n"
        )
    return names


def make_checkpoint(kind: str, out: Path, size: str = "tiny", seed: int = 0, dtype: str | None = None,
                    extras: Callable[[Path], None] | None = None, variant: str | None = None) -> Layout:
    """Write the checkpoint into `out` atomically; `extras(directory)` may add files before it lands.
    `variant`: ASR-Streaming's size, 1.5b (default) or 7b. `dtype`: the weights' (default: the hub checkpoint's)."""
    facts = family(kind)
    dtype = dtype or facts.dtype
    if size not in ("tiny", "full"):
        raise VibeVoiceError(f"unknown size '{size}' (expected tiny or full)")
    if dtype not in DTYPES:
        raise VibeVoiceError(f"unknown dtype '{dtype}' (expected one of {', '.join(DTYPES)})")
    seed = check("seed", seed)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise VibeVoiceError(f"{out}: {'directory is not empty' if out.is_dir() else 'is a file'}; choose a new output directory")
    sizes = load(facts.variants) if facts.variants else None
    if variant is not None and sizes is None:
        sized = " or ".join(f.name for f in FAMILIES if f.variants)
        raise VibeVoiceError(f"--variant is for {sized} checkpoints; {kind} has one size")
    variant = variant or (sizes[0] if sizes else None)
    tokenizer, special_ids = build_tokenizer(size, load(facts.added_tokens) if facts.added_tokens else None)
    config = full_config(kind, variant) if size == "full" else tiny_config(kind, 512, special_ids, variant)
    if dtype != "bfloat16":  # the configs say bfloat16, as most hub checkpoints are
        for section in [config, *(v for v in config.values() if isinstance(v, dict))]:
            for key in ("torch_dtype", "dtype"):
                if key in section:
                    section[key] = dtype
    layout = layout_for(model_dims(config))
    _log(f"making a {size} synthetic {kind} checkpoint in {out}: {len(layout.tensors)} tensors, "
         f"{layout.parameters:,} parameters, {dtype}")
    with atomic_directory(out, _log) as partial:
        (partial / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        preprocessor = (load(facts.preprocessor) if facts.preprocessor else
                        tts_preprocessor(kind) if facts.processor_class else None)
        if preprocessor is not None:
            (partial / PREPROCESSOR_CONFIG).write_text(json.dumps(preprocessor, indent=2) + "\n")
        tokenizer.save(str(partial / "tokenizer.json"))
        write_weights(layout, partial, seed, dtype, speaking_lm(special_ids) if facts.capabilities.long_form else None)
        if extras is not None:
            extras(partial)
    return layout
