"""The torch-free builder (writer/): a realtime bundle built where torch cannot be imported, held to the bundle
torch.onnx traces from the same checkpoint — every graph's outputs on the same inputs, the quantized weights, the
whole generation loop — and then spoken from without torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from helpers import torch_blocked_environment
from vibevoice_onnx.export.build import TRACED, WRITTEN, build_bundle

# fp32's own limits for one graph computed two ways (the same operators; the rotary and timestep tables rounded
# from float64 where torch's fp32 kernels round their own way): the largest difference against the output's
# scale, the direction, and the gain (the norms' ratio), so an output off in size fails as one off in direction.
MAX_ERROR, MIN_COSINE, MAX_GAIN_ERROR = 1e-5, 0.9999999, 1e-6
# Graphs with no such table: the same operators on the same weights give the same bits.
BITWISE = ("diffusion_head_step", "acoustic_connector", "eos_classifier", "acoustic_decoder_stream")
SIZES = {"batch": 2, "sequence": 3, "capacity": 16, "frames": 2, "samples": 2 * 3200 + 123}  # not whole frames


def size(dim) -> int:
    """A manifest's dimension: a number, a name of SIZES, or HOP*name (a streaming encoder's whole frames)."""
    if isinstance(dim, int):
        return dim
    factor, _, name = dim.rpartition("*")
    return int(factor or 1) * SIZES[name]


def run_blocked(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI in a process where torch and transformers cannot be imported (the base install)."""
    return subprocess.run([sys.executable, "-m", "vibevoice_onnx.cli", *args], capture_output=True, text=True,
                          env=torch_blocked_environment(tmp), timeout=300)


@pytest.fixture(scope="module")
def written(tiny_checkpoints, tmp_path_factory) -> Path:
    """fp32 and int8 realtime bundles built with torch blocked (the int8 one from the fp32 one beside it)."""
    root = tmp_path_factory.mktemp("written")
    for precision in ("fp32", "int8"):
        done = run_blocked(root, "build", str(tiny_checkpoints["realtime"]), "-o", str(root / "onnx"),
                           "--precision", precision)
        assert done.returncode == 0, done.stderr
    return root / "onnx" / "realtime"


def traced_once(shared_dir, checkpoint: Path, precision: str = "fp32", **given) -> Path:
    """The run's traced bundle of `checkpoint` (conftest.built_once: one trace a run for every file that needs
    it), checked to be traced: a written one here would hold the writer to itself."""
    from conftest import built_once

    bundle = built_once(shared_dir, checkpoint, "traced", precision=precision, **given)
    assert manifest(bundle)["tools"]["graphs"] == TRACED, bundle
    return bundle


@pytest.fixture(scope="module")
def traced(tiny_checkpoints, tiny_preset, shared_dir) -> Path:
    """The traced fp32 bundle, and the traced int8 bundle made from it (FOLDER/cpu_fp32, FOLDER/cpu_int8)."""
    return traced_once(shared_dir, tiny_checkpoints["realtime"], "int8", voice=(tiny_preset, "synthetic")).parent


