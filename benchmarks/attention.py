"""Decode attention over a long context: what a step of the realtime upper LM's attention costs as the context
grows, against the floor of reading its KV cache once.

The realtime loop runs both CFG rows of the upper LM in one call (batch 2), one token each, over a cache that
grows by one position per frame up to the model's 8,192. Each formulation runs the upper LM's 20 attention
layers alone (14 query heads, 2 KV heads, head size 64: the full-size config), chained layer to layer, on
random data, in one process, interleaved per context length:

  gqa        onnxruntime's GroupQueryAttention over a fixed-capacity cache written in place (past and present
             bound to one buffer), as the bundles run it: the kernel works per query head, so each KV head is
             read once per query head of its group (7 times here).
  grouped    standard operators over a cache holding exactly the filled positions: the 7 query heads of a KV
             head in one MatMul (Q [B, KV, 7, D] x K^T), softmax, one MatMul with V: each KV head read once
             (and the keys once more by the Transpose that makes K^T).
  grouped_keys_transposed   the same with the key cache kept as K^T [B, KV, D, length]: no Transpose.
             The runtime cannot feed this today: its caches are [B, KV, capacity, D] buffers whose filled part
             is not contiguous (a copy per step would cost more than it saves; see docs/benchmarks.md).

The floor is the cache's bytes over this machine's measured read bandwidth (`bench`'s). Usage:

    benchmarks/attention.py [--threads 2] [--rows 2] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from phases import header, run

LAYERS, HEADS, KV_HEADS, HEAD_DIM, CAPACITY = 20, 14, 2, 64, 8192
LENGTHS = (256, 1024, 2048, 4096, 6144, 8000)


def _model(nodes, inputs, outputs, initializers=(), opsets=(("", 18), ("com.microsoft", 1))):
    from onnx import helper

    graph = helper.make_graph(nodes, "attention", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets]).SerializeToString()


def gqa_model(rows: int) -> bytes:
    """LAYERS GroupQueryAttention nodes over [rows, KV, CAPACITY, D] caches, each layer's output the next's query."""
    from onnx import TensorProto, helper

    info = helper.make_tensor_value_info
    inputs = [info("query", TensorProto.FLOAT, [rows, 1, HEADS * HEAD_DIM]),
              info("key", TensorProto.FLOAT, [rows, 1, KV_HEADS * HEAD_DIM]),
              info("value", TensorProto.FLOAT, [rows, 1, KV_HEADS * HEAD_DIM]),
              info("seqlens_k", TensorProto.INT32, [rows]), info("total", TensorProto.INT32, [])]
    nodes, outputs, query = [], [], "query"
    for layer in range(LAYERS):
        cache = [rows, KV_HEADS, CAPACITY, HEAD_DIM]
        inputs += [info(f"past_key.{layer}", TensorProto.FLOAT, cache), info(f"past_value.{layer}", TensorProto.FLOAT, cache)]
        outputs += [info(f"present_key.{layer}", TensorProto.FLOAT, cache), info(f"present_value.{layer}", TensorProto.FLOAT, cache)]
        nodes.append(helper.make_node(
            "GroupQueryAttention", [query, "key", "value", f"past_key.{layer}", f"past_value.{layer}", "seqlens_k", "total"],
            [f"out.{layer}", f"present_key.{layer}", f"present_value.{layer}"], domain="com.microsoft",
            num_heads=HEADS, kv_num_heads=KV_HEADS, scale=HEAD_DIM ** -0.5))
        query = f"out.{layer}"
    outputs.insert(0, info(query, TensorProto.FLOAT, [rows, 1, HEADS * HEAD_DIM]))
    return _model(nodes, inputs, outputs)


def grouped_model(rows: int, keys_transposed: bool = False) -> bytes:
    """LAYERS grouped attentions in standard operators over [rows, KV, length, D] caches (length: the input's),
    or with the keys kept transposed, [rows, KV, D, length], so no Transpose copies them each step."""
    from onnx import TensorProto, helper, numpy_helper

    info = helper.make_tensor_value_info
    group = HEADS // KV_HEADS
    constants = [numpy_helper.from_array(np.array([rows, KV_HEADS, group, HEAD_DIM], np.int64), "grouped_shape"),
                 numpy_helper.from_array(np.array([rows, 1, HEADS * HEAD_DIM], np.int64), "output_shape"),
                 numpy_helper.from_array(np.array(HEAD_DIM ** -0.5, np.float32), "scale")]
    inputs, nodes, query = [info("query", TensorProto.FLOAT, [rows, 1, HEADS * HEAD_DIM])], [], "query"
    for layer in range(LAYERS):
        key, value = f"key.{layer}", f"value.{layer}"
        key_shape = [rows, KV_HEADS, HEAD_DIM, "length"] if keys_transposed else [rows, KV_HEADS, "length", HEAD_DIM]
        inputs += [info(key, TensorProto.FLOAT, key_shape), info(value, TensorProto.FLOAT, [rows, KV_HEADS, "length", HEAD_DIM])]
        if not keys_transposed:
            nodes.append(helper.make_node("Transpose", [key], [f"kt.{layer}"], perm=[0, 1, 3, 2]))
        nodes += [helper.make_node("Reshape", [query, "grouped_shape"], [f"q.{layer}"]),
                  helper.make_node("MatMul", [f"q.{layer}", key if keys_transposed else f"kt.{layer}"], [f"scores.{layer}"]),
                  helper.make_node("Mul", [f"scores.{layer}", "scale"], [f"scaled.{layer}"]),
                  helper.make_node("Softmax", [f"scaled.{layer}"], [f"probs.{layer}"], axis=-1),
                  helper.make_node("MatMul", [f"probs.{layer}", value], [f"mixed.{layer}"]),
                  helper.make_node("Reshape", [f"mixed.{layer}", "output_shape"], [f"out.{layer}"])]
        query = f"out.{layer}"
    return _model(nodes, inputs, [info(query, TensorProto.FLOAT, [rows, 1, HEADS * HEAD_DIM])], constants, (("", 18),))


class Gqa:
    def __init__(self, session, rows: int, rng):
        import onnxruntime as ort

        self.session, self.binding = session, session.io_binding()
        self.caches = [rng.standard_normal((rows, KV_HEADS, CAPACITY, HEAD_DIM), dtype=np.float32) for _ in range(2 * LAYERS)]
        for name, width in (("query", HEADS), ("key", KV_HEADS), ("value", KV_HEADS)):
            self.binding.bind_cpu_input(name, rng.standard_normal((rows, 1, width * HEAD_DIM), dtype=np.float32))
        for layer in range(LAYERS):
            for kind, cache in zip(("key", "value"), self.caches[2 * layer: 2 * layer + 2]):
                shared = ort.OrtValue.ortvalue_from_numpy(cache)  # written in place, as the runtime binds them
                self.binding.bind_ortvalue_input(f"past_{kind}.{layer}", shared)
                self.binding.bind_ortvalue_output(f"present_{kind}.{layer}", shared)
        self.binding.bind_output(f"out.{LAYERS - 1}")
        self.rows = rows

    def at(self, length: int) -> None:
        self.binding.bind_cpu_input("seqlens_k", np.full(self.rows, length - 1, np.int32))
        self.binding.bind_cpu_input("total", np.array(length, np.int32))

    def step(self) -> None:
        self.session.run_with_iobinding(self.binding)


class Grouped:
    def __init__(self, session, rows: int, rng, keys_transposed: bool = False):
        self.session, self.binding, self.rows, self.rng = session, session.io_binding(), rows, rng
        self.keys_transposed = keys_transposed
        self.binding.bind_cpu_input("query", rng.standard_normal((rows, 1, HEADS * HEAD_DIM), dtype=np.float32))
        self.binding.bind_output(f"out.{LAYERS - 1}")

    def at(self, length: int) -> None:
        key = (self.rows, KV_HEADS, HEAD_DIM, length) if self.keys_transposed else (self.rows, KV_HEADS, length, HEAD_DIM)
        self.caches = [self.rng.standard_normal(shape, dtype=np.float32)
                       for _ in range(LAYERS) for shape in (key, (self.rows, KV_HEADS, length, HEAD_DIM))]
        for layer in range(LAYERS):
            self.binding.bind_cpu_input(f"key.{layer}", self.caches[2 * layer])
            self.binding.bind_cpu_input(f"value.{layer}", self.caches[2 * layer + 1])

    def step(self) -> None:
        self.session.run_with_iobinding(self.binding)


def main() -> int:
    import onnxruntime as ort
    from vibevoice_onnx.runtime.bench import memory_bandwidth

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=2, help="batch rows (the realtime loop's CFG pair: 2)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()

    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    rng = np.random.default_rng(0)
    forms = {"gqa": Gqa(ort.InferenceSession(gqa_model(args.rows), options, providers=["CPUExecutionProvider"]), args.rows, rng),
             "grouped": Grouped(ort.InferenceSession(grouped_model(args.rows), options, providers=["CPUExecutionProvider"]),
                                args.rows, rng),
             "grouped_keys_transposed": Grouped(ort.InferenceSession(grouped_model(args.rows, True), options,
                                                                     providers=["CPUExecutionProvider"]), args.rows, rng, True)}
    bandwidth = memory_bandwidth(args.threads)
    rows = []
    for length in LENGTHS:
        cache_bytes = 2 * LAYERS * args.rows * KV_HEADS * length * HEAD_DIM * 4
        row = {"length": length, "cache_mb": round(cache_bytes / 1e6, 1), "floor_ms": round(cache_bytes / bandwidth * 1e3, 2)}
        times = {name: [] for name in forms}
        for form in forms.values():
            form.at(length)
            for _ in range(3):
                form.step()
        for _ in range(args.repeats):  # interleaved, so both forms see the same machine
            for name, form in forms.items():
                start = time.perf_counter()
                form.step()
                times[name].append(time.perf_counter() - start)
        for name, samples in times.items():
            ms = statistics.median(samples) * 1e3
            row[f"{name}_ms"] = round(ms, 2)
            row[f"{name}_times_floor"] = round(ms / row["floor_ms"], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    first, last = rows[1], rows[-1]
    results = {**header(), "threads": args.threads, "rows": args.rows,
               "dims": {"layers": LAYERS, "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "capacity": CAPACITY},
               "bandwidth_gb_per_s": round(bandwidth / 1e9, 1), "steps": rows,
               "added_ms_from_1024_to_8000": {name: round(last[f"{name}_ms"] - first[f"{name}_ms"], 2) for name in forms}
               | {"floor": round(last["floor_ms"] - first["floor_ms"], 2)}}
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["added_ms_from_1024_to_8000"]))
    return 0


if __name__ == "__main__":
    run(main)
