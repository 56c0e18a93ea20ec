"""`bench --profile`: each graph's multiply-accumulates from onnxruntime's own profile, its floors, and its
costliest operators. The MAC counts are checked against what the graphs' weights say independently (the onnx
package reading the bundle's files), and against products built here whose size is known."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vibevoice_onnx.cli import main
from vibevoice_onnx.runtime.profile import graph_profile, macs, node_runs

from conftest import copy_bundle


@pytest.mark.parametrize("op, inputs, outputs, expected", [
    ("MatMul", [[1, 5, 64], [64, 128]], [[1, 5, 128]], 5 * 64 * 128),
    ("MatMulNBits", [[2, 3, 896], [4864, 28, 16], [4864 * 28]], [[2, 3, 4864]], 2 * 3 * 896 * 4864),
    ("Gemm", [[2, 64], [64, 64], [64]], [[2, 64]], 2 * 64 * 64),
    ("DynamicQuantizeMatMul", [[7, 256], [256, 512], [1]], [[7, 512]], 7 * 256 * 512),
    ("Conv", [[1, 32, 100], [64, 32, 7], [64]], [[1, 64, 94]], 94 * 64 * 32 * 7),
    ("Conv", [[1, 64, 100], [64, 1, 7]], [[1, 64, 94]], 94 * 64 * 7),  # depthwise: groups = channels
    ("ConvTranspose", [[1, 64, 10], [64, 32, 8]], [[1, 32, 80]], 10 * 64 * 32 * 8),
    ("QLinearConv", [[1, 8, 20], [1], [1], [16, 8, 3], [1], [1], [1], [1]], [[1, 16, 18]], 18 * 16 * 8 * 3),
    ("Add", [[1, 64], [1, 64]], [[1, 64]], 0),
    ("GroupQueryAttention", [[1, 1, 896]], [[1, 1, 896]], 0),
])
def test_each_products_macs_follow_from_its_shapes(op, inputs, outputs, expected):
    assert macs(op, inputs, outputs) == expected


@pytest.mark.parametrize("integer, op", [(False, "MatMul"), (True, "MatMulInteger")])
def test_a_profiled_product_of_known_size_counts_its_macs_and_floor(integer, op, tmp_path):
    """onnxruntime's own profile of the product bench measures its compute peak with: read back, its node
    counts rows x inner x columns MACs, and its compute floor is those MACs at the peak of its kind."""
    import onnx
    import onnxruntime as ort

    from vibevoice_onnx.runtime.bench import matmul_model

    model = matmul_model(6, 40, 24, integer)
    onnx.checker.check_model(onnx.load_from_string(model), full_check=True)  # bytes the onnx package reads
    options = ort.SessionOptions()
    options.enable_profiling, options.profile_file_prefix = True, str(tmp_path / "product")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as bench: not folded at load
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    for _ in range(3):
        session.run(None, {})
    runs = node_runs(session.end_profiling())
    assert [(run.op, run.macs) for run in runs] == [(op, 6 * 40 * 24)] * 3
    peaks = {"float32": 1e9, "int8": 4e9}
    profile = graph_profile(runs, 3, peaks)
    assert profile["macs_per_frame"] == 6 * 40 * 24
    assert profile["compute_floor_ms_per_frame"] == pytest.approx(1000 * 6 * 40 * 24 / peaks[
        "int8" if integer else "float32"])
    assert profile["top_ops"][0]["op"] == op and profile["top_ops"][0]["share"] == 1.0


def test_a_floor_counts_each_product_at_the_fastest_rate_it_can_run():
    """MatMulNBits (accuracy_level 4, as build writes it) and the int8 kernels at the int8 rate; a float32
    convolution at float32's: the floor is the least time, never more than the graph could take."""
    from vibevoice_onnx.runtime.profile import NodeRun

    runs = [NodeRun("q", "MatMulNBits", 10, 8_000), NodeRun("d", "DynamicQuantizeMatMul", 10, 4_000),
            NodeRun("c", "Conv", 10, 3_000), NodeRun("n", "SimplifiedLayerNormalization", 10, 0)]
    profile = graph_profile(runs, 2, {"float32": 1_000.0, "int8": 4_000.0})
    assert profile["compute_floor_ms_per_frame"] == pytest.approx(1000 * (12_000 / 4_000 + 3_000 / 1_000) / 2)
    assert profile["macs_per_frame"] == 7_500 and profile["node_calls_per_frame"] == 2


