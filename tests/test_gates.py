"""Every threshold of verify pinned by a defect just past it (which must fail) and one just inside (which must pass),
for each precision: a gain, noise of a given cosine or relative size, a latent's scale, a flipped decision, a free
run a little farther than its spread allows. The defects are numbers written here, not read from the limits, so
loosening a limit (int8's conditions from 0.995 to 0.9, say) or tightening one past what its precision does
makes a test here fail. End to end, tests/test_verify.py and tests/test_precision.py verify bundles with a gain
put into a graph on purpose."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from vibevoice_onnx.verify import calibration
from vibevoice_onnx.verify.common import BATCHED, LIMITS, SAME_ARITHMETIC, compare, exact_on_cpu, forced_gates
from vibevoice_onnx.verify.realtime import eos_agreement

RNG = np.random.default_rng(7)


def off(reference: np.ndarray, gain: float = 1.0, cosine: float = 1.0, relative: float | None = None) -> np.ndarray:
    """`reference` times `gain`, plus noise at right angles to it, sized for exactly `cosine` (or, given
    `relative`, for ||noise|| = relative * ||reference||): so the gain measured is `gain`, whatever the noise."""
    noise = RNG.standard_normal(reference.shape)
    noise -= (noise.ravel() @ reference.ravel()) / (reference.ravel() @ reference.ravel()) * reference
    size = relative * np.linalg.norm(reference) if relative is not None else \
        np.sqrt(1 / cosine**2 - 1) * gain * np.linalg.norm(reference)
    return (gain * reference + noise * size / np.linalg.norm(noise)).astype(np.float32)


# (what, the defect's measure, the value just inside, the value just past), per precision and tolerance
SIZES = {
    "fp32": {"gain": (1.0005, 1.002), "relative": (5e-4, 2e-3)},
    "int8": {"gain": (1.015, 1.025), "cosine": (0.996, 0.994)},
    "int4": {"gain": (1.08, 1.12), "cosine": (0.985, 0.975)},
    "fp16": {"gain": (1.008, 1.012), "cosine": (0.996, 0.994)},
}
PINS = {  # tolerance of Limits -> precision -> {measure: (inside, past)}
    "graph": SIZES,
    "same_path": {"fp32": {"gain": (1.00005, 1.0002), "relative": (5e-5, 2e-4)},
                  "int8": {"gain": (1.015, 1.025), "cosine": (0.9985, 0.9975)},
                  "int4": {"gain": (1.015, 1.025), "cosine": (0.9985, 0.9975)},
                  "fp16": {"gain": (1.008, 1.012), "cosine": (0.9992, 0.9988)}},
    "forced_condition": {**SIZES, "int4": {"gain": (1.04, 1.06), "cosine": (0.985, 0.975)}},
    "forced_latent": {"fp32": SIZES["fp32"], "int8": {"gain": (1.015, 1.025), "cosine": (0.975, 0.965)},
                      "int4": {"gain": (1.04, 1.06), "cosine": (0.91, 0.89)},
                      "fp16": {"gain": (1.008, 1.012), "cosine": (0.992, 0.988)}},
    "forced_audio": {"fp32": SIZES["fp32"], "int8": {"gain": (1.015, 1.025), "cosine": (0.992, 0.988)},
                     "int4": {"gain": (1.04, 1.06), "cosine": (0.985, 0.975)},
                     "fp16": {"gain": (1.008, 1.012), "cosine": (0.992, 0.988)}},
}
CASES = [(tolerance, precision, measure, value, inside) for tolerance, by_precision in PINS.items()
         for precision, measures in by_precision.items() for measure, values in measures.items()
         for value, inside in zip(values, (True, False))]


@pytest.mark.parametrize("tolerance, precision, measure, value, inside", CASES)
def test_each_tolerance_refuses_a_defect_just_past_it_and_takes_one_just_inside(tolerance, precision, measure, value,
                                                                               inside):
    reference = RNG.standard_normal((2, 2048)).astype(np.float32)
    ours = off(reference, **{measure: value})
    gate = compare("gate", [ours], [reference], getattr(LIMITS[precision], tolerance))
    assert gate.passed == inside, (gate, getattr(LIMITS[precision], tolerance))
    if measure == "gain":
        assert gate.gain == pytest.approx(value, rel=1e-6) and gate.cosine == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("tolerance, measure, inside, past", [
    (BATCHED, "gain", 1.0005, 1.002), (BATCHED, "cosine", 0.999995, 0.99998),
    (SAME_ARITHMETIC, "relative", 5e-6, 2e-5), (SAME_ARITHMETIC, "gain", 1.000005, 1.00002)])
def test_the_tolerances_of_paths_that_must_agree(tolerance, measure, inside, past):
    reference = RNG.standard_normal(4096).astype(np.float32)
    assert compare("gate", [off(reference, **{measure: inside})], [reference], tolerance).passed
    assert not compare("gate", [off(reference, **{measure: past})], [reference], tolerance).passed


def test_paths_of_the_same_kernels_agree_bit_for_bit_on_the_cpu():
    reference = RNG.standard_normal(4096).astype(np.float32)
    one_ulp = reference.copy()
    one_ulp[17] = np.nextafter(one_ulp[17], np.float32(np.inf))
    assert exact_on_cpu(compare("same", [reference.copy()], [reference], SAME_ARITHMETIC), "cpu").passed
    assert not exact_on_cpu(compare("same", [one_ulp], [reference], SAME_ARITHMETIC), "cpu").passed
    assert exact_on_cpu(compare("same", [one_ulp], [reference], SAME_ARITHMETIC), "cuda").passed  # rounding, off the CPU


# ---- the teacher-forced gates, on a made-up reference trajectory ----

FRAMES = 6


def trajectory() -> SimpleNamespace:
    """What a reference run records: conditions (positive and negative rows), latents, and decoded audio."""
    return SimpleNamespace(frames=FRAMES, conditions=[[RNG.standard_normal(64), RNG.standard_normal(64)]
                                                      for _ in range(FRAMES)],
                           latents=[RNG.standard_normal(64) for _ in range(FRAMES)],
                           audio=RNG.standard_normal(FRAMES * 320).astype(np.float32))


def forced_run(theirs, conditions: dict = {}, latents: dict = {}, audio: dict = {}, scale: float = 1.0):  # noqa: B006
    """The bundle along the reference's trajectory, each measure off as given (latents' RMS also times `scale`,
    at the middle frame only: a per-frame scale error, not a bias)."""
    sampled = [off(z, **latents) for z in theirs.latents]
    sampled[FRAMES // 2] = sampled[FRAMES // 2] * scale
    return SimpleNamespace(frames=FRAMES, conditions=[[off(row, **conditions) for row in rows] for rows in theirs.conditions],
                           sampled=sampled, audio=off(theirs.audio, **audio))


GATE_OF = {"forced_condition": ("conditions", 0), "forced_latent": ("latents", 1), "forced_audio": ("audio", 3)}


@pytest.mark.parametrize("tolerance, precision, measure, value, inside",
                         [case for case in CASES if case[0] in GATE_OF])
def test_the_teacher_forced_gates_judge_every_frame_by_their_limits(tolerance, precision, measure, value, inside):
    theirs = trajectory()
    argument, index = GATE_OF[tolerance]
    gates, _ = forced_gates("loop", forced_run(theirs, **{argument: {measure: value}}), theirs, "", LIMITS[precision])
    assert gates[index].passed == inside, gates[index]
    assert all(gate.passed for k, gate in enumerate(gates) if k not in (index, 2)), gates  # the others: untouched
    # (a latent defect moves the RMS ratio gate too, judged below on its own)


@pytest.mark.parametrize("precision, inside, past", [("fp32", 1.0005, 1.002), ("int8", 1.06, 1.08), ("int8", 0.94, 0.92),
                                                     ("int4", 1.2, 1.3), ("fp16", 1.04, 1.06)])
def test_one_latent_off_in_scale_is_refused_past_the_precisions_ratio(precision, inside, past):
    theirs = trajectory()
    for scale, expected in ((inside, True), (past, False)):
        gates, _ = forced_gates("loop", forced_run(theirs, scale=scale), theirs, "", LIMITS[precision])
        assert gates[2].passed == expected, (scale, gates[2])


@pytest.mark.parametrize("precision, inside, past", [("fp32", 0.005, 0.02), ("int8", 0.2, 0.3), ("int4", 0.4, 0.6),
                                                     ("fp16", 0.04, 0.06)])
def test_an_eos_decision_may_flip_only_below_the_precisions_floor(precision, inside, past):
    floor = LIMITS[precision].decision_floor
    for logit, expected in ((inside, True), (past, False)):
        reference = SimpleNamespace(eos_logits=[-3.0, logit, -2.0], eos_frame=None)
        flipped = SimpleNamespace(eos_logits=[-3.0, -logit, -2.0], eos_frame=None)
        gate, _ = eos_agreement("loop", flipped, reference, floor)
        assert gate.passed == expected, (precision, logit, gate)


# ---- the free run against its own spread ----

def free_run(reference, sizes: list[float], rng) -> SimpleNamespace:
    """A run whose latent t is the reference's moved by sizes[t] of its norm, its RMS kept (a divergence, no
    scale error), with its decoded audio the latents themselves."""
    latents = []
    for z, size in zip(reference.latents, sizes):
        moved = z + rng.standard_normal(z.shape) * size * np.linalg.norm(z) / np.sqrt(z.size)
        latents.append((moved * np.linalg.norm(z) / np.linalg.norm(moved)).astype(np.float32))
    return SimpleNamespace(latents=latents, frames=len(latents), chunks=latents, audio=np.concatenate(latents),
                           eos_logits=list(reference.eos_logits))


@pytest.mark.parametrize("multiple, passes", [(2.7, True), (3.3, False)])
def test_a_free_run_may_diverge_at_most_three_times_as_far_as_its_perturbed_references(multiple, passes):
    rng = np.random.default_rng(3)
    latents = [rng.standard_normal(4096).astype(np.float32) for _ in range(8)]
    reference = SimpleNamespace(latents=latents, frames=8, chunks=latents, audio=np.concatenate(latents),
                                eos_logits=[-4.0] * 8)
    sizes = [1e-3 * 1.2**t for t in range(8)]
    perturbed = [free_run(reference, sizes, rng) for _ in calibration.SEEDS]
    error = calibration.StepError([1e-3] * 8, [0.0] * 8, [0.0] * 8)
    ours = free_run(reference, [multiple * s for s in sizes], rng)
    gates, info = calibration.calibrated_gates("loop", ours, reference, perturbed, error, calibration.EOS, "")
    latent = next(g for g in gates if "latent divergence" in g.name)
    assert latent.passed == passes and info["worst_ratio"] == pytest.approx(multiple, rel=0.05), info
    assert next(g for g in gates if "audio divergence" in g.name).passed == passes


@pytest.mark.parametrize("decoder_error, passes", [(0.02, True), (0.02 / 3.3, False), (0.0, False)])
def test_a_free_runs_audio_may_carry_its_decoders_own_error_and_no_more(decoder_error, passes):
    """A bundle quantized off the feedback path (int8-decoder: the decoder alone) keeps its latents on the
    reference's path, and its audio is as far off as its decoder is on the reference's own latents (the teacher-
    forced run's audio): allowed up to MARGIN times that, beside the loop's own spread; audio further off than its
    decoder explains is refused."""
    rng = np.random.default_rng(6)
    latents = [rng.standard_normal(4096).astype(np.float32) for _ in range(8)]
    reference = SimpleNamespace(latents=latents, frames=8, chunks=latents, audio=np.concatenate(latents),
                                eos_logits=[-4.0] * 8)
    sizes = [1e-6] * 8
    perturbed = [free_run(reference, sizes, rng) for _ in calibration.SEEDS]
    ours = free_run(reference, sizes, rng)
    off = rng.standard_normal(ours.audio.shape)
    ours.audio = reference.audio + off * (0.05 * np.linalg.norm(reference.audio) / np.linalg.norm(off))
    error = calibration.StepError([1e-6] * 8, [0.0] * 8, [0.0] * 8, audio=decoder_error)
    gates, _ = calibration.calibrated_gates("loop", ours, reference, perturbed, error, calibration.EOS, "")
    assert next(g for g in gates if "latent divergence" in g.name).passed
    assert next(g for g in gates if "audio divergence" in g.name).passed == passes


def test_a_kept_decision_flipped_in_the_free_run_is_refused():
    rng = np.random.default_rng(4)
    latents = [rng.standard_normal(256).astype(np.float32) for _ in range(5)]
    reference = SimpleNamespace(latents=latents, frames=5, chunks=latents, audio=np.concatenate(latents),
                                eos_logits=[-2.0, -1.5, 1.0, -2.5, 2.0])
    perturbed = [free_run(reference, [1e-3] * 5, rng) for _ in calibration.SEEDS]
    for run in perturbed:  # each moved a little, none enough to flip anything
        run.eos_logits = [x + rng.normal(0, 0.05) for x in reference.eos_logits]
    error = calibration.StepError([1e-3] * 5, [0.05] * 5, [0.0] * 5)
    ours = free_run(reference, [1e-3] * 5, rng)
    gates, _ = calibration.calibrated_gates("loop", ours, reference, perturbed, error, calibration.EOS, "")
    assert all(g.passed for g in gates), gates
    ours.eos_logits = [-2.0, -1.5, -0.1, -2.5, 2.0]  # frame 2's EOS, which every perturbed run kept, flipped
    gates, info = calibration.calibrated_gates("loop", ours, reference, perturbed, error, calibration.EOS, "")
    decisions = next(g for g in gates if "decisions" in g.name)
    assert not decisions.passed and info["decisions"]["flipped"] == [2]


# ---- the measures themselves, where a gate's verdict rests on their edge cases ----

def test_the_measures_of_empty_silent_and_mismatched_outputs():
    from vibevoice_onnx.verify.common import cosine, gain, relative_error, worst_gain

    zeros, ones = np.zeros(8), np.ones(8)
    assert (gain(zeros, zeros), relative_error(zeros, zeros), cosine(zeros, zeros)) == (1.0, 0.0, 1.0)
    assert (gain(ones, zeros), relative_error(ones, zeros), cosine(ones, zeros)) == (float("inf"), float("inf"), 0.0)
    small = np.full(8, 1e-3)  # a reference of norm below 1 is measured as any other
    assert gain(small * 1.5, small) == pytest.approx(1.5) and relative_error(small * 1.5, small) == pytest.approx(0.5)
    big = RNG.standard_normal(1_000_000).astype(np.float32)  # summed in float64: float32 sums would be off by ~1e-7
    louder = (big * np.float32(1.001)).astype(np.float32)
    a, b = louder.astype(np.float64), big.astype(np.float64)
    assert abs(gain(louder, big) - float(a @ b / (b @ b))) < 1e-12
    assert abs(relative_error(louder, big) - float(np.linalg.norm(a - b) / np.linalg.norm(b))) < 1e-12
    assert worst_gain([0.99, 1 / 0.985, 1.005]) == pytest.approx(1 / 0.985) and worst_gain([1.0, float("inf")]) == float("inf")
    # the farthest from 1 as a ratio, whichever side: not the largest value, and a gain under 1 counts
    assert worst_gain([0.5, 1.2]) == 0.5 and worst_gain([0.97, 1.02]) == 0.97 and np.isnan(worst_gain([1.1, np.nan]))


def test_the_loops_measures_of_small_signals_empty_runs_and_eos_margins():
    """The free run's measures keep their size for signals far below 1 (a quiet segment of audio), name no
    divergence where no frame was judged, and orient each EOS logit by the reference's decision there."""
    small = np.full(16, 1e-3)
    assert calibration.relative_error(small * 1.5, small) == pytest.approx(0.5)
    assert calibration.signed_log_rms_ratio(small * 2, small) == pytest.approx(np.log(2))
    assert calibration.signed_log_rms_ratio(small, small * 4) == pytest.approx(-np.log(4))
    run = SimpleNamespace(eos_logits=[2.0, -3.0, 0.5], audio=np.ones(8), chunks=[np.ones(4), np.ones(4)])
    reference = SimpleNamespace(eos_logits=[1.0, -1.0, -0.1], audio=np.full(8, 2.0), chunks=[np.ones(4), np.ones(4)])
    assert calibration._eos_margins(run, reference) == [2.0, 3.0, -0.5]
    assert calibration._audio_divergence(run, reference, 0) == 0.0
    assert calibration._audio_divergence(run, reference, 1) == pytest.approx(0.5)
    gate, ratio, frame = calibration._within("loop", [], [], "latent divergence", "", [])
    assert (gate.passed, gate.max_abs, ratio, frame) == (True, 0.0, 0.0, 0)
    gate, ratio, frame = calibration._within("loop", [0.1, 0.9, 0.2], [0.1, 0.1, 0.1], "latent divergence", "",
                                             [1e-6] * 3)
    assert (gate.passed, gate.max_abs, frame) == (False, 0.9, 1) and ratio == pytest.approx(9.0)


def test_a_tolerance_takes_a_measure_exactly_at_its_limit():
    from vibevoice_onnx.verify.common import Tolerance

    tolerance = Tolerance(cosine=0.99, gain=0.25, relative=0.5)
    assert tolerance.judge(0.99, 1.25, 0.5) and tolerance.judge(0.99, 0.75, 0.5)
    assert not tolerance.judge(0.9899, 1.0, 0.0) and not tolerance.judge(1.0, 1.2501, 0.0)
    assert not tolerance.judge(1.0, 1.0, 0.5001) and Tolerance(0.99, 0.25).judge(1.0, 1.0, 1e9)
    assert tolerance.describe() == {"min_cosine": 0.99, "max_gain_error": 0.25, "max_relative_error": 0.5}
    assert Tolerance(0.99, 0.25).describe() == {"min_cosine": 0.99, "max_gain_error": 0.25}


def test_compare_judges_the_worst_output_refuses_a_shape_and_takes_a_near_silent_one_by_its_largest_difference():
    reference = RNG.standard_normal((3, 512)).astype(np.float32)
    outputs = [off(reference[0], gain=1.01), off(reference[1], cosine=0.999), reference[2].copy()]
    gate = compare("several", outputs, list(reference), LIMITS["int8"].graph, "three outputs")
    assert gate.passed and gate.name == "several" and gate.detail == "three outputs"
    assert gate.gain == pytest.approx(1.01, rel=1e-5) and gate.cosine == pytest.approx(0.999, abs=1e-6)
    assert gate.relative == pytest.approx(np.sqrt(1 / 0.999**2 - 1), rel=1e-3)  # the noisy one's
    assert gate.max_abs == max(float(np.abs(o - r).max()) for o, r in zip(outputs, reference))
    wrong = compare("shape", [reference[:, :10]], [reference[:, :11]], LIMITS["fp32"].graph)
    assert (wrong.name, wrong.passed, wrong.cosine, wrong.max_abs, wrong.detail) == (
        "shape", False, None, float("inf"), "shape [3, 10] != [3, 11]")
    empty = compare("empty", [np.zeros((0, 4))], [np.zeros((0, 4))], LIMITS["fp32"].graph)
    assert empty.max_abs == 0.0
    quiet = reference * 1e-5  # RMS 1e-5: direction there is rounding, so the largest difference judges
    for nudge, passes in ((9e-5, True), (2e-4, False)):
        judged = compare("quiet", [quiet + nudge], [quiet], LIMITS["fp32"].graph)
        assert judged.passed == passes and judged.detail.endswith("(near-silent reference: judged by max|Δ|)")
        assert judged.max_abs == pytest.approx(nudge, rel=1e-3)
    loud = compare("loud", [reference + 9e-5], [reference], LIMITS["fp32"].graph)
    assert "near-silent" not in loud.detail
    # near-silent only where every output's reference is: a loud one judges the gate by the tolerance
    mixed = compare("mixed", [reference[0] * 1.5, quiet[0]], [reference[0], quiet[0]], LIMITS["fp32"].graph)
    assert not mixed.passed and "near-silent" not in mixed.detail
    # a gain below 1 in one output, beside outputs above it (a graph's states quieter, its audio louder): the
    # quieter one is the worst, whichever way the others lean
    for gains in ((1.0, 0.97, 1.01), (1.015, 0.97), (0.97, 1.02, 1.02)):
        outputs = [reference[i] * g for i, g in enumerate(gains)]
        judged = compare("quieter", outputs, list(reference[: len(gains)]), LIMITS["int8"].graph)
        assert not judged.passed and judged.gain == pytest.approx(0.97, rel=1e-5), (gains, judged)


def test_exact_on_cpu_says_so_and_leaves_other_devices_to_the_tolerance():
    reference = RNG.standard_normal(64).astype(np.float32)
    gate = exact_on_cpu(compare("same", [reference.copy()], [reference], SAME_ARITHMETIC, "8 frames"), "cpu")
    assert gate.passed and gate.detail == "8 frames; bitwise (CPU)"
    assert exact_on_cpu(compare("same", [reference.copy()], [reference], SAME_ARITHMETIC), "cpu").detail == "bitwise (CPU)"
    assert exact_on_cpu(compare("same", [reference.copy()], [reference], SAME_ARITHMETIC), "cuda").detail == ""


def test_a_teacher_forced_run_that_left_the_trajectory_is_one_failed_gate():
    theirs = trajectory()
    short = forced_run(theirs)
    short.frames = FRAMES - 1
    gates, curves = forced_gates("loop", short, theirs, "", LIMITS["fp32"])
    assert curves == {} and len(gates) == 1
    gate = gates[0]
    assert (gate.name, gate.passed, gate.max_abs) == ("loop, teacher-forced: ran the reference's trajectory", False,
                                                      float("inf"))
    assert gate.detail == f"{FRAMES - 1} latents against the reference's {FRAMES}"
    none = forced_run(theirs)
    none.frames = theirs.frames = 0
    assert not forced_gates("loop", none, theirs, "", LIMITS["fp32"])[0][0].passed


def test_the_teacher_forced_gates_name_the_worst_frame_and_keep_the_curves():
    theirs = trajectory()
    forced = forced_run(theirs)
    forced.sampled[4] = off(theirs.latents[4], cosine=0.99)  # the worst frame of the latents
    gates, curves = forced_gates("loop", forced, theirs, "setting", LIMITS["int8"])
    assert [g.name for g in gates] == ["loop, teacher-forced: conditions", "loop, teacher-forced: sampled latents",
                                       "loop, teacher-forced: sampled latent RMS ratio in [0.93, 1.07]",
                                       "loop, teacher-forced: audio"]
    latents = gates[1]
    assert "worst at frame 4;" in latents.detail and latents.detail.endswith("setting")
    assert latents.cosine == pytest.approx(0.99, abs=1e-6) and latents.max_abs > 0 and latents.relative > 0.1
    assert latents.gain == pytest.approx(1.0, abs=0.02)
    assert len(curves["latent_cosine"]) == FRAMES and curves["latent_cosine"][4] == pytest.approx(0.99, abs=1e-5)
    assert len(curves["condition_cosine"]) == len(curves["latent_rms_ratio"]) == FRAMES
    ratio = gates[2]
    assert ratio.max_abs == pytest.approx(max(abs(r - 1) for r in curves["latent_rms_ratio"]), abs=1e-4)
    assert ratio.detail.startswith("ratios ") and ratio.detail.endswith("setting")


def test_the_rounding_floor_grows_with_the_loops_gain_and_never_shrinks():
    assert calibration.rounding_floor(3, 2.0) == pytest.approx([1e-6, 2e-6, 4e-6])
    assert calibration.rounding_floor(2, None) == calibration.rounding_floor(2, 0.5) == pytest.approx([1e-6, 1e-6])


def test_the_loops_amplification_is_fitted_before_it_saturates():
    growing = [[1e-3 * 1.5**t for t in range(12)] for _ in range(3)]  # passes 0.5 at frame 16, past the run
    assert calibration.amplification(growing) == pytest.approx(1.5)
    saturating = [[min(1e-2 * 2.0**t, 0.9) for t in range(10)] for _ in range(2)]  # 0.64 at frame 6
    assert calibration.amplification(saturating) == pytest.approx(2.0)
    assert calibration.amplification([[0.7, 0.8, 0.9]]) is None and calibration.amplification([]) is None
    assert calibration.amplification([[1e-3, 0.6]]) is None  # one frame to fit


def loop_of(frames: int, rng, logits: list[float]) -> SimpleNamespace:
    latents = [rng.standard_normal(256).astype(np.float32) for _ in range(frames)]
    return SimpleNamespace(latents=latents, frames=frames, chunks=latents, audio=np.concatenate(latents),
                           eos_logits=list(logits))


def test_a_decision_the_perturbed_runs_moved_too_far_is_not_kept_and_may_flip():
    """Kept: every perturbed run moved the reference's margin by less than a third of it. Frame 1's margin 1.0
    moved by 0.4 in one run (more than 1/3): not kept, so the bundle may decide it either way; frame 0's margin
    0.0 is kept by nobody; frame 2 (margin 2.0, moved 0.1) is kept, and flipping it fails."""
    rng = np.random.default_rng(5)
    reference = loop_of(3, rng, [0.0, 1.0, -2.0])
    perturbed = [free_run(reference, [1e-3] * 3, rng) for _ in calibration.SEEDS]
    for k, run in enumerate(perturbed):
        run.eos_logits = [0.0, 1.0 - (0.4 if k == 0 else 0.1), -2.0 + 0.1]
    error = calibration.StepError([1e-3] * 3, [0.1] * 3, [0.0] * 3)
    ours = free_run(reference, [1e-3] * 3, rng)
    ours.eos_logits = [0.5, -1.0, -2.0]
    gates, info = calibration.calibrated_gates("loop", ours, reference, perturbed, error, calibration.EOS, "")
    decisions = next(g for g in gates if "decisions" in g.name)
    assert decisions.passed and info["decisions"] == {"decided": [2], "flipped": []}
    assert decisions.detail.startswith("1 of 3 kept by every perturbed run, 1 judged")
    assert decisions.max_abs == pytest.approx(2.0)  # the largest shift of a margin: frame 1's, 1.0 to -1.0
    ours.eos_logits = [0.5, -1.0, 0.5]
    gates, info = calibration.calibrated_gates("loop", ours, reference, perturbed, error, calibration.EOS, "")
    assert info["decisions"]["flipped"] == [2] and "fails: the loop leaves the reference faster" in info["verdict"]


def test_the_free_runs_record_says_what_it_was_judged_by():
    rng = np.random.default_rng(6)
    reference = loop_of(6, rng, [-3.0] * 6)
    sizes = [1e-3 * 1.3**t for t in range(6)]
    perturbed = [free_run(reference, sizes, rng) for _ in calibration.SEEDS]
    error = calibration.StepError([1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3], [0.0] * 6, [0.0] * 6)
    ours = free_run(reference, [2 * s for s in sizes], rng)
    gates, info = calibration.calibrated_gates("loop", ours, reference, perturbed, error, calibration.EOS, "setting")
    assert all(g.passed for g in gates) and info["verdict"].startswith("passes: the loop does no worse")
    assert info["judged_latents"] == 6 and info["floor"] == pytest.approx(3.5e-3) and info["margin"] == 3.0
    assert info["amplification_per_frame"] == pytest.approx(1.3, abs=0.05) and len(info["divergence"]) == 6
    latent = next(g for g in gates if "latent divergence" in g.name)
    assert latent.name == "loop: latent divergence within the loop's own spread" and latent.detail.endswith("setting")
    from vibevoice_onnx.verify.common import cosine

    assert latent.cosine == min(cosine(a, b) for a, b in zip(ours.latents, reference.latents))
    audio = next(g for g in gates if "audio divergence" in g.name)
    assert audio.max_abs == pytest.approx(calibration.relative_error(ours.audio, reference.audio))
    assert [g.name for g in gates] == ["loop: latent divergence within the loop's own spread",
                                       "loop: latent scale (|log RMS ratio|) within the loop's own spread",
                                       "loop: audio divergence within the loop's own spread",
                                       "loop: per-frame EOS decisions agree where the loop's own spread keeps them"]