def graph_inputs(entry: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Inputs a graph takes: two rows of three new tokens over a 16-slot cache, two latent frames, random states."""
    fixed = {"seqlens_k": np.array([2, 2], np.int32), "total_sequence_length": np.array(3, np.int32),
             "position_ids": np.tile(np.arange(3), (2, 1)), "timesteps": np.array([999.0, 500.0], np.float32)}
    feeds = {}
    for spec in entry["inputs"]:
        scale = 0.1 if spec["name"] == "audio" else 1.0  # audio in [-1, 1]
        drawn = (rng.standard_normal([size(d) for d in spec["shape"]]) * scale).astype(spec["dtype"])
        feeds[spec["name"]] = fixed.get(spec["name"], drawn)
    return feeds


def outputs(bundle: Path, entry: dict, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(str(bundle / entry["file"]), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def closeness(reference: np.ndarray, other: np.ndarray) -> tuple[float, float, float]:
    """(largest difference against the reference's scale, cosine, |gain - 1|)."""
    a, b = reference.astype(np.float64).ravel(), other.astype(np.float64).ravel()
    norms = np.linalg.norm(a) * np.linalg.norm(b)
    cosine = float(a @ b / norms) if norms else float(np.array_equal(a, b))
    gain = np.linalg.norm(b) / np.linalg.norm(a) if np.linalg.norm(a) else 1.0
    return float(np.abs(a - b).max() / (np.abs(a).max() or 1.0)), cosine, abs(gain - 1.0)


def manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


# The ASR graphs with no rotary table: the head, the encoders streaming a segment of any length (upstream's
# right padding on its last one), the connectors' sum.
ASR_BITWISE = ("lm_head", "acoustic_encoder_stream", "semantic_encoder_stream", "audio_connector")


@pytest.mark.parametrize("kind, precision", [("asr", "fp32"), ("asr", "int8"), ("asr-hf", "fp32"),
                                             ("asr-streaming", "fp32")])
def test_the_asr_graphs_written_without_torch_compute_what_the_traced_ones_do(kind, precision, tiny_checkpoints,
                                                                               tiny_asr_tokenizer, shared_dir, tmp_path):
    """ASR in both hub layouts (transformers' names read through the upstream ones) and ASR-Streaming (its head
    tied to the embedding), written with torch blocked; int8 against the traced int8 (its LM streamed from the
    shards)."""
    from safetensors.numpy import load_file

    from vibevoice_onnx.runtime.bundle import HOST_TENSORS

    tokenizer, checkpoint = tiny_asr_tokenizer, tiny_checkpoints[kind]
    traced = traced_once(shared_dir, checkpoint, precision, tokenizer=tokenizer)
    done = run_blocked(tmp_path, "build", str(checkpoint), "-o", str(tmp_path / "written"), "--precision", precision,
                       "--tokenizer", str(tokenizer))
    assert done.returncode == 0, done.stderr
    written = tmp_path / "written" / kind / f"cpu_{precision}"
    assert manifest(written)["tools"]["graphs"] == WRITTEN
    assert_graphs_compute_alike(written, traced, ASR_BITWISE)
    ours, theirs = (load_file(str(b / HOST_TENSORS)) for b in (written, traced))
    assert ours.keys() == theirs.keys() and all(np.array_equal(ours[k], theirs[k]) for k in ours)


def test_the_base_install_builds_a_realtime_bundle_by_writing_its_graphs(written, traced):
    """With torch blocked, `build` writes the graphs (the manifest says so), and the bundle holds the traced
    bundle's graphs with the same inputs, outputs and streaming states."""
    for precision in ("fp32", "int8"):
        ours, theirs = manifest(written / f"cpu_{precision}"), manifest(traced / f"cpu_{precision}")
        assert ours["tools"]["graphs"] == WRITTEN and ours["tools"]["torch"] in (None, theirs["tools"]["torch"])
        assert theirs["tools"]["graphs"] == TRACED
        assert ours["graphs"].keys() == theirs["graphs"].keys()
        for name, entry in ours["graphs"].items():
            for side in ("inputs", "outputs"):
                assert [(v["name"], v["dtype"]) for v in entry[side]] == \
                    [(v["name"], v["dtype"]) for v in theirs["graphs"][name][side]], (precision, name, side)
            assert entry.get("states") == theirs["graphs"][name].get("states"), name
            assert entry.get("precision", {}).get("scheme") == theirs["graphs"][name].get("precision", {}).get("scheme")


def assert_graphs_compute_alike(ours: Path, theirs: Path, bitwise=BITWISE) -> None:
    """Every graph of bundle `ours` gives what the same graph of `theirs` gives on the same inputs: bit for bit
    where `bitwise` names it, else within fp32's limits; the same inputs, outputs and states in the manifests."""
    rng = np.random.default_rng(0)
    assert manifest(ours)["graphs"].keys() == manifest(theirs)["graphs"].keys()
    for name, entry in manifest(ours)["graphs"].items():
        other_entry = manifest(theirs)["graphs"][name]
        for side in ("inputs", "outputs"):
            assert [(v["name"], v["dtype"]) for v in entry[side]] == [(v["name"], v["dtype"]) for v in other_entry[side]]
        assert entry.get("states") == other_entry.get("states"), name
        feeds = graph_inputs(entry, rng)
        for reference, other in zip(outputs(theirs, other_entry, feeds), outputs(ours, entry, feeds)):
            assert reference.shape == other.shape, name
            if name in bitwise:
                assert np.array_equal(reference, other), name
            error, cosine, gain = closeness(reference, other)
            assert error <= MAX_ERROR and cosine >= MIN_COSINE and gain <= MAX_GAIN_ERROR, (name, error, cosine, gain)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_every_written_graph_computes_what_the_traced_one_does(written, traced, precision):
    assert_graphs_compute_alike(written / f"cpu_{precision}", traced / f"cpu_{precision}")


# The 1.5B's and Large's graphs with no rotary or timestep table: the same operators on the same weights. The
# encoders too: the whole-sequence one pads each strided conv to whole strides as upstream does.
LONG_FORM_BITWISE = ("diffusion_head_step", "acoustic_connector", "semantic_connector", "acoustic_encoder",
                     "acoustic_decoder_stream", "semantic_encoder_stream")


@pytest.fixture(scope="module")
def long_form(tiny_checkpoints, shared_dir, tmp_path_factory) -> dict[str, Path]:
    """The tiny 1.5B's fp32 and int8 bundles written with torch blocked, and traced (the int8 ones from the fp32
    one beside them, as `build` makes them): {"written": FOLDER, "traced": FOLDER}, each with cpu_fp32, cpu_int8."""
    root = tmp_path_factory.mktemp("long-form")
    for precision in ("fp32", "int8"):
        done = run_blocked(root, "build", str(tiny_checkpoints["1.5b"]), "-o", str(root / "written"),
                           "--precision", precision)
        assert done.returncode == 0, done.stderr
    return {"written": root / "written" / "1.5b",
            "traced": traced_once(shared_dir, tiny_checkpoints["1.5b"], "int8").parent}


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_the_15b_graphs_written_without_torch_compute_what_the_traced_ones_do(long_form, precision):
    """Its eight graphs: the LM, the head's two, both connectors, the whole-sequence acoustic encoder (a batch of
    2.04 frames: upstream's right padding), the streaming decoder and the streaming semantic encoder with states."""
    written, traced = (long_form[side] / f"cpu_{precision}" for side in ("written", "traced"))
    assert manifest(written)["tools"]["graphs"] == WRITTEN and manifest(traced)["tools"]["graphs"] == TRACED
    assert_graphs_compute_alike(written, traced, LONG_FORM_BITWISE)


def test_the_large_graphs_written_compute_what_the_traced_ones_do(tiny_checkpoints, shared_dir, tmp_path):
    """Large: the 1.5B's graphs from the 7B's layout, and its untied head's rows among the host tensors."""
    from safetensors.numpy import load_file

    from vibevoice_onnx.runtime.bundle import HOST_TENSORS

    written = build_bundle(tiny_checkpoints["large"], tmp_path, write=True)
    traced = traced_once(shared_dir, tiny_checkpoints["large"])
    assert_graphs_compute_alike(written, traced, LONG_FORM_BITWISE)
    ours, theirs = (load_file(str(b / HOST_TENSORS)) for b in (written, traced))
    assert ours.keys() == theirs.keys() and "lm_head" in ours
    assert all(ours[k].dtype == theirs[k].dtype and np.array_equal(ours[k], theirs[k]) for k in ours)


def quantized_weights(path: Path) -> list[np.ndarray]:
    """Every 8-bit initializer and every input of a MatMulNBits (codes, scales, zero points), in node order."""
    model = onnx.load(str(path))
    stored = {t.name: t for t in model.graph.initializer}
    found = []
    for node in model.graph.node:
        for index, name in enumerate(node.input):
            tensor = stored.get(name)
            if tensor is not None and (node.op_type == "MatMulNBits" and index > 0
                                       or tensor.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)):
                found.append(numpy_helper.to_array(tensor))
    return found


def test_the_written_int8_bundle_holds_the_traced_bundles_quantized_weights_bit_for_bit(written, traced):
    for name, entry in manifest(written / "cpu_int8")["graphs"].items():
        ours = quantized_weights(written / "cpu_int8" / entry["file"])
        theirs = quantized_weights(traced / "cpu_int8" / entry["file"])
        assert len(ours) == len(theirs), name
        assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(ours, theirs)), name
        quantizes = entry["precision"]["scheme"] != "fp32"
        assert bool(ours) == quantizes, name  # every quantized graph holds such weights, no fp32 one does