def product_weights(path) -> int:
    """The weight elements a graph's matrix products multiply each input row by: its MatMul and Gemm
    initializers, read with the onnx package (not from any profile)."""
    import onnx

    model = onnx.load(str(path))
    sizes = {t.name: int(np.prod(t.dims)) for t in model.graph.initializer}
    return sum(sizes.get(node.input[1], 0) for node in model.graph.node if node.op_type in ("MatMul", "Gemm"))


def initializer_bytes(path) -> int:
    import onnx

    model = onnx.load(str(path))
    return sum(int(np.prod(t.dims)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
               for t in model.graph.initializer)


@pytest.fixture(scope="module")
def profiled(tiny_bundle, tmp_path_factory):
    bundle = copy_bundle(tiny_bundle, tmp_path_factory.mktemp("profile") / "bundle")  # bench records in it
    return bundle, bench_json(bundle, "--frames", "6", "--profile")


def bench_json(bundle, *options: str) -> dict:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", str(bundle), *options, "--json", "--threads", "1"]) == 0
    return json.loads(out.getvalue())


def test_bench_profile_puts_every_graph_against_its_floors(profiled):
    bundle, report = profiled
    profile, runtime = report["profile"], report["runtime"]
    assert set(profile["graphs"]) == set(runtime["graphs"])
    graphs = json.loads((bundle / "manifest.json").read_text())["graphs"]
    for name, graph in profile["graphs"].items():
        # the bytes a call reads, counted here from the bundle's files (not the report's own count): the graph and
        # its external data, which hold every initializer
        files = [bundle / graphs[name]["file"], *([bundle / graphs[name]["external_data"]]
                                                  if graphs[name].get("external_data") else [])]
        on_disk = sum(f.stat().st_size for f in files)
        assert on_disk >= initializer_bytes(files[0]) > 0
        read = on_disk * runtime["graphs"][name]["calls"] / runtime["frames"]
        assert graph["weight_bytes_per_frame"] == pytest.approx(read)
        assert graph["bandwidth_floor_ms_per_frame"] == pytest.approx(1000 * read / profile["bandwidth_bytes_per_second"])
        assert graph["floor_ms_per_frame"] == max(graph["bandwidth_floor_ms_per_frame"], graph["compute_floor_ms_per_frame"])
        assert graph["bound_by"] == ("compute" if graph["compute_floor_ms_per_frame"] > graph["bandwidth_floor_ms_per_frame"]
                                     else "bandwidth")
        shares = [op["share"] for op in graph["top_ops"]]
        assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1.0001
        assert graph["macs_per_frame"] > 0  # every graph of the realtime model multiplies matrices
    assert profile["floor_ms_per_frame"] == pytest.approx(sum(g["floor_ms_per_frame"] for g in profile["graphs"].values()))


@pytest.mark.parametrize("graph", ["eos_classifier", "acoustic_connector"])
def test_a_graphs_macs_per_call_are_its_product_weights_for_one_row(profiled, graph):
    """The two graphs that are products alone, called on one row each: the profile's MACs per call equal their
    MatMul and Gemm weights' elements, counted from the bundle's ONNX files."""
    bundle, report = profiled
    counted = report["profile"]["graphs"][graph]
    per_call = counted["macs_per_frame"] / counted["calls_per_frame"]
    assert per_call == pytest.approx(product_weights(bundle / f"{graph}.onnx"), rel=1e-12)


def test_bench_profile_prints_and_plots_a_row_per_graph_and_refuses_what_it_cannot_profile(profiled, tiny_asr_bundle,
                                                                                          capsys, tmp_path):
    from vibevoice_onnx.runtime.bench import format_report, plot

    bundle, report = profiled
    text = format_report(report)
    assert "floors        at" in text and all(f"  {name} " in text for name in report["profile"]["graphs"])
    # the memory it reports is the run's (ru_maxrss before the bandwidth probe, which takes the process past it),
    # said so: a user who sees the process at 2.2 GB and "peak memory 0.12 GB" was misled
    assert f"the run's peak memory {report['runtime']['peak_memory_bytes'] / 1e9:.2f} GB" in text
    assert "measured after the run (a probe of 512 MB whose copies take the process past the run's peak)" in text
    plot(report, tmp_path / "bench.png")  # matplotlib: in the test extra
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["bench", str(bundle), "--profile", "--streams", "2"]) == 2
    assert "bench --profile profiles one stream on the CPU" in capsys.readouterr().err
    assert main(["bench", str(tiny_asr_bundle), "--decode-group", "3", "--audio", "x.wav"]) == 2
    assert "takes --streams, --frames (tokens), --audio and --profile only" in capsys.readouterr().err
    assert main(["bench", str(tiny_asr_bundle), "--profile", "--streams", "2", "--audio", "x.wav"]) == 2
    assert "bench --profile profiles one stream on the CPU" in capsys.readouterr().err


