"""The written bundles against the traced ones of the same checkpoint, at full size: every graph's outputs on the
same inputs (largest difference against the output's scale, cosine, gain) and whether its quantized weights are
identical, per precision; then the whole loop's audio from both fp32 bundles (the same text, voice and seed).
tests/test_writer.py holds the same on the tiny checkpoint in CI.

    vibevoice-onnx make-checkpoint realtime CKPT --size full
    vibevoice-onnx build CKPT -o WRITTEN --graphs written [--precision int8]
    vibevoice-onnx build CKPT -o TRACED --graphs traced [--precision int8]      # the export extra
    .venv/bin/python benchmarks/writer_equality.py WRITTEN/realtime TRACED/realtime --voice VOICE.pt --workdir OUT
    .venv/bin/python benchmarks/writer_equality.py WRITTEN/1.5b TRACED/1.5b --workdir OUT       # any kind: graphs only

Results go to OUT/results.json with the date, commit and CPU. Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from phases import run, write_results

SIZES = {"batch": 2, "sequence": 3, "capacity": 16, "frames": 2, "samples": 2 * 3200 + 123}  # not whole frames
FIXED = {"seqlens_k": np.array([2, 2], np.int32), "total_sequence_length": np.array(3, np.int32),
         "position_ids": np.tile(np.arange(3), (2, 1)), "timesteps": np.array([999.0, 500.0], np.float32)}


def quantized_weights(path: Path) -> list[np.ndarray]:
    model = onnx.load(str(path))
    stored = {t.name: t for t in model.graph.initializer}
    return [numpy_helper.to_array(stored[name]) for node in model.graph.node for i, name in enumerate(node.input)
            if name in stored and (node.op_type == "MatMulNBits" and i > 0
                                   or stored[name].data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8))]


def closeness(reference: np.ndarray, other: np.ndarray) -> tuple[float, float, float]:
    a, b = reference.astype(np.float64).ravel(), other.astype(np.float64).ravel()
    norms = np.linalg.norm(a) * np.linalg.norm(b)
    return (float(np.abs(a - b).max() / (np.abs(a).max() or 1.0)), float(a @ b / norms) if norms else 1.0,
            float(abs(np.linalg.norm(b) / (np.linalg.norm(a) or 1.0) - 1.0)))


def size(dim) -> int:
    """A manifest's dimension: a number, a name of SIZES, or HOP*name (a streaming encoder's whole frames)."""
    if isinstance(dim, int):
        return dim
    factor, _, name = dim.rpartition("*")
    return int(factor or 1) * SIZES[name]


def compare_graph(written: Path, traced: Path, name: str, entries: tuple[dict, dict], rng) -> dict:
    feeds = {}
    for spec in entries[0]["inputs"]:
        shape = [size(d) for d in spec["shape"]]
        scale = 0.1 if spec["name"] == "audio" else 1.0  # audio in [-1, 1]
        feeds[spec["name"]] = FIXED.get(spec["name"], (rng.standard_normal(shape) * scale).astype(spec["dtype"]))
    outputs = []
    for root, entry in zip((traced, written), entries[::-1]):
        session = ort.InferenceSession(str(root / entry["file"]), providers=["CPUExecutionProvider"])
        outputs.append(session.run(None, feeds))
        del session
    measured = [closeness(a, b) for a, b in zip(*outputs)]
    ours, theirs = quantized_weights(written / entries[0]["file"]), quantized_weights(traced / entries[1]["file"])
    return {"graph": name, "outputs": len(measured), "max_error_over_scale": max(m[0] for m in measured),
            "min_cosine": min(m[1] for m in measured), "max_gain_error": max(m[2] for m in measured),
            "bitwise": all(np.array_equal(a, b) for a, b in zip(*outputs)), "quantized_tensors": len(ours),
            "quantized_identical": len(ours) == len(theirs) and all(
                a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(ours, theirs))}


def whole_loop(written: Path, traced: Path, voice: Path, work: Path) -> dict:
    import vibevoice_onnx
    from vibevoice_onnx.runtime.voice_store import import_voice

    speech = []
    for label, bundle in (("traced", traced / "cpu_fp32"), ("written", written / "cpu_fp32")):
        copy = work / label / "cpu_fp32"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(bundle, copy)
        import_voice(copy, voice, "voice")
        speech.append(vibevoice_onnx.open(copy, threads=2).create("The quick brown fox jumps over the lazy dog.",
                                                                  voice="voice", seed=7, max_frames=24)[0])
    error, cosine, gain = closeness(*speech)
    return {"frames": 24, "samples": int(speech[0].size), "max_error_over_scale": error, "cosine": cosine,
            "gain_error": gain}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("written", type=Path, help="KIND folder of the written bundles (DEVICE_PRECISION inside)")
    parser.add_argument("traced", type=Path, help="KIND folder of the traced bundles of the same checkpoint")
    parser.add_argument("--voice", type=Path, help="a realtime voice preset: the whole loop too (realtime)")
    parser.add_argument("--workdir", type=Path, default=Path("bench-out/writer-equality"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    results, rng = {}, np.random.default_rng(0)
    for bundle in sorted(p for p in args.written.iterdir() if (args.traced / p.name / "manifest.json").is_file()):
        manifests = [json.loads((root / bundle.name / "manifest.json").read_text()) for root in (args.written, args.traced)]
        if manifests[0]["source"]["hash"] != manifests[1]["source"]["hash"]:
            sys.exit(f"{bundle.name}: the two bundles were not built from the same checkpoint")
        results[bundle.name] = [compare_graph(bundle, args.traced / bundle.name, name,
                                              (entry, manifests[1]["graphs"][name]), rng)
                                for name, entry in manifests[0]["graphs"].items()]
        for row in results[bundle.name]:
            print(bundle.name, row, flush=True)
    if args.voice is not None:
        results["whole_loop_fp32"] = whole_loop(args.written, args.traced, args.voice, args.workdir)
    return write_results(results, args.workdir)


if __name__ == "__main__":
    run(main)
