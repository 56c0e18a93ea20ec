"""`vibevoice-onnx inspect`: what a checkpoint really is, compared strictly against its layout."""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, so safetensors can return bf16 arrays)
import numpy as np
from safetensors import safe_open

from ..errors import CheckpointError
from ..families import family
from .checkpoint import Checkpoint
from .files import CheckpointFiles

_LAYER_INDEX = re.compile(r"^model\.(language_model|tts_language_model)\.layers\.(\d+)\.")


def _numel(shape) -> int:
    return math.prod(shape)


def actual_layers(names) -> dict[str, int]:
    """Layer count per language model, from the keys actually stored (not from the config)."""
    seen: dict[str, set[int]] = {}
    for name in names:
        if m := _LAYER_INDEX.match(name):
            seen.setdefault(m.group(1), set()).add(int(m.group(2)))
    return {lm: max(indices) + 1 for lm, indices in sorted(seen.items())}


# Tensors up to this size are read in full and checked for NaN/inf: scales and biases (upstream initialises
# the latent scaling buffers to NaN, so a half-converted checkpoint can carry them), type embeddings, norms,
# layer scales. Together they are a few MB even at full size; the large matrices are left unread.
SMALL_TENSOR = 1 << 16


def non_finite_tensors(files: CheckpointFiles) -> list[str]:
    """Names of the small stored tensors that hold NaN or infinity, each with what it holds."""
    found = []
    by_shard: dict[str, list[str]] = {}
    for t in files.tensors.values():
        if _numel(t.shape) <= SMALL_TENSOR and t.dtype in ("BF16", "F16", "F32", "F64"):
            by_shard.setdefault(t.file, []).append(t.name)
    for shard, names in by_shard.items():
        with safe_open(str(files.root / shard), framework="numpy") as f:
            for name in names:
                values = np.asarray(f.get_tensor(name), dtype=np.float32)
                if not np.isfinite(values).all():
                    kinds = [k for k, bad in (("NaN", np.isnan(values).any()), ("infinity", np.isinf(values).any())) if bad]
                    found.append(f"{name} ({' and '.join(kinds)})")
    return sorted(found)


def inspect_checkpoint(source: Checkpoint | Path) -> dict:
    checkpoint = Checkpoint.open(source)
    root, files, dims, stored, layout = checkpoint.root, checkpoint.files, checkpoint.dims, checkpoint.stored, checkpoint.layout
    expected = layout.by_name()

    missing = sorted(set(expected) - set(stored))
    unexpected = sorted(set(stored) - set(expected))
    shape_mismatches = [
        {"name": name, "expected": list(expected[name].shape), "actual": list(stored[name].shape)}
        for name in sorted(set(expected) & set(stored))
        if tuple(expected[name].shape) != tuple(stored[name].shape)
    ]
    components = dict.fromkeys(layout.components(), 0)
    for name, t in stored.items():
        component = expected[name].component if name in expected else "(unexpected)"
        components[component] = components.get(component, 0) + _numel(t.shape)
    dtypes = Counter(t.dtype for t in stored.values())
    layers = actual_layers(stored)
    layer_notes = []
    if len(layers) > 1 or sum(layers.values()) != dims.configured_layers:
        layer_notes.append(
            f"config says {dims.configured_layers} layers; the checkpoint holds "
            + " + ".join(f"{n} ({lm})" for lm, n in layers.items())
        )
    unused = [t.name for t in layout.tensors if not t.used]
    non_finite = non_finite_tensors(files)
    tokenizer = root / "tokenizer.json"
    streaming, streaming_problem = _streaming(root, tokenizer) if family(dims.kind).streams_audio else (None, None)
    return {
        "path": str(root),
        "kind": dims.kind,
        "ok": not (missing or unexpected or shape_mismatches or non_finite or streaming_problem),
        "streaming": streaming,
        "streaming_problem": streaming_problem,
        "dtype": dtypes.most_common(1)[0][0] if dtypes else None,
        "dtypes": dict(dtypes),
        "files": list(files.shards),
        "sharded": files.sharded,
        "bytes": files.total_bytes(),
        "tensors": len(stored),
        "parameters": sum(_numel(t.shape) for t in stored.values()),
        "expected_tensors": len(expected),
        "expected_parameters": layout.parameters,
        "components": components,
        "layers": layers,
        "configured_layers": dims.configured_layers,
        "layer_notes": layer_notes,
        "special_tokens": dict(dims.special_tokens),
        "tokenizer": str(tokenizer) if tokenizer.is_file() else None,
        "unused_tensors": len(unused),
        "notes": list(layout.notes),
        "missing": missing,
        "unexpected": unexpected,
        "shape_mismatches": shape_mismatches,
        "non_finite": non_finite,
    }


