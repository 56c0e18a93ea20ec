"""`verify`: the gates pass on a faithful bundle, fail on a broken one, and agree on EOS."""

import json

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from vibevoice_onnx.cli import main
from vibevoice_onnx.export.graphs import export_graph
from vibevoice_onnx.export.realtime import graph_specs as realtime_graph_specs
from vibevoice_onnx.reference.realtime import generate
from vibevoice_onnx.reference.presets import as_voice_prompt, prompt_from_text
from vibevoice_onnx.runtime.bundle import Bundle
from vibevoice_onnx.runtime.realtime import OnnxRealtimeBackend
from vibevoice_onnx.sampling import NoiseSource
from vibevoice_onnx.text import encode_tts_text
from vibevoice_onnx.verify.common import LIMITS, verify_bundle
from vibevoice_onnx.verify.realtime import CLOSED_LOOP_TEXT, closed_loop

from conftest import copy_bundle
from helpers import GAINED_GATES, gained_copy


@pytest.fixture(scope="module")
def verified(tiny_bundle, tmp_path_factory):
    bundle = copy_bundle(tiny_bundle, tmp_path_factory.mktemp("verified") / "cpu_fp32")
    return bundle, verify_bundle(bundle)


def test_all_gates_pass_and_are_recorded_in_the_manifest(verified):
    bundle, record = verified
    assert record["passed"], [g for g in record["gates"] if not g["passed"]]
    names = [g["name"] for g in record["gates"]]
    for graph in ("lower_lm", "upper_lm", "diffusion_head", "acoustic_connector", "eos_classifier", "acoustic_decoder (6 frames, one call", "acoustic_decoder_stream"):
        assert any(n.startswith(graph) for n in names), graph
    assert any("prefill 3 + 5 steps" in n for n in names) and any("streamed frames == whole" in n for n in names)
    bound = next(g for g in record["gates"] if g["name"].startswith("bound loop"))
    assert bound["passed"] and bound["max_abs"] == 0.0 and "bitwise (CPU)" in bound["detail"]
    loop = [g for g in record["gates"] if g["name"].startswith("closed loop")]
    assert {g["name"] for g in loop} == {  # every precision: the free run judged by the loop's own spread
        "closed loop: latent divergence within the loop's own spread", "closed loop: latent scale (|log RMS ratio|) within the loop's own spread", "closed loop: audio divergence within the loop's own spread", "closed loop: per-frame EOS decisions agree where the loop's own spread keeps them", "closed loop, teacher-forced: conditions",
        "closed loop, teacher-forced: sampled latents", "closed loop, teacher-forced: audio",
        "closed loop, teacher-forced: sampled latent RMS ratio in [0.999, 1.001]",
        "closed loop, teacher-forced: per-frame EOS decisions agree"}
    calibration = record["closed_loop"]["calibration"]
    assert len(calibration["divergence"]) == len(calibration["spread"]) == record["closed_loop"]["frames"] >= 12
    assert calibration["seeds"] and max(calibration["one_step_error"]["latent_relative"]) < 1e-4  # fp32: float rounding
    assert record["closed_loop"]["voice"] == "(computed by the reference)"
    assert all(g["cosine"] is None or g["cosine"] >= 0.99 for g in record["gates"])
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["parity"] == record


def test_an_fp32_bundle_with_a_graph_one_percent_loud_is_refused_by_that_graphs_gate(tiny_bundle, tmp_path):
    """The decoder's audio, the head's velocity, the connector's embeddings and the upper LM's hidden states, each
    1% too large: every cosine stays at 1, and each graph's own gate refuses it by its gain (fp32: at most 1e-3)."""
    record = verify_bundle(gained_copy(tiny_bundle, tmp_path / "cpu_fp32", 1.01), log=lambda line: None)
    gates = {g["name"]: g for g in record["gates"]}
    assert not record["passed"]
    for gate in GAINED_GATES.values():
        assert not gates[gate]["passed"] and gates[gate]["gain"] == pytest.approx(1.01, abs=2e-4), gates[gate]
        assert gates[gate]["cosine"] > 0.99999, gates[gate]  # what a cosine-only gate saw: nothing wrong