def test_the_whole_loop_speaks_the_same_audio_from_both_bundles(written, traced, tiny_preset, tmp_path):
    import vibevoice_onnx
    from vibevoice_onnx.runtime.voice_store import import_voice

    bundle = shutil.copytree(written / "cpu_fp32", tmp_path / "cpu_fp32")
    import_voice(bundle, tiny_preset, "synthetic")
    speech = [vibevoice_onnx.open(b, threads=1).create("Hello there, said twice.", voice="synthetic", seed=7,
                                                       max_frames=12)[0] for b in (traced / "cpu_fp32", bundle)]
    assert speech[0].shape == speech[1].shape and speech[0].size == 12 * 3200
    error, cosine, gain = closeness(*speech)
    assert error <= 1e-4 and cosine >= 0.999999 and gain <= 1e-5, (error, cosine, gain)


def test_the_written_bundle_speaks_without_torch(written, tiny_preset, tmp_path):
    bundle = shutil.copytree(written / "cpu_int8", tmp_path / "cpu_int8")
    for step in (["voices", "import", str(bundle), str(tiny_preset), "--name", "synthetic"],
                 ["speak", str(bundle), "Hello.", "--voice", "synthetic", "--max-frames", "6", "--force", "-o",
                  str(tmp_path / "hello.wav")]):
        done = run_blocked(tmp_path, *step)
        assert done.returncode == 0, done.stderr
    import soundfile

    audio, rate = soundfile.read(tmp_path / "hello.wav")
    assert rate == 24000 and audio.size == 6 * 3200 and np.abs(audio).max() > 0


