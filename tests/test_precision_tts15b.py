"""VibeVoice-1.5B at int8 and int4: built from the fp32 sibling by the kind's policy, gated against the fp32
reference in both closed loops, refused by `speak` until verified; a broken quantization on the feedback
path caught by the loops; fp16 built for GPUs and checked statically; the speculative CFG streams gate
catching a broken speculation; the tiny checkpoint Microsoft's code saved, and why its int8 verdict is right."""

import json
import shutil

import onnx
import pytest

from vibevoice_onnx.cli import main
from vibevoice_onnx.export.precision import DYNAMIC_INT8, Scheme, policy, quantize_graph

from conftest import SHARED, copy_bundle
from test_precision import assert_follows_policy, unverified_copy

SCRIPT = "Speaker 1: Hello there.\nSpeaker 2: Hi, how are you?"


@pytest.fixture(scope="module")
def variants(tiny_checkpoints, tiny_15b_bundle, tmp_path_factory):
    """A copy of the tiny fp32 1.5B bundle (with its voice), and its int8 and int4 siblings built from it."""
    root = tmp_path_factory.mktemp("precision15b")
    copy_bundle(tiny_15b_bundle, root / "1.5b" / "cpu_fp32")
    for precision in ("int8", "int4"):
        assert main(["build", str(tiny_checkpoints["1.5b"]), "-o", str(root), "--precision", precision,
                     "--graphs", "written"]) == 0
    return root / "1.5b"


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_variants_follow_their_policy(variants, precision):
    assert_follows_policy(variants, "1.5b", precision)
    schemes = policy("1.5b", precision)
    assert {"lm", "diffusion_head_step", "acoustic_decoder_stream", "semantic_encoder_stream"} <= schemes.keys()
    assert not {"acoustic_connector", "semantic_connector"} & schemes.keys()  # small, on the feedback path


def test_int8_is_refused_until_verified_then_passes_and_speaks(variants, tmp_path, capsys):
    bundle = unverified_copy(variants / "cpu_int8", tmp_path / "int8")
    speak = ["speak", str(bundle), SCRIPT, "--speaker", "1=alice", "--speaker", "2=alice", "--max-frames", "3",
             "-o", str(tmp_path / "x.wav")]
    assert main(speak) == 2 and "has not been verified" in capsys.readouterr().err
    assert main(["verify", str(bundle)]) == 0
    record = json.loads((bundle / "manifest.json").read_text())["parity"]
    assert record["precision"] == "int8" and record["passed"] and "random weights" in record["caveat"]
    gates = {g["name"]: g for g in record["gates"]}
    assert gates["closed loop, forced segments: latent divergence within the loop's own spread"]["passed"]
    assert gates["closed loop, forced segments, teacher-forced: conditions"]["cosine"] >= 0.995
    for name in ("acoustic_connector", "semantic_connector"):  # kept fp32: as exact as the fp32 bundle
        assert gates[name]["cosine"] > 0.99999
    assert main(speak) == 0 and (tmp_path / "x.wav").is_file()


def test_int4_is_judged_and_speak_follows_the_verdict(variants, tmp_path, capsys):
    """The tiny 1.5B's int4 verdict sits near its limits (teacher-forced conditions 0.985 against 0.98), so what
    is asserted is what is stable: int4 is farther from the reference than int8 on every teacher-forced gate
    and on the LM, by much more than int8's own error; and `speak` follows whichever verdict it is."""
    bundle = copy_bundle(variants / "cpu_int4", tmp_path / "int4")
    code = main(["verify", str(bundle)])
    record = json.loads((bundle / "manifest.json").read_text())["parity"]
    assert code == (0 if record["passed"] else 1) and record["thresholds"]["graph"]["min_cosine"] == 0.98
    int8 = unverified_copy(variants / "cpu_int8", tmp_path / "int8")
    assert main(["verify", str(int8)]) == 0
    cosines = {precision: {g["name"]: g["cosine"] for g in json.loads((path / "manifest.json").read_text())["parity"]["gates"]
                           if g["cosine"] is not None}
               for precision, path in (("int4", bundle), ("int8", int8))}
    for name in ("lm (past 11, new 5)", "closed loop, forced segments, teacher-forced: conditions",
                 "closed loop, forced segments, teacher-forced: sampled latents"):
        assert 1 - cosines["int4"][name] > 5 * (1 - cosines["int8"][name]), (name, cosines["int4"][name], cosines["int8"][name])
    capsys.readouterr()
    spoke = main(["speak", str(bundle), SCRIPT, "--speaker", "1=alice", "--speaker", "2=alice", "--max-frames", "2",
                  "-o", str(tmp_path / "x.wav")])
    assert spoke == (0 if record["passed"] else 2)