def test_a_broken_graph_fails_its_gate_and_the_loop(tiny_bundle, tmp_path, capsys):
    bundle = copy_bundle(tiny_bundle, tmp_path / "broken")
    path = bundle / "diffusion_head_step.onnx"
    model = onnx.load(str(path))
    largest = max(model.graph.initializer, key=lambda t: np.prod(t.dims))
    largest.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(largest), largest.name))
    onnx.save(model, str(path))
    assert main(["verify", str(bundle)]) == 1
    out = capsys.readouterr().out
    assert "SOME GATES FAILED" in out
    failed = {line.split("  ")[0] for line in out.splitlines() if line.rstrip().endswith("FAIL")}
    assert "diffusion_head" in failed and "closed loop, teacher-forced: sampled latents" in failed
    assert not any(name.startswith(("lower_lm", "upper_lm", "acoustic_decoder")) for name in failed)


def test_verify_refuses_a_different_checkpoint(tiny_bundle, tiny_checkpoints, capsys):
    assert main(["verify", str(tiny_bundle), "--checkpoint", str(tiny_checkpoints["1.5b"])]) == 2
    assert "is not the checkpoint this bundle was built from" in capsys.readouterr().err


@torch.no_grad()
def test_closed_loop_agrees_on_an_eos_that_fires_mid_run(tiny_bundle, realtime_reference, tmp_path):
    """Shift the EOS bias so the reference fires EOS at a chosen frame; the runtime must stop there too."""
    model = realtime_reference
    bundle = Bundle(tiny_bundle)
    tokenizer = bundle.tokenizer
    prompt = as_voice_prompt(prompt_from_text(model, tokenizer, "A voice.\n"))
    ids = encode_tts_text(tokenizer, CLOSED_LOOP_TEXT)
    probe = generate(model, prompt, ids, NoiseSource.from_seed(1234), max_frames=25)
    logits = np.array(probe.eos_logits)
    target = 8 + int(np.argmax(logits[8:20]))  # the highest logit after frame 8 fires first once shifted
    margin = (logits[target] - logits[:target].max()) / 2
    assert margin > 0
    original = model.eos_classifier.fc2.bias.clone()
    try:
        model.eos_classifier.fc2.bias -= float(logits[target]) - margin
        edited = copy_bundle(tiny_bundle, tmp_path / "eos")
        eos_spec = next(s for s in realtime_graph_specs(model) if s.name == "eos_classifier")
        export_graph(eos_spec, edited, log=lambda m: None)
        gates, info = closed_loop(model, OnnxRealtimeBackend(Bundle(edited)), prompt, ids, LIMITS["fp32"], seed=1234,
                                  frames=30)
    finally:
        model.eos_classifier.fc2.bias.copy_(original)
    assert all(g.passed for g in gates), gates
    assert info["frames"] == 30 and info["eos_frame_reference"] == info["eos_frame_runtime"] == target
    eos = next(g for g in gates if g.name == "closed loop, teacher-forced: per-frame EOS decisions agree")
    assert f"first fire after frame {target} (runtime) / {target} (reference)" in eos.detail


def test_verify_judges_a_checkpoint_whose_eos_fires_at_once(eos_early_rebuild, capsys):
    """A random checkpoint that would stop after its first frame is still verified over the whole loop."""
    checkpoint, bundle = eos_early_rebuild
    assert main(["verify", str(bundle), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["passed"] and record["closed_loop"]["eos_frame_reference"] == 0
    assert record["closed_loop"]["eos_frame_runtime"] == 0 and record["closed_loop"]["frames"] == 18
    loop = {g["name"]: g for g in record["gates"] if g["name"].startswith("closed loop")}
    assert loop["closed loop: latent divergence within the loop's own spread"]["cosine"] >= 0.99
    assert "17 of 17 kept by every perturbed run" in loop["closed loop: per-frame EOS decisions agree where the loop's own spread keeps them"]["detail"]


def test_verify_runs_the_loop_from_an_imported_voice(tiny_bundle, tmp_path, capsys):
    bundle = copy_bundle(tiny_bundle, tmp_path / "bundle")
    assert main(["verify", str(bundle), "--voice", "synthetic", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["passed"] and record["closed_loop"]["voice"] == "synthetic"