def test_the_bitnet_graphs_written_without_torch_hold_the_traced_ternary_codes_bit_for_bit(tiny_checkpoints, shared_dir,
                                                                                            tmp_path):
    """ASR-BitNet, written with torch blocked: its LM's BitLinear projections ternarized from the F32 latent weights
    as they are read and packed as 2-bit MatMulNBits (pack_ternary's form, without ever holding the fp32 LM): every
    quantized tensor the traced and packed bundle holds, bit for bit, at fp32 and int8, and every graph computing
    what the traced one does."""
    checkpoint = tiny_checkpoints["asr-bitnet"]
    for precision in ("fp32", "int8"):
        done = run_blocked(tmp_path, "build", str(checkpoint), "-o", str(tmp_path / "written"), "--precision", precision)
        assert done.returncode == 0, done.stderr
        written = tmp_path / "written" / "asr-bitnet" / f"cpu_{precision}"
        traced = traced_once(shared_dir, checkpoint, precision)
        ours, theirs = (manifest(b)["graphs"]["lm"]["precision"] for b in (written, traced))
        counts = ("weight_bytes_before", "weight_bytes_after")  # the graphs' own small constants differ
        assert {k: v for k, v in ours.items() if k not in counts} == {k: v for k, v in theirs.items() if k not in counts}
        assert all(ours[k] == pytest.approx(theirs[k], rel=1e-3) for k in counts)
        for name, entry in manifest(written)["graphs"].items():
            ours, theirs = quantized_weights(written / entry["file"]), quantized_weights(traced / entry["file"])
            assert len(ours) == len(theirs) and (name != "lm" or ours), name
            assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(ours, theirs)), name
        assert_graphs_compute_alike(written, traced, ASR_BITWISE)


def test_without_torch_verify_judges_the_15b_int8_bundle_against_the_fp32_one_beside_it(long_form, tmp_path):
    """The base install's `verify` of a written 1.5B int8 bundle: the teacher is the fp32 bundle beside it, and the
    verdict passes (tests/test_teacher_gates.py holds it to PyTorch's for each kind)."""
    from vibevoice_onnx.verify.judge import TEACHER_REFERENCE

    for precision in ("fp32", "int8"):
        shutil.copytree(long_form["written"] / f"cpu_{precision}", tmp_path / "1.5b" / f"cpu_{precision}")
    done = run_blocked(tmp_path, "verify", str(tmp_path / "1.5b" / "cpu_int8"), "--json")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    record = json.loads(done.stdout)
    assert record["passed"] and record["reference"] == TEACHER_REFERENCE
    assert record["teacher"]["bundle"] == str((tmp_path / "1.5b" / "cpu_fp32").resolve())