def test_bench_profile_of_an_asr_bundle_puts_its_graphs_against_their_floors_per_token(tiny_asr_bundle, tmp_path):
    """A transcription's graphs per greedy token: the encoders run once for the recording, the LM once per token
    (plus its prefill), and the head once per token; each against the weights it reads a token."""
    import soundfile

    from vibevoice_onnx.runtime.bench import format_report

    bundle = copy_bundle(tiny_asr_bundle, tmp_path / "bundle")
    clip = tmp_path / "clip.wav"
    soundfile.write(clip, (0.3 * np.sin(np.arange(24000 * 3) * 0.01)).astype(np.float32), 24000)
    tokens = 6
    report = bench_json(bundle, "--frames", str(tokens), "--profile", "--audio", str(clip))
    profile, timed = report["profile"], report["alone"]["graphs"]
    assert set(profile["graphs"]) == set(timed) and "lm" in timed
    for name, graph in profile["graphs"].items():
        on_disk = sum(path.stat().st_size for path in bundle.glob(f"{name}.onnx*"))  # the graph and its data file
        assert graph["calls_per_frame"] == pytest.approx(timed[name]["calls"] / tokens)
        assert graph["weight_bytes_per_frame"] == pytest.approx(on_disk * timed[name]["calls"] / tokens)
        assert graph["macs_per_frame"] > 0 and graph["floor_ms_per_frame"] > 0
    assert profile["graphs"]["lm"]["calls_per_frame"] >= 1  # a call per token after the prefill
    text = format_report(report)
    assert "ms a token against a floor of" in text and all(f"  {name} " in text for name in profile["graphs"])


