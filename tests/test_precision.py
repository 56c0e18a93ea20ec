"""Precision variants: int8 and int4 built from an fp32 sibling, gated against the fp32 reference, refused by
`speak` until they pass; a deliberately broken quantization caught by the closed loop; fp16 built and
checked statically; grouped decoding gated; `bench` on a tiny bundle."""

import json
import shutil

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from vibevoice_onnx.cli import main
from vibevoice_onnx.export.precision import Scheme, policy, quantize_graph
from vibevoice_onnx.runtime.bundle import Bundle

from conftest import copy_bundle

QUANTIZED_OPS = {"MatMulNBits", "MatMulInteger", "DynamicQuantizeMatMul"}


@pytest.fixture(scope="module")
def variants(tiny_checkpoints, tiny_bundle, tmp_path_factory):
    """A copy of the tiny fp32 bundle, with its int8, int4 and int4-mixed siblings built from it (not yet
    verified)."""
    root = tmp_path_factory.mktemp("precision")
    copy_bundle(tiny_bundle, root / "realtime" / "cpu_fp32")
    for precision in ("int8", "int4", "int4-mixed"):
        assert main(["build", str(tiny_checkpoints["realtime"]), "-o", str(root), "--precision", precision,
                     "--graphs", "written"]) == 0
    return root / "realtime"


