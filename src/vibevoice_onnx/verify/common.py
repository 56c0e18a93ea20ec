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
from typing import Callable

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

from ..errors import VibeVoiceError
from ..outputs import atomic_file
from ..reference.modules import ConvState, as_tensor, conv_state_specs
from ..runtime.bundle import MANIFEST, Bundle
from ..runtime.lm import OnnxLm, StreamingConv, flat_cache

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


class Probe:
    """Realistic gate inputs: embeddings of random tokens from the model's own table, caches from prefills."""

    def __init__(self, embed: Callable[[np.ndarray], np.ndarray], vocab: int, seed: int = 0):
        self.embed, self.vocab = embed, vocab
        self.rng = np.random.default_rng(seed)

    def tokens(self, count: int) -> np.ndarray:
        return self.embed(self.rng.integers(0, self.vocab, (1, count)))

    def normal(self, *shape: int) -> np.ndarray:
        return self.rng.standard_normal(shape).astype(F32)

    def prefilled(self, lm, count: int) -> DynamicCache:
        cache = DynamicCache()
        lm_step(lm, self.tokens(count), np.arange(count)[None], cache)
        return cache


def lm_step(lm, embeds: np.ndarray, positions: np.ndarray, cache: DynamicCache) -> np.ndarray:
    """A reference Qwen2 stack on `embeds` at `positions`, extending `cache` in place: hidden [B, S, H]."""
    out = lm(inputs_embeds=as_tensor(embeds), position_ids=torch.from_numpy(np.asarray(positions, np.int64)),
             past_key_values=cache, use_cache=True)
    return out.last_hidden_state.numpy()


def lm_gates(name: str, lm, onnx_lm: OnnxLm, empty: list[np.ndarray], probe: Probe,
             steps: tuple[tuple[int, int], ...] = ((11, 5), (16, 1))) -> list[Gate]:
    """An LM graph against its reference on (past, new) token counts, and its own KV incremental == prefill."""
    gates = []
    for past, new in steps:
        cache = probe.prefilled(lm, past)
        flat_past = flat_cache(cache_layers(cache))
        embeds, positions = probe.tokens(new), np.arange(past, past + new, dtype=np.int64)[None]
        reference = lm_step(lm, embeds, positions, cache)
        hidden, present = onnx_lm.unbatched(embeds, positions, flat_past)
        gates.append(compare(f"{name} (past {past}, new {new})", [hidden, *present],
                             [reference, *flat_cache(cache_layers(cache))]))
    length, prefix = 8, 3
    embeds = probe.tokens(length)
    full, full_present = onnx_lm.unbatched(embeds, np.arange(length)[None], empty)
    hidden, cache = onnx_lm.unbatched(embeds[:, :prefix], np.arange(prefix)[None], empty)
    pieces = [hidden]
    for i in range(prefix, length):
        hidden, cache = onnx_lm.unbatched(embeds[:, i : i + 1], np.array([[i]]), cache)
        pieces.append(hidden)
    gates.append(compare(f"{name} KV: prefill {prefix} + {length - prefix} steps == prefill {length}",
                         [np.concatenate(pieces, axis=1), *cache], [full, *full_present]))
    return gates


def head_gate(head, velocity: Callable, conditions: np.ndarray, probe: Probe) -> Gate:
    noisy = probe.normal(len(conditions), head.noisy_images_proj.in_features)
    timesteps = np.linspace(999, 100, len(conditions)).round().astype(F32)
    reference = head(as_tensor(noisy), as_tensor(timesteps), as_tensor(conditions)).numpy()
    return compare("diffusion_head", [velocity(noisy, timesteps, conditions)], [reference])


def module_gate(name: str, module, run: Callable, inputs: np.ndarray) -> Gate:
    return compare(name, [run(inputs)], [module(as_tensor(inputs)).numpy()])


def decoder_gates(decoder, whole, stream: StreamingConv, latents: np.ndarray) -> list[Gate]:
    """Decoder input latents [1, T >= 8, C]: the whole-sequence graph and the streaming graph (frame by frame,
    states included) against the reference, and the streamed frames against the whole decode."""
    reference = decoder(as_tensor(latents[:, :6]).transpose(1, 2)).audio.numpy()
    gates = [compare("acoustic_decoder (6 frames)", [whole(latents[:, :6])], [reference])]
    state, ours_state, outputs, references = ConvState.zeros(conv_state_specs(decoder)), stream.new_state(), [], []
    for i in range(3):  # the first frame starts from zeros, the later ones from a carried state
        ours, ours_state = stream.run(latents[:, i : i + 1], ours_state)
        outputs.append(ours)
        references.append(decoder(as_tensor(latents[:, i : i + 1]).transpose(1, 2), padding_cache=state).audio.numpy())
    outputs += ours_state
    references += [state.tensors[s["name"]].numpy() for s in stream.states]
    gates.append(compare("acoustic_decoder_stream (3 frames, states)", outputs, references))
    frames = latents.shape[1]
    ours_state, pieces = stream.new_state(), []
    for i in range(frames):
        chunk, ours_state = stream.run(latents[:, i : i + 1], ours_state)
        pieces.append(chunk)
    gates.append(compare(f"decoder: {frames} streamed frames == whole decode", [np.concatenate(pieces, axis=2)],
                         [whole(latents)]))
    return gates


def resolve_checkpoint(bundle: Bundle, checkpoint: Path | None) -> Path:
    path = Path(checkpoint) if checkpoint else Path(bundle.manifest["source"]["path"])
    if not (path / "config.json").is_file():
        raise VibeVoiceError(f"{path}: checkpoint not found; pass --checkpoint with the directory this bundle was built from")
    return path


def gates_of(kind: str):
    """The module holding a kind's gates: run_gates(bundle, checkpoint, voice, log) -> (gates, info)."""
    from . import realtime, tts15b

    modules = {"realtime": realtime, "1.5b": tts15b}
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