def test_onnxruntimes_profile_is_read_node_call_by_node_call(tmp_path):
    """The profile's own format: only "Node" events that time a kernel count; shapes by input, an optional input
    left out as an empty record; a call without a duration or an operator name reads as 0 and "?"."""
    events = [
        {"cat": "Session", "name": "model_run", "dur": 900},
        {"cat": "Node", "name": "lm/MatMul_fence_before", "dur": 1},
        {"cat": "Node", "name": "lm/MatMul_kernel_time", "dur": 12, "args": {
            "op_name": "MatMul", "input_type_shape": [{"float": [1, 5, 64]}, {"float": [64, 128]}],
            "output_type_shape": [{"float": [1, 5, 128]}]}},
        {"cat": "Node", "name": "lm/Conv_kernel_time", "dur": 7, "args": {
            "op_name": "Conv", "input_type_shape": [{"float": [1, 8, 20]}, {"float": [16, 8, 3]}, {}],
            "output_type_shape": [{"float": [1, 16, 18]}]}},
        {"cat": "Node", "name": "odd_kernel_time", "args": {}},
        {"cat": "Node", "name": "bare_kernel_time", "dur": 3},  # no args at all
        {"cat": "Node", "dur": 5},  # no name: no kernel's time
    ]
    (tmp_path / "profile.json").write_text(json.dumps(events))
    runs = node_runs(tmp_path / "profile.json")
    assert [(r.node, r.op, r.microseconds, r.macs) for r in runs] == [
        ("lm/MatMul", "MatMul", 12, 5 * 64 * 128), ("lm/Conv", "Conv", 7, 18 * 16 * 8 * 3), ("odd", "?", 0, 0),
        ("bare", "?", 3, 0)]
    assert macs("MatMul", [[]], [[1, 4]]) == 0 and macs("MatMul", [], [[1]]) == 0 and macs("MatMul", [[1, 2]], []) == 0


def test_a_graphs_costliest_operators_and_nodes_are_its_largest_shares():
    from vibevoice_onnx.runtime.profile import TOP, NodeRun

    runs = [NodeRun(f"n{i}", f"Op{i}", 10 * (i + 1), 100 * (6 - i)) for i in range(7)]  # Op6: most time, fewest MACs
    runs += [NodeRun("n6", "Op6", 70, 600), NodeRun("m6", "Op6", 31, 0)]  # Op6 thrice, in two nodes
    profile = graph_profile(runs, 2, {"float32": 1e3, "int8": 4e3})
    total = sum(r.microseconds for r in runs)  # 381
    assert TOP == 5 and [o["op"] for o in profile["top_ops"]] == ["Op6", "Op5", "Op4", "Op3", "Op2"]
    assert profile["top_ops"][0] == {"op": "Op6", "share": round(171 / total, 4), "ms_per_frame": 171 / 1000 / 2,
                                     "macs_per_frame": 600 / 2}
    assert profile["top_nodes"][0] == {"node": "n6", "op": "Op6", "share": round(140 / total, 4)}
    assert [n["node"] for n in profile["top_nodes"]] == ["n6", "n5", "n4", "n3", "m6"]
    assert profile["nodes"] == 8 and profile["node_calls_per_frame"] == 9 / 2
    assert profile["kernel_ms_per_frame"] == total / 1000 / 2 and profile["macs_per_frame"] == (2100 + 600) / 2
    idle = graph_profile([NodeRun("a", "Add", 0, 0)], 1, {"float32": 1.0, "int8": 1.0})  # no time at all
    assert idle["top_ops"][0]["share"] == 0.0 and idle["compute_floor_ms_per_frame"] == 0.0


def timed_run() -> tuple[dict, dict]:
    """A timed run of two graphs over 4 frames (bench's numbers) and the profile of one of them."""
    runtime = {"frames": 4, "graphs": {"lm": {"calls": 8, "ms_per_frame": 2.0}, "decoder": {"calls": 4, "ms_per_frame": 1.0},
                                       "eos": {"calls": 4, "ms_per_frame": 0.5}},
               "graph_weight_bytes": {"lm": 1_000_000, "decoder": 4_000_000, "eos": 0}}
    profiled = {"lm": {"compute_floor_ms_per_frame": 5.0, "macs_per_frame": 1e6, "nodes": 3, "node_calls_per_frame": 2.0,
                       "kernel_ms_per_frame": 1.5, "top_ops": [{"op": "MatMul", "share": 0.9}], "top_nodes": [],
                       "not_copied": 1}}
    return runtime, profiled