def test_broken_quantization_on_the_feedback_path_is_caught_by_the_loops(variants, tmp_path, capsys):
    """The semantic connector (fp32 by policy: it feeds each decoded latent back into the LM) at 2 bits."""
    bundle = unverified_copy(variants / "cpu_int8", tmp_path / "broken")
    quantize_graph(bundle / "semantic_connector.onnx", Scheme(2, block_size=16, symmetric=True, accuracy_level=0), False)
    assert main(["verify", str(bundle)]) == 1
    failed = {line.split("  ")[0] for line in capsys.readouterr().out.splitlines() if line.rstrip().endswith("FAIL")}
    assert "semantic_connector" in failed
    assert "closed loop, forced segments, teacher-forced: conditions" in failed  # at every forced frame
    assert not failed & {"lm (past 16, new 1)", "diffusion_head", "acoustic_connector"}  # only what was broken


def test_a_speculation_that_is_not_undone_fails_the_streams_gate(variants, tmp_path, monkeypatch, capsys):
    """The negative row's speculative step, left in place when the pick is not speech, is a real defect the
    batched streams could have: the gate against upstream's separate streams on the same graph catches it."""
    from vibevoice_onnx.runtime.lm import BatchedGuidedStreams

    bundle = copy_bundle(variants / "cpu_fp32", tmp_path / "fp32")
    monkeypatch.setattr(BatchedGuidedStreams, "forget", lambda self, row, steps=1: None)
    assert main(["verify", str(bundle)]) == 1
    failed = {line.split("  ")[0] for line in capsys.readouterr().out.splitlines() if line.rstrip().endswith("FAIL")}
    assert "lm: speculative batched CFG streams == separate streams" in failed


def test_fp16_is_built_for_gpus_and_checked_statically(tiny_checkpoints, variants):
    root = variants.parent
    assert main(["build", str(tiny_checkpoints["1.5b"]), "-o", str(root), "--precision", "fp16", "--device", "cuda",
                 "--graphs", "written"]) == 0  # the traced fp16: test_precision's realtime
    bundle = root / "1.5b" / "cuda_fp16"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["device"] == "cuda" and manifest["precision"] == "fp16"
    for name in ("lm", "diffusion_head_step", "semantic_encoder_stream"):
        graph = onnx.load(str(bundle / manifest["graphs"][name]["file"]))
        onnx.checker.check_model(graph, full_check=True)
        assert onnx.TensorProto.FLOAT16 in {t.data_type for t in graph.graph.initializer}, name
        assert all(i.type.tensor_type.elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.INT32)
                   for i in graph.graph.input), name  # fed as the CPU bundle is