def test_the_fixed_profile_is_traced_and_judged_against_pytorch_only(tiny_checkpoints, written, tmp_path):
    """Its graphs are not written, and a fixed-shape bundle (a pulled one, say) given a teacher is refused in one
    sentence, not judged by the default profile's gates on graphs it does not have."""
    from vibevoice_onnx.errors import VibeVoiceError
    from vibevoice_onnx.export.fixed import FixedProfile
    from vibevoice_onnx.verify.judge import verify_bundle

    profile = FixedProfile.from_options(None, None, False)
    with pytest.raises(VibeVoiceError, match="not available for the fixed-shape profile yet"):
        build_bundle(tiny_checkpoints["realtime"], tmp_path, profile=profile, write=True)
    shutil.copytree(written / "cpu_fp32", tmp_path / "realtime" / "cpu_fp32")
    fixed = build_bundle(tiny_checkpoints["realtime"], tmp_path, "int8", profile=profile, write=False)
    with pytest.raises(VibeVoiceError, match="is a fixed-shape bundle, and those are judged against the PyTorch "
                                             "reference only so far"):
        verify_bundle(fixed, teacher=tmp_path / "realtime" / "cpu_fp32", log=lambda line: None)


def test_without_torch_an_int8_bundle_is_judged_against_the_written_fp32_graphs(written, tiny_checkpoints, tmp_path):
    """`verify` in the base install takes the fp32 bundle beside it as the teacher, records so, and passes; the same
    bundle judged against PyTorch gives the same verdict, and the teacher-forced numbers agree (new reference ==
    old reference: the teacher's graphs compute the reference's numbers)."""
    from vibevoice_onnx.verify.judge import TEACHER_REFERENCE, verify_bundle

    bundle = shutil.copytree(written / "cpu_int8", tmp_path / "realtime" / "cpu_int8")
    shutil.copytree(written / "cpu_fp32", tmp_path / "realtime" / "cpu_fp32")
    done = run_blocked(tmp_path, "verify", str(bundle), "--json")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["passed"] and record["reference"] == TEACHER_REFERENCE
    assert record["teacher"]["bundle"] == str((tmp_path / "realtime" / "cpu_fp32").resolve())
    assert manifest(bundle)["parity"] == record
    by_torch = verify_bundle(shutil.copytree(bundle, tmp_path / "torch" / "cpu_int8"), tiny_checkpoints["realtime"],
                             log=lambda line: None)
    assert by_torch["passed"]
    ours, theirs = ({g["name"]: g for g in r["gates"]} for r in (record, by_torch))
    for name in ("closed loop, teacher-forced: sampled latents", "closed loop, teacher-forced: audio",
                 "closed loop, teacher-forced: conditions"):
        assert ours[name]["cosine"] == pytest.approx(theirs[name]["cosine"], abs=2e-3), name
        assert ours[name]["gain"] == pytest.approx(theirs[name]["gain"], abs=2e-3), name


@pytest.mark.parametrize("factor, refused", [(1.05, True), (1.01, False)])
def test_the_teacher_refuses_a_graph_five_percent_loud_and_takes_one_percent(written, tmp_path, factor, refused):
    """As against PyTorch (tests/test_precision.py): a 5% gain in the decoder, the head, the connector or the
    upper LM is refused by that graph's own gate against the teacher; 1% is within int8's 0.02."""
    from helpers import gained_copy

    from vibevoice_onnx.verify.judge import verify_bundle

    bundle = gained_copy(written / "cpu_int8", tmp_path / "cpu_int8", factor)
    record = verify_bundle(bundle, teacher=written / "cpu_fp32", log=lambda line: None)
    gates = {g["name"]: g for g in record["gates"]}
    assert record["passed"] != refused
    for graph in ("acoustic_decoder_stream (3 frames, states)", "diffusion_head", "acoustic_connector", "upper_lm"):
        gate = gates[f"{graph}: against the teacher's graph"]
        assert gate["passed"] != refused, gate
        if refused:  # the refusing gate saw the gain put in (at 1%, int8's own noise in the decoder's states is as large)
            assert gate["gain"] == pytest.approx(factor, abs=0.01), gate


