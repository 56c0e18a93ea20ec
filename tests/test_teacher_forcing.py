"""Teacher-forced closed loops, and the free run judged against the loop's own chaos (verify.calibration).

Forcing must feed the teacher's latents back (not the runtime's own) and equal free running where nothing
differs (fp32). A quantized bundle is judged on its own error: on a checkpoint whose loop amplifies errors
twice a frame and whose EOS logits hover around zero, int8 verifies; a broken quantization, an EOS classifier
off by a bias and a loop that leaves the reference at once are caught; the same bundle gets the same verdict."""

import json

import numpy as np
import pytest
import torch

from vibevoice_onnx.cli import main
from vibevoice_onnx.generation.common import Teacher
from vibevoice_onnx.generation.realtime import GenerationResult, realtime_frames
from vibevoice_onnx.reference.realtime import generate
from vibevoice_onnx.runtime.bundle import Bundle
from vibevoice_onnx.runtime.realtime import OnnxRealtimeBackend
from vibevoice_onnx.sampling import NoiseSource
from vibevoice_onnx.text import encode_tts_text
from vibevoice_onnx.verify.calibration import high_gain_copy
from vibevoice_onnx.verify.realtime import CLOSED_LOOP_FRAMES, CLOSED_LOOP_TEXT, eos_hovering_copy, reference_prompt

FRAMES = 12  # two speech windows


@pytest.fixture(scope="module")
def loop_inputs(tiny_bundle, realtime_reference):
    bundle = Bundle(tiny_bundle)
    prompt = reference_prompt(realtime_reference, bundle.tokenizer)
    return OnnxRealtimeBackend(bundle), prompt, encode_tts_text(bundle.tokenizer, CLOSED_LOOP_TEXT)


def reference_run(model, prompt, ids, seed):
    with torch.no_grad():
        return generate(model, prompt, ids, NoiseSource.from_seed(seed), max_frames=FRAMES, stop_on_eos=False,
                        result=GenerationResult(conditions=[]))


def runtime_run(runtime, prompt, ids, seed, teacher=None):
    result = GenerationResult(conditions=[])
    for _ in realtime_frames(runtime, prompt, ids, NoiseSource.from_seed(seed), 1.5, 5, FRAMES, result,
                             stop_on_eos=False, steering=teacher):
        pass
    return result


def test_fp32_teacher_forcing_equals_free_running(loop_inputs, realtime_reference):
    runtime, prompt, ids = loop_inputs
    reference = reference_run(realtime_reference, prompt, ids, 1234)
    free = runtime_run(runtime, prompt, ids, 1234)
    forced = runtime_run(runtime, prompt, ids, 1234, Teacher(reference.latents))
    assert forced.frames == len(forced.sampled) == len(forced.conditions) == FRAMES
    assert all(np.array_equal(a, b) for a, b in zip(forced.latents, reference.latents))  # what was fed back
    np.testing.assert_allclose(np.stack(forced.sampled[:6]), np.stack(free.latents[:6]), atol=1e-4)
    np.testing.assert_allclose(np.stack(forced.conditions), np.stack(free.conditions), atol=1e-4)
    np.testing.assert_allclose(forced.eos_logits, free.eos_logits, atol=1e-4)
    np.testing.assert_allclose(forced.audio, free.audio, atol=1e-4)


def test_teacher_forcing_follows_the_teacher_not_its_own_samples(loop_inputs, realtime_reference):
    """Forced along another seed's trajectory, the conditions, EOS logits and audio are that trajectory's;
    only the latents sampled from them (with this run's noise) are the runtime's own."""
    runtime, prompt, ids = loop_inputs
    other, own_seed = reference_run(realtime_reference, prompt, ids, 99), reference_run(realtime_reference, prompt, ids, 1234)
    forced = runtime_run(runtime, prompt, ids, 1234, Teacher(other.latents))
    np.testing.assert_allclose(np.stack(forced.conditions), np.stack(other.conditions), atol=1e-4)
    np.testing.assert_allclose(forced.eos_logits, other.eos_logits, atol=1e-4)
    np.testing.assert_allclose(forced.audio, other.audio, atol=1e-4)
    assert not np.allclose(np.stack(forced.conditions[1:]), np.stack(own_seed.conditions[1:]), atol=1e-2)
    # Frame 0's conditions come from the prompt alone, so its sample is the seed-1234 one; later ones differ.
    np.testing.assert_allclose(forced.sampled[0], own_seed.latents[0], atol=1e-4)


