"""Where a frame's milliseconds go (`bench --profile`): onnxruntime's own profiler over a short run gives each
node's time and the shapes it ran on; the shapes give its multiply-accumulates; the machine's measured bandwidth
and compute rates (runtime.bench) turn a graph's weight bytes and MACs into its floor. Torch-free."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

# Products counted at the int8 rate: those of onnxruntime's int8 kernels, and MatMulNBits, which runs on them
# where its accuracy_level is 4 (as `build` writes it) and the kernel has a path for its bits and block size. A
# floor is the least time a product can take, so the faster rate; every other product counts at float32's.
INT8_OPS = {"MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QLinearMatMul", "ConvInteger",
            "QLinearConv", "QGemm", "MatMulNBits"}
PRODUCTS = {"MatMul", "FusedMatMul", "Gemm", "FusedGemm", "MatMulNBits", "MatMulInteger", "MatMulIntegerToFloat",
            "DynamicQuantizeMatMul", "QLinearMatMul", "QGemm"}
CONVOLUTIONS = {"Conv", "FusedConv", "ConvInteger", "QLinearConv", "NhwcConv"}
TOP = 5  # operator types and nodes listed per graph


@dataclass(frozen=True)
class NodeRun:
    """One call of one node, as onnxruntime's profiler recorded it."""

    node: str
    op: str
    microseconds: int
    macs: int


def macs(op: str, inputs: list[list[int]], outputs: list[list[int]]) -> int:
    """The multiply-accumulates of one call of a node from its input and output shapes (0 for operators that
    multiply nothing: norms, elementwise, attention's own products are left out and said so in the report)."""
    if not outputs or not inputs:
        return 0
    out = outputs[0]
    if op in PRODUCTS:  # every output element is a dot product over A's last axis (QLinearMatMul: input 0 is A)
        return math.prod(out) * (inputs[0][-1] if inputs[0] else 0)
    if op in CONVOLUTIONS:  # every output element sums Cin/groups x kernel products: the weight's [1:] dims
        weight = inputs[3] if op == "QLinearConv" else inputs[1]
        return math.prod(out) * math.prod(weight[1:])
    if op == "ConvTranspose":  # every input element scatters Cout/groups x kernel products
        return math.prod(inputs[0]) * math.prod(inputs[1][1:])
    return 0


def node_runs(profile: Path) -> list[NodeRun]:
    """Every node call in an onnxruntime profile (its "Node" events ending in _kernel_time)."""
    runs = []
    for event in json.loads(Path(profile).read_text()):
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
            continue
        args = event.get("args", {})
        inputs, outputs = (_shapes(args.get(key, [])) for key in ("input_type_shape", "output_type_shape"))
        op = args.get("op_name", "?")
        runs.append(NodeRun(event["name"][:-len("_kernel_time")], op, int(event.get("dur", 0)),
                            macs(op, inputs, outputs)))
    return runs


def _shapes(typed: list[dict]) -> list[list[int]]:
    """[{"float": [1, 896]}, ...] -> [[1, 896], ...] (an optional input left out is an empty dict)."""
    return [[int(d) for d in next(iter(shape.values()), [])] for shape in typed]


def graph_profile(runs: list[NodeRun], frames: int, peaks: dict[str, float]) -> dict:
    """One graph's profiled run per frame: MACs, their compute floor at the machine's peaks, and the operator
    types and nodes that take the most of its kernel time."""
    by_op, by_node = defaultdict(lambda: [0, 0]), defaultdict(int)
    floor = 0.0
    for run in runs:
        by_op[run.op][0] += run.microseconds
        by_op[run.op][1] += run.macs
        by_node[(run.node, run.op)] += run.microseconds
        floor += run.macs / peaks["int8" if run.op in INT8_OPS else "float32"]
    total = sum(run.microseconds for run in runs) or 1
    ops = sorted(by_op.items(), key=lambda item: -item[1][0])
    nodes = sorted(by_node.items(), key=lambda item: -item[1])
    return {
        "macs_per_frame": sum(run.macs for run in runs) / frames,
        "compute_floor_ms_per_frame": 1000 * floor / frames,
        "kernel_ms_per_frame": sum(run.microseconds for run in runs) / 1000 / frames,
        "nodes": len(by_node), "node_calls_per_frame": len(runs) / frames,
        "top_ops": [{"op": op, "share": round(us / total, 4), "ms_per_frame": us / 1000 / frames,
                     "macs_per_frame": m / frames} for op, (us, m) in ops[:TOP]],
        "top_nodes": [{"node": node, "op": op, "share": round(us / total, 4)} for (node, op), us in nodes[:TOP]],
    }


