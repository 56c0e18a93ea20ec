"""BitNet's ternary products on onnxruntime's MatMulNBits: exact in float32, and exact in int8 too once every
block of inputs carries a 127.

A BitLinear multiplies integer activations x_q (|x_q| <= 127, per token) by ternary weights, packed as MatMulNBits
codes with scale 1; in float32 (`accuracy_level` 1, 4-bit codes: the bundles until 2026-12-06) that is exact. At
`accuracy_level` 4 onnxruntime quantizes the activations to int8 block by block (scale = the block's max / 127) and
runs its int8 kernels: fast, but a block whose largest |x_q| is under 127 is rescaled and rounded, so the sums are
off. Putting a 127 at the head of every block of 128 inputs, with a weight row of zeros under it (127 real inputs
a block, the last block padded with zeros), makes every block's scale exactly 1: the int8 codes are x_q itself and
the sums are exact integers (the bundles since, at 4 bits, then at 2: export.precision.TERNARY). 2-bit codes
need onnxruntime 1.28 or later: before it their int8 path is missing and a product takes 50-100 ms. This times one product of the
ASR-BitNet LM's largest shape, one token, each way, and checks each against the exact sums over random token
activations:

    benchmarks/ternary_products.py [--threads 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from phases import header, run

K, N, BLOCK, REAL = 1536, 8960, 128, 127  # the full-size BitNet LM's gate/up projection, one token


def matmul_nbits(weight: np.ndarray, bits: int, accuracy_level: int) -> bytes:
    """One MatMulNBits node holding `weight` (values -1, 0, 1) as the bundles pack it (precision.ternary_matmul_nbits),
    at `bits` bits and `accuracy_level`."""
    import dataclasses

    from onnx import TensorProto, helper, numpy_helper

    from vibevoice_onnx.export.precision import TERNARY, ternary_matmul_nbits

    scheme = dataclasses.replace(TERNARY, bits=bits, block_size=BLOCK, accuracy_level=accuracy_level)
    attributes, tensors = ternary_matmul_nbits(weight, "w", scheme)
    node = helper.make_node("MatMulNBits", ["x", *(n for n, _ in tensors)], ["y"], domain="com.microsoft", **attributes)
    graph = helper.make_graph([node], "ternary", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["tokens", attributes["K"]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["tokens", N])],
                              [numpy_helper.from_array(a, n) for n, a in tensors])
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def with_127s(x: np.ndarray) -> np.ndarray:
    """x [tokens, K] as [tokens, K'] with a 127 heading every block of BLOCK inputs (REAL real ones a block): what
    the graph's headed_inputs nodes compute, here for the inputs fed to one product."""
    blocks = -(-x.shape[1] // REAL)
    padded = np.zeros((x.shape[0], blocks * REAL), np.float32)
    padded[:, : x.shape[1]] = x
    heads = np.full((x.shape[0], blocks, 1), 127, np.float32)
    return np.concatenate([heads, padded.reshape(-1, blocks, REAL)], axis=2).reshape(x.shape[0], blocks * BLOCK)


def main() -> int:
    import onnxruntime as ort

    from vibevoice_onnx.export.precision import headed_rows

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    weight = rng.integers(-1, 2, size=(K, N)).astype(np.float32)
    tokens = [np.clip(np.round(rng.standard_normal((1, K)) * 40), -127, 127).astype(np.float32) for _ in range(20)]
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    forms = {"4-bit, float32 compute": (4, 1, False), "4-bit, int8 compute": (4, 4, False),
             "2-bit, int8 compute": (2, 4, False), "4-bit, int8 compute, a 127 heading each block": (4, 4, True),
             "2-bit, int8 compute, a 127 heading each block (the bundles)": (2, 4, True)}
    runs = {}
    for name, (bits, level, headed) in forms.items():
        session = ort.InferenceSession(matmul_nbits(headed_rows(weight, BLOCK) if headed else weight, bits, level), options,
                                       providers=["CPUExecutionProvider"])
        runs[name] = (session, [with_127s(x) if headed else x for x in tokens], [])
    for k in range(args.repeats):  # interleaved, so every form sees the same machine
        for session, feeds, times in runs.values():
            start = time.perf_counter()
            session.run(None, {"x": feeds[k % len(feeds)]})
            times.append(time.perf_counter() - start)
    rows = []
    for (name, (bits, level, _)), (session, feeds, times) in zip(forms.items(), runs.values()):
        error = max(float(np.abs(session.run(None, {"x": f})[0] - x.astype(np.float64) @ weight).max())
                    for f, x in zip(feeds, tokens))
        rows.append({"form": name, "bits": bits, "accuracy_level": level, "inputs": feeds[0].shape[1],
                     "ms": round(statistics.median(times) * 1e3, 4), "max_abs_error": error})
        print(json.dumps(rows[-1]), flush=True)
    results = {**header(), "threads": args.threads, "shape": {"K": K, "N": N, "block": BLOCK}, "products": rows}
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    run(main)