def _streaming(root: Path, tokenizer: Path) -> tuple[str | None, str | None]:
    """(ASR-Streaming's window geometry, what makes the checkpoint unusable for streaming, if anything)."""
    import json

    from .configs import PREPROCESSOR_CONFIG, STREAMING_TOKENS, streaming_geometry

    path = root / PREPROCESSOR_CONFIG
    try:
        geometry = streaming_geometry(json.loads(path.read_text()) if path.is_file() else None, str(path))
    except (CheckpointError, ValueError) as e:
        return None, str(e)
    chunk_end = "<|text_chunk_end|>"
    vocab = json.loads(tokenizer.read_text()).get("added_tokens", []) if tokenizer.is_file() else []
    ids = {t["content"]: t["id"] for t in vocab}
    if chunk_end not in ids:
        return geometry.describe(), (f"{tokenizer}: has no {chunk_end}, so no chunk would ever end (the stock Qwen2.5 "
                                     "tokenizer lacks it: use the checkpoint's own)")
    at = f"; {chunk_end} = {ids[chunk_end]}" + ("" if ids[chunk_end] == STREAMING_TOKENS[chunk_end] else
                                                  f" (the released checkpoints have {STREAMING_TOKENS[chunk_end]})")
    return geometry.describe() + at, None


def _fmt_count(n: int) -> str:
    return f"{n:,}"


def _verdict(r: dict) -> str:
    if r["missing"] or r["unexpected"] or r["shape_mismatches"]:
        return "DOES NOT match its layout"
    if r.get("streaming_problem"):
        return "matches its layout, but cannot stream: " + r["streaming_problem"]
    if r["non_finite"]:
        return "matches its layout, but holds NaN or infinite values: unusable"
    return "matches its layout exactly"


def format_report(r: dict, limit: int = 20) -> str:
    lines = [
        f"checkpoint   {r['path']}",
        f"kind         {r['kind']}",
        f"files        {len(r['files'])} ({'sharded' if r['sharded'] else 'single file'}), {r['bytes'] / 1e9:.3f} GB",
        f"dtype        {r['dtype']}" + (f"  (mixed: {r['dtypes']})" if len(r["dtypes"]) > 1 else ""),
        f"tensors      {_fmt_count(r['tensors'])} (layout: {_fmt_count(r['expected_tensors'])})",
        f"parameters   {_fmt_count(r['parameters'])} (layout: {_fmt_count(r['expected_parameters'])})",
        "layers       " + ", ".join(f"{lm} {n}" for lm, n in r["layers"].items()) + f"  (config: {r['configured_layers']})",
    ]
    lines += [f"  ! {note}" for note in r["layer_notes"]]
    if r["special_tokens"]:
        lines.append("special ids  " + ", ".join(f"{k}={v}" for k, v in r["special_tokens"].items()))
    lines.append(f"tokenizer    {r['tokenizer'] or 'none in the checkpoint (pass --tokenizer when building)'}")
    if r.get("streaming"):
        lines.append(f"streaming    {r['streaming']}")
    lines.append("components")
    width = max(len(c) for c in r["components"]) if r["components"] else 0
    for component, count in r["components"].items():
        lines.append(f"  {component:<{width}}  {count:>15,}")
    lines += [f"note: {n}" for n in r["notes"]]
    for key, label in (("missing", "missing"), ("unexpected", "unexpected")):
        items = r[key]
        lines.append(f"{label:<12} {len(items)}")
        lines += [f"  {name}" for name in items[:limit]]
        if len(items) > limit:
            lines.append(f"  ... and {len(items) - limit} more")
    lines.append(f"shape errors {len(r['shape_mismatches'])}")
    lines += [f"  {m['name']}: expected {m['expected']}, found {m['actual']}" for m in r["shape_mismatches"][:limit]]
    lines.append(f"non-finite   {len(r['non_finite'])}")
    lines += [f"  {name}" for name in r["non_finite"][:limit]]
    lines.append("result       " + _verdict(r))
    return "\n".join(lines)


def listing(names: list[str], limit: int = 10) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_layout(checkpoint: Checkpoint) -> dict:
    """Raise with the offending names unless the checkpoint matches its layout exactly."""
    report = inspect_checkpoint(checkpoint)
    root = checkpoint.root
    problems = []
    if report["missing"]:
        problems.append(f"{len(report['missing'])} missing ({listing(report['missing'])})")
    if report["unexpected"]:
        problems.append(f"{len(report['unexpected'])} unexpected ({listing(report['unexpected'])})")
    if report["shape_mismatches"]:
        shapes = [f"{m['name']} {m['actual']} != {m['expected']}" for m in report["shape_mismatches"]]
        problems.append(f"{len(shapes)} with the wrong shape ({listing(shapes)})")
    if problems:
        raise CheckpointError(f"{root}: does not match the {report['kind']} layout: " + "; ".join(problems))
    if report["non_finite"]:
        raise CheckpointError(
            f"{root}: holds non-finite values in {listing(report['non_finite'])}; a usable checkpoint has finite "
            "values there (upstream initialises the latent scaling buffers to NaN: was the checkpoint fully converted?)"
        )
    return report