def test_a_teachers_length_is_the_runs_length(loop_inputs, realtime_reference):
    runtime, prompt, ids = loop_inputs
    reference = reference_run(realtime_reference, prompt, ids, 1234)
    forced = runtime_run(runtime, prompt, ids, 1234, Teacher(reference.latents[:4]))
    assert forced.frames == len(forced.sampled) == 4 and forced.stop_reason == "max_frames"


@pytest.fixture(scope="module")
def hovering(tiny_checkpoints, tmp_path_factory):
    """The tiny checkpoint with a high loop gain (verify.calibration.high_gain_copy: ~2x a frame, where the
    plain one's is ~1.1) and its closed-loop EOS logits centred on zero (spread 0.3), in fp32 and int8."""
    root = tmp_path_factory.mktemp("eos-hovering")
    checkpoint = root / "checkpoint"
    high_gain = high_gain_copy(tiny_checkpoints["realtime"], root / "high-gain")
    logits = eos_hovering_copy(high_gain, checkpoint, spread=0.3)
    for precision in ("fp32", "int8"):
        assert main(["build", str(checkpoint), "-o", str(root / "onnx"), "--precision", precision,
                     "--graphs", "written"]) == 0
    return logits, root / "onnx" / "realtime"


def test_eos_hovering_copy_centres_the_closed_loop_logits(hovering):
    logits, _ = hovering
    assert len(logits) == CLOSED_LOOP_FRAMES - 1
    assert abs(logits.mean()) < 0.05 and logits.std() == pytest.approx(0.3, rel=0.05)
    assert (np.abs(logits) < 0.25).sum() >= 3 and (logits > 0).any() and (logits < 0).any()  # both sides of zero


def test_int8_of_a_checkpoint_with_hovering_eos_passes(hovering, capsys):
    _, bundles = hovering
    for precision in ("fp32", "int8"):
        assert main(["verify", str(bundles / f"cpu_{precision}"), "--json"]) == 0, precision
        record = json.loads(capsys.readouterr().out)
        gates = {g["name"]: g for g in record["gates"]}
        forced = gates["closed loop, teacher-forced: per-frame EOS decisions agree"]
        floor = record["thresholds"]["decision_floor"]
        assert forced["passed"] and f"frames clear of the ±{floor} noise floor" in forced["detail"]
        logits = record["closed_loop"]["eos_logits"]
        assert len(logits["reference"]) == len(logits["teacher_forced"]) == CLOSED_LOOP_FRAMES - 1 and record["passed"]
    assert record["precision"] == "int8" and record["thresholds"]["forced_latent"]["min_cosine"] == 0.97
    assert "perturbed by the bundle's own one-step error" in record["loops"]["free_running"]
    assert "every frame" in record["loops"]["teacher_forced"]
    assert gates["closed loop: per-frame EOS decisions agree where the loop's own spread keeps them"]["passed"]
    calibration = record["closed_loop"]["calibration"]  # the free run, judged by the loop's own spread
    assert calibration["amplification_per_frame"] > 1.5 and calibration["worst_ratio"] <= calibration["margin"]
    assert min(record["closed_loop"]["teacher_forced"]["latent_cosine"]) >= 0.97


def test_int8_eos_decisions_are_judged_on_every_forced_frame(hovering, tmp_path, capsys):
    """An EOS classifier off by 0.8 flips the decisions it should: the teacher-forced gate names frames after
    the first window, which the free-running gate (its first window only) does not judge."""
    import onnx
    from onnx import numpy_helper

    from conftest import copy_bundle

    _, bundles = hovering
    bundle = copy_bundle(bundles / "cpu_int8", tmp_path / "eos-off")
    path = bundle / "eos_classifier.onnx"
    model = onnx.load(str(path))
    bias = next(t for t in model.graph.initializer if tuple(t.dims) == (1,))
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + np.float32(0.8), bias.name))
    onnx.save(model, str(path))
    assert main(["verify", str(bundle), "--json"]) == 1
    gates = {g["name"]: g for g in json.loads(capsys.readouterr().out)["gates"]}
    forced = gates["closed loop, teacher-forced: per-frame EOS decisions agree"]
    assert not forced["passed"]
    flipped = [int(f) for f in forced["detail"].split("(frames ")[1].split(")")[0].split(", ")]
    assert max(flipped) >= 6