def floors(runtime: dict, profiled: dict[str, dict], bandwidth: float, peaks: dict[str, float]) -> dict:
    """Each graph of a timed run against its floors: the weights it reads at the measured bandwidth, its MACs
    at the measured compute rates; the larger is its floor, and `times_floor` how far above it the graph runs."""
    frames, graphs = runtime["frames"], {}
    for name, timed in runtime["graphs"].items():
        read = runtime["graph_weight_bytes"][name] * timed["calls"] / frames
        ms = timed["ms_per_frame"]
        profile = profiled.get(name, {})
        bandwidth_floor = 1000 * read / bandwidth
        compute_floor = profile.get("compute_floor_ms_per_frame", 0.0)
        floor = max(bandwidth_floor, compute_floor)
        graphs[name] = {
            "ms_per_frame": ms, "calls_per_frame": timed["calls"] / frames, "weight_bytes_per_frame": read,
            "achieved_bytes_per_second": read / (ms / 1000) if ms else 0.0,
            "bandwidth_floor_ms_per_frame": bandwidth_floor,
            "macs_per_frame": profile.get("macs_per_frame", 0.0),
            "achieved_macs_per_second": profile.get("macs_per_frame", 0.0) / (ms / 1000) if ms else 0.0,
            "compute_floor_ms_per_frame": compute_floor, "floor_ms_per_frame": floor,
            "bound_by": "compute" if compute_floor > bandwidth_floor else "bandwidth",
            "times_floor": ms / floor if floor else None, **{k: v for k, v in profile.items() if k.startswith("top_")
                                                              or k in ("nodes", "node_calls_per_frame",
                                                                       "kernel_ms_per_frame")},
        }
    total = sum(g["ms_per_frame"] for g in graphs.values())
    floor = sum(g["floor_ms_per_frame"] for g in graphs.values())
    return {"bandwidth_bytes_per_second": bandwidth, "peak_macs_per_second": peaks, "graphs": graphs,
            "graphs_ms_per_frame": total, "floor_ms_per_frame": floor, "times_floor": total / floor if floor else None,
            "note": "MACs count matrix products and convolutions (attention's own products are not counted); the "
                    "profiled run is a separate, shorter run (the profiler slows each node)"}


def format_floors(profile: dict, unit: str = "latent") -> list[str]:
    """The report's lines: a row per graph, slowest first, then each graph's costliest operators; times are per
    `unit` (a TTS run's latent, a transcription's token)."""
    lines = [f"floors        at {profile['bandwidth_bytes_per_second'] / 1e9:.1f} GB/s, "
             f"{profile['peak_macs_per_second']['float32'] / 1e9:.0f} GMAC/s float32, "
             f"{profile['peak_macs_per_second']['int8'] / 1e9:.0f} GMAC/s int8: the graphs take "
             f"{profile['graphs_ms_per_frame']:.1f} ms a {unit} against a floor of {profile['floor_ms_per_frame']:.1f} "
             f"({profile['times_floor']:.1f}x)",
             f"  {'graph':<28}{'ms':>8}{'floor':>8}{'x':>6}  {'bound':<10}{'GB/s':>7}{'GMAC/s':>8}{'MMAC':>9}{'calls':>7}"]
    ordered = sorted(profile["graphs"].items(), key=lambda item: -item[1]["ms_per_frame"])
    for name, g in ordered:
        times = f"{g['times_floor']:.1f}" if g["times_floor"] else "-"
        lines.append(f"  {name:<28}{g['ms_per_frame']:>8.2f}{g['floor_ms_per_frame']:>8.2f}{times:>6}  "
                     f"{g['bound_by']:<10}{g['achieved_bytes_per_second'] / 1e9:>7.1f}"
                     f"{g['achieved_macs_per_second'] / 1e9:>8.1f}{g['macs_per_frame'] / 1e6:>9.1f}"
                     f"{g.get('node_calls_per_frame', 0):>7.0f}")
    for name, g in ordered:
        if g.get("top_ops"):
            lines.append(f"  {name}: " + ", ".join(f"{o['op']} {100 * o['share']:.0f}%" for o in g["top_ops"]))
    return lines