def unverified_copy(bundle, dst):
    copy_bundle(bundle, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest.pop("parity", None)
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def graph_ops(path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node}


def float_weight_products(path) -> list[str]:
    """The MatMul and Gemm nodes of a graph that still multiply by a float weight the graph holds."""
    graph = onnx.load(str(path), load_external_data=False).graph
    constants = {t.name for t in graph.initializer}
    return [n.name for n in graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in constants]


def assert_follows_policy(variants, kind: str, precision: str) -> None:
    """VARIANTS/cpu_PRECISION: built from the fp32 sibling's source, each graph the kind's policy names
    quantized to its bits (and smaller), every other graph as exported, the sibling's voices carried over."""
    bundle = variants / f"cpu_{precision}"
    manifest = json.loads((bundle / "manifest.json").read_text())
    fp32 = json.loads((variants / "cpu_fp32" / "manifest.json").read_text())
    assert manifest["precision"] == precision and manifest["source"]["hash"] == fp32["source"]["hash"]
    schemes = policy(kind, precision)
    for name, graph in manifest["graphs"].items():
        ops = graph_ops(bundle / graph["file"])
        if name in schemes:
            assert graph["precision"]["bits"] == schemes[name].bits and ops & QUANTIZED_OPS, name
            # every product quantized (what else the graph holds stays: norms, biases, an LM's rotary tables)
            assert float_weight_products(bundle / graph["file"]) == [], name
            assert graph["precision"]["weight_bytes_after"] < graph["precision"]["weight_bytes_before"], name
        else:
            assert graph["precision"] == {"scheme": "fp32"} and not ops & QUANTIZED_OPS, name
    assert sorted(p.name for p in (bundle / "voices").iterdir()) == sorted(p.name for p in (variants / "cpu_fp32" / "voices").iterdir())


@pytest.mark.parametrize("precision", ["int8", "int4", "int4-mixed"])
def test_variants_follow_their_policy_and_keep_the_feedback_path_fp32(variants, precision):
    assert_follows_policy(variants, "realtime", precision)
    assert not {"acoustic_connector", "eos_classifier"} & policy("realtime", precision).keys()


def test_unverified_quantized_bundle_is_refused_until_verified(variants, tmp_path, capsys):
    bundle = unverified_copy(variants / "cpu_int8", tmp_path / "int8")
    out = tmp_path / "speech.wav"
    assert main(["speak", str(bundle), "Hello there.", "-o", str(out), "--max-frames", "2"]) == 2
    assert "has not been verified" in capsys.readouterr().err and not out.exists()
    assert main(["speak", str(bundle), "Hello there.", "-o", str(out), "--max-frames", "2", "--force"]) == 0
    assert out.is_file()


def test_int8_passes_its_gates_and_records_them(variants, capsys):
    bundle = variants / "cpu_int8"
    assert main(["verify", str(bundle)]) == 0
    record = json.loads((bundle / "manifest.json").read_text())["parity"]
    assert record["precision"] == "int8" and record["passed"] and "random weights" in record["caveat"]
    assert record["thresholds"]["forced_latent"] == {"min_cosine": 0.97, "max_gain_error": 0.02}
    gates = {g["name"]: g for g in record["gates"]}
    calibration = record["closed_loop"]["calibration"]
    assert gates["closed loop: latent divergence within the loop's own spread"]["passed"] and len(calibration["divergence"]) == 18  # judged over the whole run
    assert 1e-4 < calibration["floor"] < 0.2 and calibration["worst_ratio"] <= calibration["margin"]
    for name in ("acoustic_connector", "eos_classifier"):  # kept fp32: as exact as the fp32 bundle
        assert gates[name]["cosine"] > 0.99999
    assert main(["speak", str(bundle), "Hello there.", "-o", str(bundle.parent / "int8.wav"), "--max-frames", "2"]) == 0


@pytest.mark.parametrize("factor, refused", [(1.05, True), (1.01, False)])
def test_int8_refuses_a_graph_five_percent_loud_and_takes_one_percent(variants, tmp_path, factor, refused):
    """int8's own error is noise around the right size (its gain error measured at most 8e-3, tiny and full size):
    a 5% gain in the decoder, the head, the connector or the upper LM is refused by that graph's gate; 1% is within
    what int8 is allowed (0.02), and passes."""
    from helpers import GAINED_GATES, gained_copy

    from vibevoice_onnx.verify.common import verify_bundle

    bundle = gained_copy(variants / "cpu_int8", tmp_path / "cpu_int8", factor)
    record = verify_bundle(bundle, log=lambda line: None)
    gates = {g["name"]: g for g in record["gates"]}
    assert record["passed"] != refused, [g["name"] for g in record["gates"] if not g["passed"]]
    for gate in GAINED_GATES.values():
        assert gates[gate]["passed"] != refused and gates[gate]["gain"] == pytest.approx(factor, abs=0.01), gates[gate]


def test_int4_mixed_keeps_the_feedback_path_at_8_bits_and_passes(variants, capsys):
    """4 bits only in the decoder, which is off the feedback path: the teacher-forced audio judges it."""
    bundle = variants / "cpu_int4-mixed"
    graphs = json.loads((bundle / "manifest.json").read_text())["graphs"]
    assert graphs["acoustic_decoder_stream"]["precision"]["bits"] == 4
    assert {graphs[name]["precision"]["bits"] for name in ("lower_lm", "upper_lm", "diffusion_head_step")} == {8}
    assert main(["verify", str(bundle), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["precision"] == "int4-mixed" and record["thresholds"]["graph"]["min_cosine"] == 0.98
    gates = {g["name"]: g for g in record["gates"]}
    assert record["passed"] and gates["closed loop, teacher-forced: audio"]["cosine"] >= 0.98


def test_int4_fails_its_gates_and_speak_refuses_it(variants, capsys):
    """int4's LMs cost one step 0.93 in the conditions' cosine (int8: 0.999) on the tiny checkpoint, as int4 fails
    at full size: a verdict far from its limit (0.98), so asserted; the failing gates are the teacher-forced ones
    on the feedback path, and `speak` refuses the bundle."""
    bundle = copy_bundle(variants / "cpu_int4", variants.parent / "int4-judged")
    assert main(["verify", str(bundle)]) == 1
    record = json.loads((bundle / "manifest.json").read_text())["parity"]
    failed = {g["name"]: g for g in record["gates"] if not g["passed"]}
    assert not record["passed"] and record["precision"] == "int4"
    assert failed["closed loop, teacher-forced: conditions"]["cosine"] < 0.96, failed
    assert not any(name.startswith(("acoustic", "eos", "decoder", "batched", "bound")) for name in failed), failed
    capsys.readouterr()
    assert main(["speak", str(bundle), "Hello.", "-o", str(bundle / "x.wav"), "--max-frames", "2"]) == 2
    assert "failed its parity gates" in capsys.readouterr().err


def test_broken_quantization_is_caught_by_the_closed_loop(variants, tmp_path, capsys):
    """The acoustic connector (kept fp32 by policy: it feeds each latent back) quantized to 2 bits in blocks
    of 16: every forced frame's feedback is off, which the teacher-forced gates (what one step may cost) catch."""
    bundle = unverified_copy(variants / "cpu_int8", tmp_path / "broken")
    quantize_graph(bundle / "acoustic_connector.onnx", Scheme(2, block_size=16, symmetric=True, accuracy_level=0), False)
    assert main(["verify", str(bundle)]) == 1
    failed = {line.split("  ")[0] for line in capsys.readouterr().out.splitlines() if line.rstrip().endswith("FAIL")}
    assert "closed loop, teacher-forced: conditions" in failed  # one step's feedback is off
    assert not failed & {"upper_lm (past 16, new 1)", "diffusion_head", "eos_classifier"}  # only what was broken


def test_fp16_is_built_for_gpus_and_checked_statically(tiny_checkpoints, variants, tmp_path, capsys):
    root = variants.parent
    assert main(["build", str(tiny_checkpoints["realtime"]), "-o", str(root), "--precision", "fp16", "--device", "cuda"]) == 0
    bundle = root / "realtime" / "cuda_fp16"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["device"] == "cuda" and manifest["precision"] == "fp16"
    head = onnx.load(str(bundle / manifest["graphs"]["diffusion_head_step"]["file"]))
    onnx.checker.check_model(head, full_check=True)
    assert {onnx.TensorProto.FLOAT16} <= {t.data_type for t in head.graph.initializer}
    assert all(i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for i in head.graph.input)  # fed fp32
    capsys.readouterr()
    assert main(["build", str(tiny_checkpoints["realtime"]), "-o", str(tmp_path), "--precision", "fp16"]) == 2
    assert "build it with --device cuda" in capsys.readouterr().err and not (tmp_path / "realtime").exists()
    if "CUDAExecutionProvider" not in __import__("onnxruntime").get_available_providers():
        assert main(["speak", str(bundle), "Hi.", "-o", str(tmp_path / "x.wav"), "--force"]) == 2
        assert "CUDA" in capsys.readouterr().err


def test_grouped_decoding_gives_frame_by_frame_audio(tiny_bundle):
    from vibevoice_onnx.runtime.realtime import RealtimeTTS

    tts = RealtimeTTS(tiny_bundle)
    runs = {group: tts.stream("Grouped decoding must not change a sample.", "synthetic", seed=3, max_frames=8,
                              decode_group=group) for group in (1, 3, 5)}
    chunks = {group: [chunk.samples for chunk in speech] for group, speech in runs.items()}
    assert [len(c) for c in chunks[3]] == [3200] * 8  # still one chunk per frame, in order
    audio = {group: np.concatenate(pieces) for group, pieces in chunks.items()}
    np.testing.assert_allclose(audio[3], audio[1], atol=1e-5)
    np.testing.assert_allclose(audio[5], audio[1], atol=1e-5)


def test_bench_times_exactly_n_frames_with_the_reference(tiny_checkpoints, tiny_bundle, tmp_path, capsys):
    plot = tmp_path / "latency.png"
    assert main(["bench", str(tiny_bundle), "--frames", "7", "--reference", str(tiny_checkpoints["realtime"]),
                 "--json", "--plot", str(plot), "--decode-group", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    runtime, reference = report["runtime"], report["reference"]
    assert runtime["frames"] == reference["frames"] == 7 and len(runtime["chunk_times"]) == 7
    assert runtime["options"] == {"decode_group": 3}
    assert runtime["real_time_factor"] == pytest.approx(runtime["wall_seconds"] / (7 * 3200 / 24000))
    graphs = runtime["graphs"]
    assert graphs["diffusion_head_step"]["calls"] == 7 * 5  # 5 solver steps, both CFG streams in one call
    assert graphs["diffusion_head_conditioning"]["calls"] == 7  # all steps' modulations in one call per frame
    assert graphs["acoustic_decoder_stream"]["calls"] == 1 + 3  # frame 1 alone, 3, 2 (the first window's end), 1
    expected = sum(Bundle(tiny_bundle).weight_bytes(name) * g["calls"] for name, g in graphs.items()) / 7
    assert runtime["weight_bytes_per_frame"] == pytest.approx(expected)
    assert runtime["first_audio_seconds"] <= runtime["chunk_times"][-1] and report["bandwidth_bytes_per_second"] > 1e8
    assert runtime["warm_first_audio_seconds"] > 0  # a time of another run: compared with nothing here
    assert runtime["host_tensor_bytes"] == (tiny_bundle / "host.safetensors").stat().st_size
    assert runtime["shared_pool_threads"] is None  # main() called with a list leaves the process's pools alone
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_growth_report_is_the_runs_own_times_and_memory():
    from vibevoice_onnx.runtime.bench import growth

    times = list(np.cumsum([5.0] + [0.1] * 10 + [0.2] * 80 + [0.4] * 10))  # 101 latents, the first with the prefill
    memory = [100] * 10 + [200] * 80 + [210] * 11
    report = growth({"chunk_times": times, "resident_bytes": memory})
    assert report["first_tenth_ms_per_latent"] == pytest.approx(100) and report["last_tenth_ms_per_latent"] == pytest.approx(400)
    assert report["memory_from_latent"] == 10 and report["resident_bytes_then"] == 200
    assert report["memory_growth"] == pytest.approx(0.05)
    long = growth({"chunk_times": list(np.arange(1200.0)), "resident_bytes": [1] * 500 + [2] * 700})
    assert long["memory_from_latent"] == 500 and long["memory_growth"] == 0


def nbits_of(path) -> list[int]:
    graph = onnx.load(str(path)).graph
    return [next(a.i for a in node.attribute if a.name == "bits") for node in graph.node if node.op_type == "MatMulNBits"]


def test_a_mixed_scheme_quantizes_each_layer_and_projection_as_its_rules_say(tiny_bundle, tmp_path):
    """The tiny upper LM has 4 layers of 5 weight MatMuls (q, k and v in one product, o, gate, up, down)."""
    from vibevoice_onnx.export.precision import INT4, INT8_WIDE, LayerRule, Mixed

    path = tmp_path / "upper_lm.onnx"
    shutil.copyfile(tiny_bundle / "upper_lm.onnx", path)
    mixed = Mixed(INT4, (LayerRule(INT8_WIDE, "first", 1), LayerRule(INT8_WIDE, "last", 1, ("o", "down")),
                         LayerRule(INT8_WIDE, "last", 2, ("q", "k", "v"))))
    details = quantize_graph(path, mixed, False)
    four, eight = [4] * 5, [8] * 5
    assert nbits_of(path) == eight + four + [8, 4, 4, 4, 4] + [8, 8, 4, 4, 8]
    assert details["matmuls"] == 20 and details["method"] == "mixed"
    assert details["rules"][1] == {"scheme": INT8_WIDE.describe(), "layers": "last 1", "projections": ["o", "down"]}


def test_a_mixed_scheme_that_splits_a_packed_query_key_value_product_is_refused(tiny_bundle, tmp_path):
    """q, k and v are one product in the graph: a rule cannot give them different bits."""
    from vibevoice_onnx.errors import VibeVoiceError
    from vibevoice_onnx.export.precision import INT4, INT8_WIDE, LayerRule, Mixed

    path = tmp_path / "upper_lm.onnx"
    shutil.copyfile(tiny_bundle / "upper_lm.onnx", path)
    with pytest.raises(VibeVoiceError, match="layer 3: the rules give q, k and v different bits"):
        quantize_graph(path, Mixed(INT4, (LayerRule(INT8_WIDE, "last", 1, ("v", "down")),)), False)


def test_a_mixed_scheme_of_one_scheme_is_that_scheme(tiny_bundle, tmp_path):
    from vibevoice_onnx.export.precision import INT4, INT8_WIDE, LayerRule, Mixed

    paths = [tmp_path / "plain.onnx", tmp_path / "mixed.onnx"]
    for path, scheme in zip(paths, (INT8_WIDE, Mixed(INT4, (LayerRule(INT8_WIDE),)))):
        shutil.copyfile(tiny_bundle / "upper_lm.onnx", path)
        quantize_graph(path, scheme, False)
    plain, mixed = ({t.name: numpy_helper.to_array(t) for t in onnx.load(str(p)).graph.initializer} for p in paths)
    assert plain.keys() == mixed.keys() and all(np.array_equal(plain[k], mixed[k]) for k in plain)


def test_a_mixed_scheme_refuses_a_graph_that_is_not_an_lm(tiny_bundle, tmp_path):
    from vibevoice_onnx.errors import VibeVoiceError
    from vibevoice_onnx.export.precision import INT4, INT8_WIDE, LayerRule, Mixed

    path = tmp_path / "acoustic_connector.onnx"
    shutil.copyfile(tiny_bundle / "acoustic_connector.onnx", path)
    with pytest.raises(VibeVoiceError, match="needs a Qwen2 stack's weight MatMuls per layer in order"):
        quantize_graph(path, Mixed(INT4, (LayerRule(INT8_WIDE, "first", 1),)), False)