def test_each_graph_is_put_against_the_larger_of_its_two_floors():
    """Bandwidth: the weights it reads a frame (its bytes x calls per frame) at the measured rate; compute: its
    MACs at the peak rate; the floor is the larger, and the report says which bounds it and how far above it is."""
    from vibevoice_onnx.runtime.profile import floors

    runtime, profiled = timed_run()
    report = floors(runtime, profiled, 1e9, {"float32": 1e9, "int8": 4e9})
    lm, decoder, eos = (report["graphs"][name] for name in ("lm", "decoder", "eos"))
    assert lm == {"ms_per_frame": 2.0, "calls_per_frame": 2.0, "weight_bytes_per_frame": 2e6,
                  "achieved_bytes_per_second": 2e6 / 0.002, "bandwidth_floor_ms_per_frame": 2.0,
                  "macs_per_frame": 1e6, "achieved_macs_per_second": 1e6 / 0.002, "compute_floor_ms_per_frame": 5.0,
                  "floor_ms_per_frame": 5.0, "bound_by": "compute", "times_floor": 0.4, "nodes": 3,
                  "node_calls_per_frame": 2.0, "kernel_ms_per_frame": 1.5, "top_ops": [{"op": "MatMul", "share": 0.9}],
                  "top_nodes": []}
    assert (decoder["bandwidth_floor_ms_per_frame"], decoder["floor_ms_per_frame"], decoder["bound_by"]) == (4.0, 4.0, "bandwidth")
    assert decoder["times_floor"] == 0.25 and decoder["macs_per_frame"] == 0.0 and "top_ops" not in decoder
    assert decoder["achieved_macs_per_second"] == 0.0 and decoder["compute_floor_ms_per_frame"] == 0.0
    assert eos["floor_ms_per_frame"] == 0.0 and eos["times_floor"] is None  # nothing to read or multiply
    assert report["graphs_ms_per_frame"] == 3.5 and report["floor_ms_per_frame"] == 9.0
    assert report["times_floor"] == 3.5 / 9.0 and report["bandwidth_bytes_per_second"] == 1e9
    assert report["peak_macs_per_second"] == {"float32": 1e9, "int8": 4e9}
    runtime["graphs"]["lm"]["ms_per_frame"] = 0.0
    still = floors(runtime, {}, 1e9, {"float32": 1e9, "int8": 4e9})["graphs"]["lm"]
    assert still["achieved_bytes_per_second"] == 0.0 and still["achieved_macs_per_second"] == 0.0
    assert floors({"frames": 1, "graphs": {}, "graph_weight_bytes": {}}, {}, 1e9, {})["times_floor"] is None


def test_the_floors_report_reads_a_row_per_graph_slowest_first_then_their_costliest_operators():
    from vibevoice_onnx.runtime.profile import floors, format_floors

    runtime, profiled = timed_run()
    lines = format_floors(floors(runtime, profiled, 2e9, {"float32": 3e9, "int8": 12e9}), unit="token")
    assert lines[0] == ("floors        at 2.0 GB/s, 3 GMAC/s float32, 12 GMAC/s int8: the graphs take 3.5 ms a token "
                        "against a floor of 7.0 (0.5x)")
    assert lines[1] == f"  {'graph':<28}{'ms':>8}{'floor':>8}{'x':>6}  {'bound':<10}{'GB/s':>7}{'GMAC/s':>8}{'MMAC':>9}{'calls':>7}"
    assert lines[2] == f"  {'lm':<28}{2.0:>8.2f}{5.0:>8.2f}{'0.4':>6}  {'compute':<10}{1.0:>7.1f}{0.5:>8.1f}{1.0:>9.1f}{2:>7.0f}"
    assert lines[3] == f"  {'decoder':<28}{1.0:>8.2f}{2.0:>8.2f}{'0.5':>6}  {'bandwidth':<10}{4.0:>7.1f}{0.0:>8.1f}{0.0:>9.1f}{0:>7.0f}"
    assert lines[4] == f"  {'eos':<28}{0.5:>8.2f}{0.0:>8.2f}{'-':>6}  {'bandwidth':<10}{0.0:>7.1f}{0.0:>8.1f}{0.0:>9.1f}{0:>7.0f}"
    assert lines[5:] == ["  lm: MatMul 90%"]  # only the profiled graph has operators to list