def test_bench_runs_exactly_n_latents_of_a_15b_bundle_with_the_reference(tiny_checkpoints, tiny_15b_bundle, capsys):
    """A random LM may pick EOS at once: the bench picks speech at every step, past upstream's 2x-prompt cap."""
    frames = 40
    assert main(["bench", str(tiny_15b_bundle), "--frames", str(frames), "--reference", str(tiny_checkpoints["1.5b"]),
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    runtime, reference = report["runtime"], report["reference"]
    assert runtime["kind"] == "1.5b" and runtime["frames"] == reference["frames"] == frames
    assert len(runtime["chunk_times"]) == len(runtime["resident_bytes"]) == frames
    graphs = runtime["graphs"]
    assert graphs["lm"]["calls"] == 1 + frames  # the prefill, the speech-start step, then one per latent but the last
    assert graphs["acoustic_decoder_stream"]["calls"] == frames == graphs["semantic_encoder_stream"]["calls"] + 1
    assert graphs["diffusion_head_step"]["calls"] == 10 * frames
    assert runtime["growth"]["memory_from_latent"] == frames // 10
    assert reference["growth"]["first_tenth_ms_per_latent"] > 0


def test_bench_refuses_what_it_cannot_time(tiny_15b_bundle, tiny_asr_bundle, capsys):
    assert main(["bench", str(tiny_15b_bundle), "--decode-group", "3"]) == 2
    assert "--decode-group is for realtime bundles" in capsys.readouterr().err
    assert main(["bench", str(tiny_asr_bundle)]) == 2
    assert "give them with --audio FILE" in capsys.readouterr().err
    assert main(["bench", str(tiny_asr_bundle), "--decode-group", "3", "--audio", "x.wav"]) == 2
    assert "takes --streams, --frames (tokens), --audio and --profile only" in capsys.readouterr().err


UPSTREAM_15B = SHARED / "fixtures" / "checkpoints" / "tts15b-upstream-tiny"


@pytest.fixture(scope="module")
def upstream_variants(tmp_path_factory):
    """The tiny VibeVoice-1.5B saved by Microsoft's own code (../shared/fixtures/checkpoints), in fp32 and int8."""
    if not (UPSTREAM_15B / "config.json").is_file():
        pytest.skip("../shared/fixtures/checkpoints/tts15b-upstream-tiny is not available")
    root = tmp_path_factory.mktemp("upstream15b")
    for precision in ("fp32", "int8"):
        assert main(["build", str(UPSTREAM_15B), "-o", str(root), "--precision", precision, "--graphs", "written"]) == 0
    return root / "1.5b"


def test_int8_of_the_checkpoint_microsoft_saved_passes_and_the_decoder_scheme_it_failed_with_is_why(
        upstream_variants, tmp_path, capsys):
    """Its int8 bundle once failed the teacher-forced conditions (0.9915 against 0.995): a real loss, not a gate
    artefact, and one graph's. The 1.5B feeds its decoded audio back (semantic encoder, then the LM), and the
    decoder was quantized as realtime's, where it is only heard: dynamic int8, per-tensor activation scales.
    With the decoder blockwise (the policy now) every gate passes; the same bundle with only the decoder put
    back to dynamic int8 fails the teacher-forced conditions again, and nothing but teacher-forced gates.

    The free-running verdict holds on every CPU only because the calibration perturbs the 1.5B's second
    feedback path as well (decoded audio through the semantic encoder): with an Intel Xeon's int8 kernels
    (AVX-512 VNNI, AMX) this bundle flips one of the LM's picks (forced segments, step 8: margin 1.34 -> -0.25),
    which reference runs perturbed on the latent and the logits alone all kept (1.10-1.36)."""
    assert main(["verify", str(upstream_variants / "cpu_int8"), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["closed_loop"]["curves"]["closed loop, forced segments"]["one_step_error"]["feature_relative"]
    forced = record["closed_loop"]["curves"]["closed loop, forced segments, teacher-forced"]
    assert min(forced["condition_cosine"]) >= 0.995
    one_step = [g for g in record["gates"] if ", teacher-forced: " in g["name"] or "closed loop" not in g["name"]]
    assert one_step and all(g["passed"] for g in one_step), [g["name"] for g in one_step if not g["passed"]]
    old = unverified_copy(upstream_variants / "cpu_int8", tmp_path / "dynamic-decoder")
    shutil.copy(upstream_variants / "cpu_fp32" / "acoustic_decoder_stream.onnx", old / "acoustic_decoder_stream.onnx")
    quantize_graph(old / "acoustic_decoder_stream.onnx", DYNAMIC_INT8, False)
    assert main(["verify", str(old), "--json"]) == 1
    failed = {g["name"] for g in json.loads(capsys.readouterr().out)["gates"] if not g["passed"]}
    assert "closed loop, forced segments, teacher-forced: conditions" in failed
    assert all(", teacher-forced: " in name for name in failed), failed