def test_a_teacher_must_be_the_fp32_bundle_of_the_same_checkpoint(written, traced, tmp_path):
    from vibevoice_onnx.errors import VibeVoiceError
    from vibevoice_onnx.verify.judge import verify_bundle

    with pytest.raises(VibeVoiceError, match="the teacher must be an fp32 bundle"):
        verify_bundle(written / "cpu_int8", teacher=traced / "cpu_int8")
    other = shutil.copytree(written / "cpu_fp32", tmp_path / "other")
    record = json.loads((other / "manifest.json").read_text())
    record["source"]["hash"] = "sha256:" + "0" * 64
    (other / "manifest.json").write_text(json.dumps(record))
    with pytest.raises(VibeVoiceError, match="was not built from the checkpoint"):
        verify_bundle(written / "cpu_int8", teacher=other)
    done = run_blocked(tmp_path, "verify", str(shutil.copytree(written / "cpu_int8", tmp_path / "alone" / "cpu_int8")))
    assert done.returncode != 0 and "needs the fp32 bundle of the same checkpoint beside it" in done.stderr
    assert "Traceback" not in done.stderr


def test_without_a_precision_a_bundle_whose_int8_gates_fail_falls_back_to_fp32_in_one_sentence(tiny_checkpoints, tiny_preset,
                                                                                              tmp_path):
    """The default precision is the fastest whose gates pass: here int8's are made to refuse it (its graph limits
    set beyond reach in every process, so the int8 bundle fails as a bad one would), and the first use says so
    and speaks from fp32; the next use goes to fp32 at once."""
    from helpers import BLOCK_TORCH
    from hub_standin import environment

    site = tmp_path / "strict"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        BLOCK_TORCH + "import dataclasses\nimport vibevoice_onnx.verify.judge as judge\n"
        "judge.LIMITS['int8'] = dataclasses.replace(judge.LIMITS['int8'], graph=judge.Tolerance(1.0, 0.0, 0.0))\n")
    env = {**environment(tmp_path), "PYTHONPATH": str(site)}
    said = []
    for run in range(2):
        done = subprocess.run([sys.executable, "-m", "vibevoice_onnx.cli", "speak", "--model", str(tiny_checkpoints["realtime"]),
                               "Hello.", "--voice", str(tiny_preset),
                               "--max-frames", "3", "-o", str(tmp_path / f"run{run}.wav")],
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        said.append(done.stderr)
    assert "the int8 bundle failed its gates (lower_lm: against the teacher's graph" in said[0], said[0]
    assert ", so fp32 is used (--precision int8 --force would run it anyway)" in said[0]
    assert "failed its gates" not in said[1] and "first use" not in said[1]
    bundles = {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "home").glob("bundles/*/realtime/*/manifest.json")}
    assert sorted(bundles) == ["cpu_fp32", "cpu_int8"] and not bundles["cpu_int8"]["parity"]["passed"]


def test_the_teacher_gates_hold_teacher_and_student_one_phase_at_a_time(written, tmp_path, monkeypatch):
    """Never both whole: at no moment are more graphs open than one bundle has (7), the teacher's decoder never
    beside its LMs (its loops' audio is decoded after them), so the gates' memory is one bundle's, not two."""
    from helpers import open_sessions

    from vibevoice_onnx.verify.judge import verify_bundle

    bundle = shutil.copytree(written / "cpu_int8", tmp_path / "cpu_int8")
    moments = open_sessions(monkeypatch)
    assert verify_bundle(bundle, teacher=written / "cpu_fp32", log=lambda line: None)["passed"]
    assert moments and max(len(m) for m in moments) <= 7, max(moments, key=len)
    assert not any(("fp32", "acoustic_decoder_stream") in m and ("fp32", "upper_lm") in m for m in moments)
