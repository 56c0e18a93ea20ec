"""A free-running closed loop judged against the loop's own chaos: one rule for every kind and precision.

A closed loop feeds back what it made. On a random-weight checkpoint, and around a trained model's decision
points, a small error at one frame grows frame by frame, by a gain that depends on the checkpoint. A constant
limit on the free-running divergence therefore judges the checkpoint's luck as much as the bundle. Instead:

1. the teacher-forced run (the bundle along the reference's trajectory, verify.common.forced_gates) gives the
   bundle's one-step error at every frame: each sampled latent's relative error, and the error of what each
   frame or step decides on (the EOS logit, the four choice logits);
2. the fp32 reference runs the loop again once per seed with a perturbation of exactly that size added where
   the error arises (the fed-back latent: its measured scale error, the rest in a random direction; the 1.5B's
   and Large's second feedback path, the semantic features of the decoded audio, likewise; the logits decided
   on, in a random direction), each seed its own directions;
3. the bundle's free run is judged against the spread of those runs: at every frame its divergence from the
   reference may be at most MARGIN times the largest any perturbed run reached by then, its latents' scale
   likewise; and it must decide as the reference does wherever every perturbed run kept the reference's
   decision more than MARGIN times its own shift clear.

The teacher-forced gates stay absolute: they decide what one step may cost. This judges only what the loop
does with that cost, so a bundle fails here when its loop leaves the reference faster than errors of its own
size make the reference leave itself (a feedback path that is wrong, not merely imprecise).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..generation.common import SpeechResult, Steering
from .judge import Gate, cosine, relative_error, rms

SEEDS = (101, 102, 103, 104)  # one perturbed reference run each; fixed, so a verdict is reproducible
MARGIN = 3.0  # how much worse than the worst same-sized random perturbation a bundle's loop may do
FLOOR = 1e-6  # relative differences below this are float rounding, whatever the spread (at the first frame: the
# loop amplifies rounding as it amplifies any error, so frame t's floor is FLOOR times the loop's gain to the t)
SATURATED = 0.5  # a relative divergence past this is another generation: the amplification is fitted below it
RULE = (f"the bundle's one-step error (teacher-forced) injected as perturbations of the same size (each fed-back "
        f"latent's and semantic feature's scale error as measured, the rest in a random direction) into "
        f"{len(SEEDS)} runs of the fp32 reference; the bundle's free run may diverge at most {MARGIN:g}x as far as "
        f"the farthest of them had by each frame, and must keep every decision they all keep {MARGIN:g}x clear")


def _at(values: list[float], index: int) -> float:
    """values[index], or their median past the end (a perturbed run may outlast the measured trajectory)."""
    if index < len(values):
        return values[index]
    return float(np.median(values)) if values else 0.0


@dataclass(frozen=True)
class Decisions:
    """What a loop decides on at each frame or step, and how far the reference's decision is from flipping.

    `margins(run, reference)`: at each index, the run's margin for the decision the reference took (positive:
    the run takes it too). `aligned(run, reference, index)`: whether the run is still on the reference's path
    there, and `comparable(run, reference)`: how many of its first latents are (a 1.5B run that fed another
    token is on another path from then on: what it makes there is not the reference's to compare)."""

    name: str
    margins: Callable[[SpeechResult, SpeechResult], list[float]]
    aligned: Callable[[SpeechResult, SpeechResult, int], bool]
    comparable: Callable[[SpeechResult, SpeechResult], int]
    values: Callable[[SpeechResult], list]  # the raw per-index values whose error the forced run measures


def _eos_margins(run, reference) -> list[float]:
    return [float(ours) * (1.0 if theirs > 0 else -1.0) for ours, theirs in zip(run.eos_logits, reference.eos_logits)]


def _pick_margins(run, reference) -> list[float]:
    margins = []
    for ours, theirs in zip(run.logits, reference.logits):
        pick = int(np.argmax(theirs))
        margins.append(float(ours[pick] - np.delete(ours, pick).max()))
    return margins


EOS = Decisions("per-frame EOS decisions", _eos_margins, lambda run, reference, index: True,
                lambda run, reference: min(run.frames, reference.frames), lambda run: run.eos_logits)


def picks(latent_token: int) -> Decisions:
    """The 1.5B's decisions: the LM's pick among four tokens at each step; `latent_token` is the one at
    which a step makes a latent."""

    def comparable(run, reference) -> int:
        fed = list(zip(run.tokens, reference.tokens))
        split = next((step for step, (ours, theirs) in enumerate(fed) if ours != theirs), len(fed))
        return min(run.frames, sum(token == latent_token for token in reference.tokens[:split]))

    return Decisions("the LM's picks", _pick_margins,
                     lambda run, reference, index: run.tokens[:index] == reference.tokens[:index], comparable,
                     lambda run: run.logits)


@dataclass(frozen=True)
class StepError:
    """A bundle's one-step error at every frame (latents, and the 1.5B's fed-back semantic features) and index
    (decisions), as teacher forcing measures it."""

    latent: list[float]  # ||sampled - reference|| / ||reference||
    decision: list[float]  # ||Δ|| of the values decided on (an EOS logit, the four choice logits)
    scale: list[float] = ()  # log RMS ratio of each sampled latent (signed): the part of `latent` that is its scale
    feature: list[float] = ()  # the same two measures of the semantic features fed back (1.5B, Large)
    feature_scale: list[float] = ()
    # The audio's relative error with the reference's own latents fed back: the decoder's own, which the free run's
    # audio carries whatever its latents (and the perturbed runs, decoded by the reference, never do).
    audio: float = 0.0

    @classmethod
    def measure(cls, forced, reference, decisions: Decisions) -> "StepError":
        latent, scale = _errors(forced.sampled, reference.latents)
        decision = [float(np.linalg.norm(np.subtract(ours, theirs)))
                    for ours, theirs in zip(decisions.values(forced), decisions.values(reference))]
        feature, feature_scale = _errors(getattr(forced, "features", None) or [],
                                         getattr(reference, "features", None) or [])
        audio = _audio_divergence(forced, reference, min(len(forced.chunks), len(reference.chunks)))
        return cls(latent, decision, scale, feature, feature_scale, audio)

    def describe(self) -> dict:
        described = {"latent_relative": self.latent, "decision_abs": self.decision, "latent_scale": self.scale}
        if self.feature:
            described |= {"feature_relative": self.feature, "feature_scale": self.feature_scale}
        return {**{key: [float(f"{x:.3g}") for x in values] for key, values in described.items()},
                "audio_relative": float(f"{self.audio:.3g}")}


def _errors(ours: list[np.ndarray], theirs: list[np.ndarray]) -> tuple[list[float], list[float]]:
    """Per pair: the relative error, and its signed log RMS ratio (the part of it that is scale)."""
    pairs = list(zip(ours, theirs))
    return [relative_error(a, b) for a, b in pairs], [signed_log_rms_ratio(a, b) for a, b in pairs]


def _direction(rng: np.random.Generator, shape) -> np.ndarray:
    """A uniformly random unit vector (a random sign for a scalar)."""
    vector = rng.standard_normal(shape)
    return vector / max(float(np.linalg.norm(vector)), 1e-30)


class Perturbation(Steering):
    """The reference's loop with the bundle's one-step error added where it arises, in random directions."""

    def __init__(self, error: StepError, seed: int):
        self.error, self.rng = error, np.random.default_rng(seed)

    def _off(self, own: np.ndarray, error: list[float], scale: list[float], frame: int) -> np.ndarray:
        """`own` off by the one-step error measured at `frame`: its scale by the scale error, sign and all (a
        random direction alone would barely move a vector's norm, where quantization moves it at first order, and
        the same way frame after frame), the rest of the error's size in a random direction."""
        error, rescaled = _at(error, frame), float(np.exp(_at(list(scale), frame))) - 1.0
        size = np.sqrt(max(error**2 - rescaled**2, 0.0)) * float(np.linalg.norm(own))
        return (own * (1.0 + rescaled) + size * _direction(self.rng, own.shape)).astype(np.float32)

    def latent(self, own: np.ndarray, result: SpeechResult) -> np.ndarray:
        return self._off(own, self.error.latent, self.error.scale, len(result.latents))

    def features(self, own: np.ndarray, result: SpeechResult) -> np.ndarray:
        """The features of the latest latent's audio (decoded, then semantically encoded) off by that path's error."""
        if not self.error.feature:
            return own
        return self._off(np.asarray(own, np.float32), self.error.feature, self.error.feature_scale, result.frames - 1)

    def eos_logit(self, logit: float, frame: int) -> float:
        return float(logit + _at(self.error.decision, frame) * _direction(self.rng, ()))

    def choice_logits(self, logits: np.ndarray, step: int) -> np.ndarray:
        logits = np.asarray(logits, np.float32)
        return (logits + _at(self.error.decision, step) * _direction(self.rng, logits.shape)).astype(np.float32)


def perturbed_runs(run: Callable[[Steering], SpeechResult], error: StepError) -> list[SpeechResult]:
    """The reference's loop once per seed, perturbed by `error` (`run(steering)` runs it and returns the result)."""
    return [run(Perturbation(error, seed)) for seed in SEEDS]


def _running_max(curves: list[list[float]], length: int) -> list[float]:
    """At each index, the largest value any curve reached up to there."""
    envelope, worst = [], 0.0
    for index in range(length):
        worst = max([worst] + [curve[index] for curve in curves if index < len(curve)])
        envelope.append(worst)
    return envelope


def _latent_curves(run, reference, frames: int | None = None) -> tuple[list[float], list[float]]:
    """Per common frame (the first `frames` of them, if given): the relative divergence, and |log| of the RMS
    ratio."""
    pairs = list(zip(run.latents, reference.latents))[:frames]
    return ([relative_error(ours, theirs) for ours, theirs in pairs],
            [log_rms_ratio(ours, theirs) for ours, theirs in pairs])


def log_rms_ratio(a: np.ndarray, b: np.ndarray) -> float:
    return abs(signed_log_rms_ratio(a, b))


def signed_log_rms_ratio(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.log(max(rms(a), 1e-30) / max(rms(b), 1e-30)))


def _audio_divergence(run, reference, frames: int) -> float:
    """The relative divergence of the audio of the first `frames` latents."""
    samples = sum(len(chunk) for chunk in reference.chunks[:frames])
    return relative_error(run.audio[:samples], reference.audio[:samples]) if samples else 0.0


def amplification(curves: list[list[float]]) -> float | None:
    """The loop's gain per frame: the growth of the perturbed runs' (geometric) mean divergence, fitted over
    the frames before it saturates; None where fewer than two frames are left to fit."""
    length = min((len(c) for c in curves), default=0)
    mean = [float(np.exp(np.mean([np.log(max(c[t], FLOOR)) for c in curves]))) for t in range(length)]
    frames = list(itertools.takewhile(lambda t: mean[t] < SATURATED, range(length)))
    if len(frames) < 2:
        return None
    slope = np.polyfit(frames, np.log([mean[t] for t in frames]), 1)[0]
    return float(np.exp(slope))


def rounding_floor(frames: int, gain: float | None) -> list[float]:
    """At each frame, the float rounding a loop of this gain per frame (None: not measured) has grown to."""
    return [FLOOR * max(gain or 1.0, 1.0) ** t for t in range(frames)]


def _within(label: str, ours: list[float], envelope: list[float], what: str, detail: str,
            floor: list[float]) -> tuple[Gate, float, int]:
    """Each value at most MARGIN times the envelope there, the rounding floor there apart: the gate, the worst
    value's multiple of the spread, and its frame."""
    ratios = [value / max(bound, low) for value, bound, low in zip(ours, envelope, floor)]
    worst = int(np.argmax(ratios)) if ratios else 0
    passed = all(value <= MARGIN * bound + low for value, bound, low in zip(ours, envelope, floor))
    text = (f"worst at frame {worst}: {ours[worst]:.3g}, {ratios[worst]:.2f}x the spread of {envelope[worst]:.3g} "
            f"(at most {MARGIN:g}x); " if ratios else "")
    gate = Gate(f"{label}: {what} within the loop's own spread", None, max(ours, default=0.0), passed, text + detail)
    return gate, (ratios[worst] if ratios else 0.0), worst


def _decisions_gate(label: str, ours, reference, perturbed: list, decisions: Decisions) -> tuple[Gate, dict]:
    """The bundle decides as the reference does wherever every perturbed run kept that decision, its margin
    moved by less than 1/MARGIN of the reference's; where the bundle is still on the reference's path."""
    theirs = decisions.margins(reference, reference)
    runs = [decisions.margins(run, reference) for run in perturbed]
    kept = [index for index, margin in enumerate(theirs)
            if margin > 0 and all(index < len(run) and decisions.aligned(other, reference, index)
                                  and abs(run[index] - margin) * MARGIN < margin
                                  for run, other in zip(runs, perturbed))]
    mine = decisions.margins(ours, reference)
    judged = [index for index in kept if index < len(mine) and decisions.aligned(ours, reference, index)]
    flipped = [index for index in judged if mine[index] <= 0]
    shift = max((abs(a - b) for a, b in zip(mine, theirs)), default=0.0)
    detail = (f"{len(kept)} of {len(theirs)} kept by every perturbed run, {len(judged)} judged (the bundle on the "
              f"reference's path), {len(flipped)} flipped{' (at ' + ', '.join(map(str, flipped[:10])) + ')' if flipped else ''}")
    gate = Gate(f"{label}: {decisions.name} agree where the loop's own spread keeps them", None, shift,
                not flipped, detail)
    return gate, {"decided": kept, "flipped": flipped}


def calibrated_gates(label: str, ours, reference, perturbed: list, error: StepError, decisions: Decisions,
                     detail: str) -> tuple[list[Gate], dict]:
    """The bundle's free run (`ours`) against the reference's, judged by the spread of the `perturbed` runs:
    its latents and audio as far as it stays on the reference's path (decisions.comparable)."""
    judged = decisions.comparable(ours, reference)
    divergence, scale = _latent_curves(ours, reference, judged)
    curves = [_latent_curves(run, reference) for run in perturbed]
    spread = _running_max([c[0] for c in curves], judged)
    scale_spread = _running_max([c[1] for c in curves], judged)
    gain = amplification([c[0] for c in curves])
    floor = float(np.median(error.latent)) if error.latent else 0.0
    about = (f"{judged} of {ours.frames} latents on the reference's path; {len(perturbed)} reference runs perturbed "
             f"by the bundle's one-step error (median {floor:.2g}"
             + (f", amplified {gain:.2f}x per frame" if gain else "") + f"); {detail}")
    rounding = rounding_floor(judged, gain)
    latent_gate, worst, at = _within(label, divergence, spread, "latent divergence", about, rounding)
    latent_gate.cosine = min((cosine(a, b) for a, b in zip(ours.latents[:judged], reference.latents)), default=None)
    scale_gate, _, _ = _within(label, scale, scale_spread, "latent scale (|log RMS ratio|)", about, rounding)
    audio = _audio_divergence(ours, reference, judged)
    audio_spread = max((_audio_divergence(run, reference, min(judged, run.frames)) for run in perturbed), default=0.0)
    samples = sum(len(chunk) for chunk in reference.chunks[:judged])
    # the decoder's own error (error.audio) joins the spread: a bundle quantized off the feedback path (the
    # decoder alone) leaves the latents on the reference's path and its audio exactly as far off as its decoder
    audio_gate = Gate(f"{label}: audio divergence within the loop's own spread",
                      cosine(ours.audio[:samples], reference.audio[:samples]) if judged else None, audio,
                      audio <= MARGIN * (audio_spread + error.audio) + rounding[-1] if rounding else audio <= FLOOR,
                      f"{audio:.3g} against a spread of {audio_spread:.3g} and the decoder's own {error.audio:.3g}; "
                      f"{about}")
    decision_gate, decided = _decisions_gate(label, ours, reference, perturbed, decisions)
    verdict = ("passes: the loop does no worse with the bundle's error than with a random error of the same size"
               if latent_gate.passed and scale_gate.passed and audio_gate.passed and decision_gate.passed else
               "fails: the loop leaves the reference faster than errors of the bundle's own size make it")
    info = {"rule": RULE, "seeds": list(SEEDS), "margin": MARGIN, "one_step_error": error.describe(),
            "floor": float(f"{floor:.3g}"), "amplification_per_frame": None if gain is None else round(gain, 3),
            "judged_latents": judged,
            "divergence": [float(f"{x:.3g}") for x in divergence], "spread": [float(f"{x:.3g}") for x in spread],
            "worst_ratio": round(worst, 3), "worst_frame": at, "decisions": decided, "verdict": verdict}
    return [latent_gate, scale_gate, audio_gate, decision_gate], info


HEAD_CONDITIONING = "model.prediction_head.cond_proj.weight"  # how every TTS kind's diffusion head reads the LM


def high_gain_copy(checkpoint: Path, out: Path, factor: float = 4.0) -> Path:
    """A copy of a TTS checkpoint whose loop amplifies an error faster: the diffusion head's conditioning
    projection scaled by `factor`, so each latent follows the LM's conditions, and so the fed-back latents,
    more steeply. On the tiny realtime checkpoint, x4 turns a loop gain of 1.09 a frame into 2.0 (a 1e-3
    perturbation of every latent grows to a different generation by frame 8): the kind of loop a constant
    free-running limit misjudges."""
    from ..checkpoints.files import edited_copy

    return edited_copy(checkpoint, out, {HEAD_CONDITIONING: lambda weight: weight * factor})


def wrong_scale(graph: Path, factor: float) -> str:
    """A quantizer's mistake, made on purpose (tests and benchmarks show that verify catches it): the largest
    quantization-scale tensor of a MatMulNBits graph multiplied by `factor`, in place. Returns its name."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(graph))
    scales = [t for t in model.graph.initializer if t.name.endswith("_scales")]
    if not scales:
        raise ValueError(f"{graph}: holds no MatMulNBits scales")
    target = max(scales, key=lambda t: int(np.prod(t.dims)))
    target.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(target) * np.float32(factor), target.name))
    onnx.save(model, str(graph))
    return target.name


# Where benchmarks/gate_sizes.py and the tests put a gain into a realtime bundle (scaled_output): a graph of each
# stage of the loop, and the output of it the next stage reads.
REALTIME_GAIN_POINTS = {"acoustic_decoder_stream": "audio", "diffusion_head_step": "velocity",
                        "acoustic_connector": "embeddings", "upper_lm": "hidden_states"}


def scaled_output(graph: Path, output: str, factor: float) -> None:
    """A conversion's mistake made on purpose (tests and benchmarks show that verify catches it): the output
    `output` of an ONNX graph multiplied by `factor`, in place: a gain, which leaves every cosine at 1. Whatever
    the graph itself reads of that tensor keeps the value before the gain (an LM's cache stays as it was)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(graph), load_external_data=False)  # the weights stay in their external file, untouched
    declared = {o.name: o for o in model.graph.output}
    if output not in declared:
        raise ValueError(f"{graph}: has no output '{output}' (outputs: {', '.join(declared)})")
    inner, gain_name = f"{output}.before_gain", f"{output}.gain"
    for node in model.graph.node:
        node.output[:] = [inner if name == output else name for name in node.output]
        node.input[:] = [inner if name == output else name for name in node.input]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(declared[output].type.tensor_type.elem_type)
    model.graph.initializer.append(numpy_helper.from_array(np.array(factor, dtype), gain_name))
    model.graph.node.append(helper.make_node("Mul", [inner, gain_name], [output], name=f"{output}.gain_on_purpose"))
    onnx.save(model, str(graph))
