"""Gates without torch for the 1.5B, Large, ASR, ASR-Streaming and ASR-BitNet kinds: an int8 bundle written from a tiny
checkpoint judged against the fp32 graphs written from the same checkpoint (its teacher) gives the verdict
PyTorch gives, the teacher-forced loops' numbers within a hair of PyTorch's (new reference == old reference),
a graph 5% loud is refused by its own gate, and teacher and student are never both open. (The realtime kind's
teacher gates are held the same way in tests/test_writer.py.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import torch_blocked_environment
from vibevoice_onnx.export.build import build_bundle
from vibevoice_onnx.verify.judge import TEACHER_REFERENCE, verify_bundle

KINDS = ("1.5b", "large", "asr", "asr-streaming", "asr-bitnet")
# The gates of a kind's loops (not its per-graph ones, which are named after what they compare against): judged
# against PyTorch and against the teacher, they must see the same numbers.
LOOP_GATES = {
    "1.5b": ("closed loop, forced segments, teacher-forced: conditions",
             "closed loop, forced segments, teacher-forced: sampled latents",
             "closed loop, forced segments, teacher-forced: audio",
             "closed loop, free-running, teacher-forced: conditions"),
    "asr": ("closed loop, teacher-forced: per-step logits",),
    "asr-streaming": ("streaming loop, teacher-forced: per-pick logits",),
}
LOOP_GATES["large"], LOOP_GATES["asr-bitnet"] = LOOP_GATES["1.5b"], LOOP_GATES["asr"]


@pytest.fixture(scope="module")
def bundles(tiny_checkpoints, tmp_path_factory) -> dict[str, Path]:
    """Each kind's fp32 and int8 bundles, their graphs written (as without torch): KIND -> ROOT/KIND (checkpoint,
    onnx/KIND/cpu_{fp32,int8})."""
    from vibevoice_onnx.checkpoints.synthetic import make_checkpoint

    made = {}
    for kind in KINDS:
        root = tmp_path_factory.mktemp(kind)
        checkpoint = tiny_checkpoints.get(kind)
        if checkpoint is None:
            checkpoint = root / "checkpoint"
            make_checkpoint(kind, checkpoint, size="tiny", seed=0)
        for precision in ("fp32", "int8"):
            build_bundle(checkpoint, root / "onnx", precision, write=True)
        made[kind] = (checkpoint, root / "onnx" / kind)
    return made


def test_every_kinds_gates_run_without_torch(tmp_path):
    """Each gates module imports in the base install (torch and transformers blocked) and has its teacher gates."""
    probe = ("from vibevoice_onnx.families import FAMILIES, load; "
             "print(sorted({f.gates for f in FAMILIES if f.writer and not hasattr(load(f.gates), 'run_teacher_gates')}))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=torch_blocked_environment(tmp_path), timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_an_int8_bundle_judged_by_its_fp32_graphs_gets_pytorchs_verdict(bundles, kind, tmp_path):
    checkpoint, bundle = bundles[kind]
    by_teacher = verify_bundle(shutil.copytree(bundle / "cpu_int8", tmp_path / "teacher"), teacher=bundle / "cpu_fp32",
                               log=lambda line: None)
    by_torch = verify_bundle(shutil.copytree(bundle / "cpu_int8", tmp_path / "torch"), checkpoint, log=lambda line: None)
    assert by_teacher["passed"] and by_torch["passed"]
    assert by_teacher["reference"] == TEACHER_REFERENCE
    assert by_teacher["teacher"]["graphs"] == "vibevoice-onnx writer"
    ours, theirs = ({g["name"]: g for g in record["gates"]} for record in (by_teacher, by_torch))
    for name in LOOP_GATES[kind]:
        assert ours[name]["cosine"] == pytest.approx(theirs[name]["cosine"], abs=2e-3), name
        assert ours[name]["gain"] == pytest.approx(theirs[name]["gain"], abs=2e-3), name
    assert [g for g in ours if "against the teacher's graph" in g], "no graph was held to the teacher's"


@pytest.mark.parametrize("kind", ["1.5b", "asr", "asr-streaming"])  # Large's graphs are the 1.5B's
def test_the_teacher_refuses_an_lm_five_percent_loud(bundles, kind, tmp_path):
    """A gain in the LM's hidden states (every cosine stays at 1) is refused by the LM's own gate."""
    from vibevoice_onnx.verify.calibration import scaled_output

    _, bundle = bundles[kind]
    loud = shutil.copytree(bundle / "cpu_int8", tmp_path / "cpu_int8")
    scaled_output(loud / "lm.onnx", "hidden_states", 1.05)
    record = verify_bundle(loud, teacher=bundle / "cpu_fp32", log=lambda line: None)
    gate = {g["name"]: g for g in record["gates"]}["lm (9-token prefill, 3 steps): against the teacher's graph"]
    assert not record["passed"] and not gate["passed"]
    assert gate["gain"] == pytest.approx(1.05, abs=0.01), gate


@pytest.mark.parametrize("kind", ["1.5b", "asr-streaming"])
def test_teacher_and_student_are_never_both_open(bundles, kind, tmp_path, monkeypatch):
    """At no moment does an fp32 session live beside an int8 one: each phase closes its bundle (its sessions
    freed, however the gates still refer to them) before the other opens."""
    from helpers import open_sessions

    _, bundle = bundles[kind]
    moments = open_sessions(monkeypatch)
    student = shutil.copytree(bundle / "cpu_int8", tmp_path / "cpu_int8")
    assert verify_bundle(student, teacher=bundle / "cpu_fp32", log=lambda line: None)["passed"]
    assert moments and not [m for m in moments if len({precision for precision, _ in m}) > 1]


def test_a_teacher_that_does_not_fit_in_memory_is_one_sentence_before_anything_runs(bundles, tmp_path, monkeypatch):
    """Without torch the teacher's fp32 graphs are resident phase by phase: where the machine has less memory
    available than they need (with room for what runs beside them), `verify` says so and records nothing, and a
    first use says so before it builds anything; with enough, the same bundle is judged."""
    import vibevoice_onnx.verify.judge as judge
    from vibevoice_onnx.errors import VibeVoiceError
    from vibevoice_onnx.hub import cache
    from vibevoice_onnx.runtime.bundle import Bundle

    checkpoint, bundle = bundles["asr"]
    fp32 = Bundle(bundle / "cpu_fp32")
    weights = sum(fp32.weight_bytes(name) for name in fp32.info.graphs)
    student = shutil.copytree(bundle / "cpu_int8", tmp_path / "cpu_int8")
    monkeypatch.setattr(judge, "available_memory", lambda: int(weights * 1.1))
    with pytest.raises(VibeVoiceError, match="without PyTorch holds its fp32 teacher in memory"):
        verify_bundle(student, teacher=fp32.path, log=lambda line: None)
    assert Bundle(student).info.parity is None
    monkeypatch.setenv("VIBEVOICE_ONNX_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(cache, "torch_installed", lambda: False)
    source = cache.Source("local--test", {"path": str(checkpoint)})
    with pytest.raises(VibeVoiceError, match="pip install 'vibevoice-onnx\\[export\\]'"):
        cache.build_and_verify(checkpoint, source, "int8", "cpu", None, log=lambda line: None)
    assert not (tmp_path / "home").exists()
    monkeypatch.setattr(judge, "available_memory", lambda: int(weights * 1.3))
    assert verify_bundle(student, teacher=fp32.path, log=lambda line: None)["passed"]