def test_int8_with_a_wrong_quantization_scale_fails_on_the_same_checkpoint(hovering, tmp_path, capsys):
    """One MatMul of the diffusion head with its quantization scales 1.5x too large: one step costs more than
    int8 may (teacher-forced sampled latents), whatever the loop then does."""
    from vibevoice_onnx.verify.calibration import wrong_scale

    from conftest import copy_bundle

    _, bundles = hovering
    bundle = copy_bundle(bundles / "cpu_int8", tmp_path / "wrong-scale")
    wrong_scale(bundle / "diffusion_head_step.onnx", 1.5)
    assert main(["verify", str(bundle), "--json"]) == 1
    failed = {g["name"] for g in json.loads(capsys.readouterr().out)["gates"] if not g["passed"]}
    assert "closed loop, teacher-forced: sampled latents" in failed and "diffusion_head" in failed


def loop_runs(bundle_dir, checkpoint) -> tuple[dict, dict, tuple]:
    """verify's closed loop of one bundle: its record, the runs it judged, and (runtime, prompt, text ids)."""
    from vibevoice_onnx.reference.loading import load_realtime
    from vibevoice_onnx.verify.common import LIMITS
    from vibevoice_onnx.verify.realtime import closed_loop

    model, bundle = load_realtime(checkpoint), Bundle(bundle_dir)
    inputs = (OnnxRealtimeBackend(bundle), reference_prompt(model, bundle.tokenizer),
              encode_tts_text(bundle.tokenizer, CLOSED_LOOP_TEXT))
    runs: dict = {}
    _, info = closed_loop(model, *inputs, LIMITS["int8"], runs=runs)
    return info, runs, inputs


def test_the_calibration_is_reproducible_and_a_loop_that_leaves_at_once_fails_it(hovering):
    """The same bundle twice: the same perturbed runs, spread and verdict. Then a runtime whose feedback is
    wrong from the second frame on (the latent it feeds back negated: a step teacher forcing does not run)
    is judged by that spread: its free run is far outside it."""
    from vibevoice_onnx.generation.common import Steering
    from vibevoice_onnx.verify.calibration import EOS, calibrated_gates
    from vibevoice_onnx.verify.realtime import CFG_SCALE, SEED, STEPS

    _, bundles = hovering
    checkpoint = bundles.parents[1] / "checkpoint"
    first, runs, (runtime, prompt, ids) = loop_runs(bundles / "cpu_int8", checkpoint)
    second, _, _ = loop_runs(bundles / "cpu_int8", checkpoint)
    assert first["calibration"] == second["calibration"] and first["calibration"]["verdict"].startswith("passes")

    class NegatedFeedback(Steering):
        def latent(self, own, result):
            return -own if result.frames else own

    diverged = GenerationResult()
    noise = NoiseSource.from_seed(SEED, runtime.bundle.dims.head.latent)
    for _ in realtime_frames(runtime, prompt, ids, noise, CFG_SCALE, STEPS, CLOSED_LOOP_FRAMES, diverged,
                             stop_on_eos=False, steering=NegatedFeedback()):
        pass
    gates, info = calibrated_gates("closed loop", diverged, runs["reference"], runs["perturbed"], runs["error"], EOS, "")
    latent = next(g for g in gates if "latent divergence" in g.name)
    assert not latent.passed and info["verdict"].startswith("fails") and info["worst_ratio"] > 3


@pytest.mark.parametrize("path", ["latent", "features"])
def test_a_perturbation_carries_the_measured_error_sign_and_all(path):
    """What a perturbed reference run feeds back is off by exactly the bundle's one-step error at that frame:
    its relative size and its signed scale part (the latent, and the 1.5B's semantic features of the decoded
    audio); features are left alone where none were measured (realtime)."""
    from vibevoice_onnx.verify.calibration import Perturbation, StepError, signed_log_rms_ratio
    from vibevoice_onnx.verify.common import relative_error

    error, scale = [0.01, 0.05, 0.2], [0.0, -0.03, 0.15]
    measured = StepError(error, [0.0], scale) if path == "latent" else StepError([0.0], [0.0], (), error, scale)
    perturbation, result = Perturbation(measured, seed=5), GenerationResult()
    own = np.random.default_rng(0).standard_normal((1, 1, 128)).astype(np.float32)
    for frame in range(3):
        if path == "latent":
            off = perturbation.latent(own, result)
            result.latents.append(off)
        else:
            result.latents.append(own)  # a latent's features come after it: frame = latents made - 1
            off = perturbation.features(own, result)
        random_part = 3 * error[frame] / np.sqrt(own.size) + error[frame] ** 2 / 2  # moves the norm a little
        assert relative_error(off, own) == pytest.approx(error[frame], abs=random_part)
        assert signed_log_rms_ratio(off, own) == pytest.approx(scale[frame], abs=random_part)
    assert Perturbation(StepError([0.1], [0.1]), seed=5).features(own, result) is own
