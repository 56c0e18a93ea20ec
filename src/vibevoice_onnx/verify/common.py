"""`vibevoice-onnx verify`: what every kind's gates share, the parity record, and the dispatch by kind.

A graph passes with cosine >= 0.99, or max|Δ| <= 1e-4 where the reference output is near silent. The record
(thresholds, every gate's numbers, the closed loop's settings) goes into the bundle's manifest.
"""

from __future__ import annotations

import datetime
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

from ..errors import VibeVoiceError
from ..outputs import atomic_file
from ..runtime.bundle import MANIFEST, Bundle

MIN_COSINE = 0.99
SILENT_RMS = 1e-3  # a reference output quieter than this is judged by max|Δ| instead
SILENT_MAX_ABS = 1e-4
F32 = np.float32


@dataclass
class Gate:
    name: str
    cosine: float | None
    max_abs: float
    passed: bool
    detail: str = ""


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    if denom == 0:
        return 1.0 if np.array_equal(a, b) else 0.0
    return float(a @ b / denom)


def compare(name: str, outputs: list, references: list, detail: str = "") -> Gate:
    """Gate several output tensors at once: the worst cosine and the largest difference over all of them."""
    cosines, max_abs, silent = [], 0.0, True
    for ours, ref in zip(outputs, references):
        ours, ref = np.asarray(ours, F32), np.asarray(ref, F32)
        if ours.shape != ref.shape:
            return Gate(name, None, float("inf"), False, f"shape {list(ours.shape)} != {list(ref.shape)}")
        cosines.append(cosine(ours, ref))
        max_abs = max(max_abs, float(np.abs(ours - ref).max()) if ours.size else 0.0)
        silent &= float(np.sqrt(np.mean(ref.astype(np.float64) ** 2))) < SILENT_RMS
    worst = min(cosines)
    passed = max_abs <= SILENT_MAX_ABS if silent else worst >= MIN_COSINE
    return Gate(name, worst, max_abs, passed, detail + (" (near-silent reference: judged by max|Δ|)" if silent else ""))


def cache_layers(cache: DynamicCache) -> list[tuple[np.ndarray, np.ndarray]]:
    """A transformers cache as (K, V) arrays per layer, copied (the cache keeps growing in place)."""
    return [(layer.keys.numpy().copy(), layer.values.numpy().copy()) for layer in cache.layers]


def resolve_checkpoint(bundle: Bundle, checkpoint: Path | None) -> Path:
    path = Path(checkpoint) if checkpoint else Path(bundle.manifest["source"]["path"])
    if not (path / "config.json").is_file():
        raise VibeVoiceError(f"{path}: checkpoint not found; pass --checkpoint with the directory this bundle was built from")
    return path


def gates_of(kind: str):
    """The module holding a kind's gates: run_gates(bundle, checkpoint, voice, log) -> (gates, info)."""
    from . import realtime

    modules = {"realtime": realtime}
    if kind not in modules:
        raise VibeVoiceError(f"verifying {kind} bundles is not supported yet (supported: {', '.join(modules)})")
    return modules[kind]


@torch.no_grad()
def verify_bundle(bundle_dir: Path, checkpoint: Path | None = None, voice: str | None = None, log=None) -> dict:
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    bundle = Bundle(Path(bundle_dir))
    module = gates_of(bundle.kind)
    checkpoint = resolve_checkpoint(bundle, checkpoint)
    from ..checkpoints.files import open_checkpoint
    from ..export.build import checkpoint_hash

    if checkpoint_hash(checkpoint, open_checkpoint(checkpoint)) != bundle.manifest["source"]["hash"]:
        raise VibeVoiceError(f"{checkpoint}: is not the checkpoint this bundle was built from (its hash differs)")
    gates, info = module.run_gates(bundle, checkpoint, voice, log)
    record = {
        "verified_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "checkpoint": str(checkpoint.resolve()),
        "reference": "fp32 PyTorch (transformers modules), CPU",
        "thresholds": {"min_cosine": MIN_COSINE, "silent_rms": SILENT_RMS, "silent_max_abs": SILENT_MAX_ABS,
                       **info.pop("thresholds", {})},
        **info,
        "passed": all(g.passed for g in gates),
        "gates": [asdict(g) for g in gates],
    }
    manifest = dict(bundle.manifest, parity=record)
    try:
        with atomic_file(bundle.path / MANIFEST, "recording the results") as partial:
            partial.write_text(json.dumps(manifest, indent=2) + "\n")
    except VibeVoiceError as e:
        record["not_recorded"] = str(e)
    return record


def format_table(record: dict) -> str:
    rows = [("gate", "cosine", "max |Δ|", "result")]
    for g in record["gates"]:
        rows.append((g["name"], "-" if g["cosine"] is None else f"{g['cosine']:.6f}", f"{g['max_abs']:.2e}", "pass" if g["passed"] else "FAIL"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for g in record["gates"]:
        if g["detail"] and (not g["passed"] or " agree" in g["name"]):
            lines.append(f"  {g['name']}: {g['detail']}")
    lines.append("all gates passed" if record["passed"] else "SOME GATES FAILED")
    if "not_recorded" in record:
        lines.append("warning: " + record["not_recorded"])
    return "\n".join(lines)


