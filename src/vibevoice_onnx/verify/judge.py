"""What every kind's gates judge with, torch-free: tolerances and limits per precision, the Gate record, the
comparisons (direction, size and bias), the loops' gates that compare two runs of the runtime, and the parity
table. verify/common.py adds the PyTorch reference's side; a teacher made of fp32 ONNX graphs needs only this.
"""

from __future__ import annotations

import datetime
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..checkpoints.checkpoint import Checkpoint
from ..errors import VibeVoiceError
from ..families import family, stage
from ..runtime.bundle import Bundle, write_manifest
from ..runtime.device import MEMORY_ROOM, available_memory
from ..runtime.lm import ALL_ROWS, NEGATIVE, POSITIVE, KvCache, OnnxLm
from ..runtime.manifest import GATE_COLUMNS, gate_cells


SEED = 1234  # the noise of the closed loops (each kind's gates)


SILENT_RMS = 1e-3  # a reference output quieter than this is judged by max|Δ| instead


SILENT_MAX_ABS = 1e-4


F32 = np.float32


@dataclass(frozen=True)
class Tolerance:
    """How far an output may be from its reference, in three measures: its direction (cosine), its size along the
    reference (gain, <ours, ref> / <ref, ref>: a bias, which noise of any size leaves at 1, and which a cosine
    cannot see), and, where the arithmetic should be fp32's, both at once (relative error ||Δ|| / ||ref||; None:
    a quantized graph's noise is judged by the cosine and its bias by the gain)."""

    cosine: float  # the least cosine
    gain: float  # the most |gain - 1|
    relative: float | None = None  # the most relative error

    def judge(self, cosine: float, gain: float, relative: float) -> bool:
        return (cosine >= self.cosine and abs(gain - 1.0) <= self.gain
                and (self.relative is None or relative <= self.relative))

    def describe(self) -> dict:
        return {"min_cosine": self.cosine, "max_gain_error": self.gain,
                **({} if self.relative is None else {"max_relative_error": self.relative})}


# fp32 arithmetic on both sides: measured (CPU, 2026-12-06) relative error at most 3e-6 and gain error 3e-7 in
# every graph and teacher-forced step, tiny and full-size realtime; 1e-3 leaves 300x, and refuses a 1% gain.
FP32 = Tolerance(cosine=0.99999, gain=1e-3, relative=1e-3)


# One graph on one device along two paths that must compute the same numbers (the same kernels): bitwise on
# the CPU (verify.common.exact_on_cpu), within this elsewhere.
SAME_ARITHMETIC = Tolerance(cosine=0.999999, gain=1e-5, relative=1e-5)


# Streams batched against each run alone: batching may change the order of float sums (and a quantized graph's
# per-call activation scales), nothing else; measured exact (0.0) for realtime at every precision, tiny and full.
BATCHED = Tolerance(cosine=0.99999, gain=1e-3, relative=5e-3)


@dataclass(frozen=True)
class Limits:
    """What a bundle of one precision must reach against the fp32 reference, one step at a time.

    Random weights cannot show how quantization affects real speech. What they can show: a broken conversion
    (per graph), and a loop that leaves the reference's path or drifts off its scale. Each comparison judges
    direction and size (Tolerance). Two closed loops judge the loop:

    * teacher-forced, the runtime run along the reference's own trajectory (its latents decoded and fed back,
      its tokens chosen): every frame then measures one step of the precision's error, none compounded, so
      the conditions, each sampled latent (direction and scale), the EOS logit or the token picks and the
      decoded audio are judged at every frame against these absolute limits: what one step may cost;
    * free-running, the runtime feeding back its own latents: a loop amplifies any small error frame by frame,
      by a gain that depends on the checkpoint, so no constant can judge it. It is judged against the spread
      of the fp32 reference perturbed by the bundle's own one-step error (verify.calibration), the same rule
      for every kind and precision."""

    graph: Tolerance  # each graph's outputs against the reference module's
    same_path: Tolerance  # one bundle along two paths that differ in float sums (KV steps == prefill, streamed
    #                       == whole, batched CFG == separate) and, quantized, in the activations' dynamic scales
    decision_floor: float  # teacher-forced: an EOS logit or a token margin below this may be decided either way
    forced_condition: Tolerance  # teacher-forced: the conditions (LM hidden states, or an ASR step's logits)
    forced_latent: Tolerance  # teacher-forced: each latent sampled from them with the same noise (gain: pooled)
    forced_scale: tuple[float, float]  # teacher-forced: allowed range of each sampled latent's RMS over the reference's
    forced_audio: Tolerance  # teacher-forced: the teacher's latents decoded by the bundle

    def describe(self) -> dict:
        return {"graph": self.graph.describe(), "same_path": self.same_path.describe(),
                "decision_floor": self.decision_floor, "forced_condition": self.forced_condition.describe(),
                "forced_latent": self.forced_latent.describe(), "forced_latent_rms_ratio": list(self.forced_scale),
                "forced_audio": self.forced_audio.describe()}


# Quantized limits keep the cosines they had and bound the gain from measurements (2026-12-06, CPU): int8's
# largest gain error was 8e-3 (a decoder's conv state, full-size realtime), 6e-3 on tiny ones, so 0.02 refuses
# a 5% gain in any graph; int4's was 0.06 (tiny int4-mixed decoder states), so 0.1; fp16 is not yet measured
# on a GPU (its rounding is unbiased: 0.01).
LIMITS = {
    "fp32": Limits(graph=FP32, same_path=Tolerance(cosine=0.99999, gain=1e-4, relative=1e-4), decision_floor=0.01,
                   forced_condition=FP32, forced_latent=FP32, forced_scale=(0.999, 1.001), forced_audio=FP32),
    "fp16": Limits(graph=Tolerance(0.995, 0.01), same_path=Tolerance(0.999, 0.01), decision_floor=0.05,
                   forced_condition=Tolerance(0.995, 0.01), forced_latent=Tolerance(0.99, 0.01),
                   forced_scale=(0.95, 1.05), forced_audio=Tolerance(0.99, 0.01)),
    # int8's per-frame RMS band: one 64-value latent's size is mostly noise at int8 (the bias is judged by the
    # latents' pooled gain, 0.02); measured down to 0.947 on the high-gain checkpoint of
    # tests/test_teacher_forcing.py on an AMD EPYC with AVX-512 VNNI, whose int8 MatMulNBits activations round
    # otherwise than the Intel host's where 0.95 was set (2026-12-07).
    "int8": Limits(graph=Tolerance(0.995, 0.02), same_path=Tolerance(0.998, 0.02), decision_floor=0.25,
                   forced_condition=Tolerance(0.995, 0.02), forced_latent=Tolerance(0.97, 0.02),
                   forced_scale=(0.93, 1.07), forced_audio=Tolerance(0.99, 0.02)),
    "int4": Limits(graph=Tolerance(0.98, 0.1), same_path=Tolerance(0.998, 0.02), decision_floor=0.5,
                   forced_condition=Tolerance(0.98, 0.05), forced_latent=Tolerance(0.9, 0.05),
                   forced_scale=(0.8, 1.25), forced_audio=Tolerance(0.98, 0.05)),
}


LIMITS["int4-mixed"] = LIMITS["int4"]  # it holds 4-bit graphs: judged as int4 is
LIMITS["int8-decoder"] = LIMITS["int8"]  # its one quantized graph is int8's decoder


LOOP_REASONS = {  # written into every parity record beside the gates they explain (see Limits)
    "free_running": "the runtime feeds back its own latents, and the loop amplifies any error frame by frame by a "
                    "gain that depends on the checkpoint: judged against the fp32 reference perturbed by the "
                    "bundle's own one-step error (the calibration record), not against a constant",
    "teacher_forced": "the runtime runs along the reference's trajectory (its latents, and tokens, fed back): "
                      "every frame measures one step of the bundle's error, none compounded, so every frame is "
                      "judged against the precision's absolute limits",
}


RANDOM_WEIGHTS_CAVEAT = (
    "Synthetic checkpoints have random weights: these gates catch broken conversions and loops that leave the "
    "reference at once, but cannot show how quantization affects the speech of real weights."
)


@dataclass
class Gate:
    name: str
    cosine: float | None  # direction: the worst cosine of the outputs against the reference's
    max_abs: float
    passed: bool
    detail: str = ""
    relative: float | None = None  # size: the worst ||ours - reference|| / ||reference||
    gain: float | None = None  # bias: the worst least-squares scale of ours along the reference (1: none)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    if denom == 0:
        return 1.0 if np.array_equal(a, b) else 0.0
    return float(a @ b / denom)


def gain(a: np.ndarray, b: np.ndarray) -> float:
    """The least-squares scale of `a` along `b`, <a, b> / <b, b>: 1 where `a` has `b`'s size in `b`'s direction,
    whatever noise is added across it (which a cosine sees, and this does not); 1.02 for `b` made 2% louder."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    power = float(b @ b)
    return float(a @ b / power) if power > 0 else (1.0 if not a.any() else float("inf"))


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    """||a - b|| / ||b||: direction and size at once (0.02 for a 2% gain, or for noise of 2% of b's size)."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    norm = float(np.linalg.norm(b))
    return float(np.linalg.norm(a - b) / norm) if norm > 0 else (0.0 if not a.any() else float("inf"))


def worst_gain(values) -> float:
    """The gain farthest from 1 (as a ratio: 0.98 and 1/0.98 are as far)."""
    return max(values, key=lambda g: abs(np.log(max(g, 1e-30))) if np.isfinite(g) else float("inf"))


def compare(name: str, outputs: list, references: list, tolerance: Tolerance, detail: str = "") -> Gate:
    """Gate several output tensors at once, by the worst cosine, relative error and gain over all of them
    (`tolerance`), reporting the largest difference too."""
    cosines, relatives, gains, max_abs, silent = [], [], [], 0.0, True
    for ours, ref in zip(outputs, references):
        ours, ref = np.asarray(ours, F32), np.asarray(ref, F32)
        if ours.shape != ref.shape:
            return Gate(name, None, float("inf"), False, f"shape {list(ours.shape)} != {list(ref.shape)}")
        cosines.append(cosine(ours, ref))
        relatives.append(relative_error(ours, ref))
        gains.append(gain(ours, ref))
        max_abs = max(max_abs, float(np.abs(ours - ref).max()) if ours.size else 0.0)
        silent &= (rms(ref) if ref.size else 0.0) < SILENT_RMS
    worst, relative, bias = min(cosines), max(relatives), worst_gain(gains)
    passed = max_abs <= SILENT_MAX_ABS if silent else tolerance.judge(worst, bias, relative)
    return Gate(name, worst, max_abs, passed, detail + (" (near-silent reference: judged by max|Δ|)" if silent else ""),
                relative=relative, gain=bias)


def exact_on_cpu(gate: Gate, device: str) -> Gate:
    """A gate of two paths that run the same kernels on the same numbers: on the CPU they must agree bit for bit."""
    if device == "cpu":
        gate.passed = gate.max_abs == 0.0
        gate.detail += ("; " if gate.detail else "") + "bitwise (CPU)"
    return gate


BATCH_LATE_AFTER = 3  # the last of a batch gate's streams joins once the first has given this many items


def batched_and_alone(backend, batch, jobs: list, run: Callable, new_result: Callable) -> tuple[list, list]:
    """Each job run by itself on `backend`, then all of them batched in `batch` (runtime.batch), the last
    joining once the first has given BATCH_LATE_AFTER items: (the results alone, the results batched).
    `run(backend, job, result)` is the job's generation, filling `result` (a fresh `new_result()`)."""
    from ..generation.batching import read_together

    alone = [new_result() for _ in jobs]
    for job, result in zip(jobs, alone):
        for _ in run(backend, job, result):
            pass
    batched = [new_result() for _ in jobs]
    streams = [batch.frames(lambda member, job=job, result=result: run(member, job, result))
               for job, result in zip(jobs, batched)]
    read_together(streams, late=len(jobs) - 1, after=BATCH_LATE_AFTER)
    return alone, batched


def bound_gate(bundle: Bundle, loop: Callable[[Bundle], list[np.ndarray]], detail: str) -> Gate:
    """The runtime's bound path (every call through I/O binding, caches and states written in place where the
    graphs run, runtime.device) against the same loop of plain `session.run` calls on host arrays, each on a
    fresh opening of the bundle: on the CPU the same kernels on the same numbers, so bitwise equal; on a GPU
    within float rounding. `loop(bundle)` runs the kind's generation and returns what it produced."""
    bound, unbound = (loop(Bundle(bundle.path, providers=bundle.providers, bound=flag)) for flag in (True, False))
    return exact_on_cpu(compare("bound loop (I/O binding, state in place) == unbound loop (session.run)", bound, unbound,
                                SAME_ARITHMETIC, detail), bundle.placement.device)


def replay_gate(bundle: Bundle, loop: Callable[[Bundle], list[np.ndarray]], detail: str) -> Gate:
    """A fixed-profile CUDA bundle's graphs captured once and replayed (Bundle(cuda_graphs=True)) against the
    same loop called as usual: a replay must compute what the captured call computed."""
    replayed, plain = (loop(Bundle(bundle.path, providers=bundle.providers, cuda_graphs=flag)) for flag in (True, False))
    return compare("CUDA graphs replayed == the loop without them", replayed, plain, SAME_ARITHMETIC, detail)


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.asarray(x, np.float64) ** 2)))


def forced_gates(label: str, forced, theirs, detail: str, limits: Limits) -> tuple[list[Gate], dict]:
    """A teacher-forced loop (the runtime along the reference's trajectory, see Limits) against that reference,
    at every frame: the conditions each latent was sampled from, the latent sampled from them with the same
    noise, and the audio the bundle decodes from the reference's latents. Each by its worst frame's cosine and
    relative error, and by its gain over all frames at once (a bias is the same at every frame; a frame's own
    gain of a 64-value latent is mostly noise); each latent's RMS ratio too, frame by frame."""
    label = f"{label}, teacher-forced"
    if forced.frames != theirs.frames or not forced.frames:
        return [Gate(f"{label}: ran the reference's trajectory", None, float("inf"), False,
                     f"{forced.frames} latents against the reference's {theirs.frames}")], {}
    conditions = [min(cosine(a, b) for a, b in zip(ours, ref)) for ours, ref in zip(forced.conditions, theirs.conditions)]
    latents = [cosine(a, b) for a, b in zip(forced.sampled, theirs.latents)]
    ratios = [rms(a) / max(rms(b), 1e-12) for a, b in zip(forced.sampled, theirs.latents)]
    low, high = limits.forced_scale
    rows = [(a, b) for ours, ref in zip(forced.conditions, theirs.conditions) for a, b in zip(ours, ref)]
    gates = [
        frames_gate(f"{label}: conditions", rows, limits.forced_condition,
                    f"worst at frame {{at}} of {forced.frames} (positive and negative rows); " + detail, conditions),
        frames_gate(f"{label}: sampled latents", list(zip(forced.sampled, theirs.latents)), limits.forced_latent,
                    "each latent from the bundle's own conditions and the same noise; worst at frame {at}; " + detail,
                    latents),
        Gate(f"{label}: sampled latent RMS ratio in [{low}, {high}]", None, max(abs(r - 1) for r in ratios),
             low <= min(ratios) and max(ratios) <= high, f"ratios {min(ratios):.4f}..{max(ratios):.4f}; " + detail),
        compare(f"{label}: audio", [forced.audio], [theirs.audio], limits.forced_audio,
                "the reference's latents decoded by the bundle; " + detail),
    ]
    curves = {"condition_cosine": [round(c, 6) for c in conditions], "latent_cosine": [round(c, 6) for c in latents],
              "latent_rms_ratio": [round(r, 4) for r in ratios]}
    return gates, curves


def frames_gate(name: str, pairs: list, tolerance: Tolerance, detail: str, cosines: list[float] | None = None) -> Gate:
    """Frame-by-frame (ours, reference) pairs judged by `tolerance`: the worst frame's cosine (`cosines`, one per
    frame, where a frame is several pairs; else each pair's) and relative error, and the gain of all of them at
    once. `detail` may name the worst frame as {at}. No pairs: a failed gate (nothing was compared)."""
    if not pairs:
        return Gate(name, 0.0, 0.0, False, detail.replace("{at}", "-"), relative=0.0, gain=1.0)
    cosines = [cosine(a, b) for a, b in pairs] if cosines is None else cosines
    worst, at = min(cosines), int(np.argmin(cosines))
    relative = max(relative_error(a, b) for a, b in pairs)
    bias = gain(np.concatenate([np.ravel(a) for a, _ in pairs]), np.concatenate([np.ravel(b) for _, b in pairs]))
    max_abs = max(float(np.abs(np.subtract(a, b)).max()) for a, b in pairs)
    return Gate(name, worst, max_abs, tolerance.judge(worst, bias, relative), detail.replace("{at}", str(at)),
                relative=relative, gain=bias)


class Probe:
    """Realistic gate inputs: embeddings of random tokens from the model's own table, caches from prefills."""

    def __init__(self, embed: Callable[[np.ndarray], np.ndarray], vocab: int, seed: int = 0):
        self.embed, self.vocab = embed, vocab
        self.rng = np.random.default_rng(seed)

    def tokens(self, count: int) -> np.ndarray:
        return self.embed(self.rng.integers(0, self.vocab, (1, count)))

    def normal(self, *shape: int) -> np.ndarray:
        return self.rng.standard_normal(shape).astype(F32)


def lm_self_gates(name: str, onnx_lm: OnnxLm, probe: Probe, limits: Limits) -> list[Gate]:
    """An LM graph's own paths: KV incremental == prefill, and its fixed-capacity cache written in place == the
    same graph's growing cache."""
    gates = []
    length, prefix = 8, 3
    embeds = probe.tokens(length)
    whole, stepped = KvCache(onnx_lm), KvCache(onnx_lm)
    full = onnx_lm.run(embeds, whole)
    pieces = [onnx_lm.run(embeds[:, :prefix], stepped)] + [onnx_lm.run(embeds[:, i : i + 1], stepped)
                                                           for i in range(prefix, length)]
    gates.append(compare(f"{name} KV: prefill {prefix} + {length - prefix} steps == prefill {length}",
                         [np.concatenate(pieces, axis=1), *stepped.filled()], [full, *whole.filled()], limits.same_path))
    gates.append(cache_gate(name, onnx_lm, probe))
    return gates


# Each step of cache_gate: (rows, tokens), or a row's cache taken back or emptied. What the loops do: a prompt
# into the positive row, both CFG rows one token (the negative from nothing), a text window into one row, a
# speculation taken back, a restart, steps past the capacity (it grows twice), a row alone.
CACHE_SCRIPT = ((POSITIVE, 6), (ALL_ROWS, 1), (POSITIVE, 3), ("forget", 1), (ALL_ROWS, 1), ("restart", 1),
                (ALL_ROWS, 1), (ALL_ROWS, 1), (ALL_ROWS, 1), (NEGATIVE, 1), (ALL_ROWS, 1))


def cache_gate(name: str, onnx_lm: OnnxLm, probe: Probe) -> Gate:
    """The runtime's cache (fixed capacity, written in place, starting small so it grows) against the same
    graph returning a longer copy each call, as caches grew before: hidden states and both rows' caches."""
    caches = [KvCache(onnx_lm, 2, capacity=4), KvCache(onnx_lm, 2, in_place=False)]
    probe = Probe(probe.embed, probe.vocab, seed=1)  # its own draws: the other gates' inputs stay as they were
    outputs: list[list[np.ndarray]] = [[], []]
    for rows, count in CACHE_SCRIPT:
        if rows in ("forget", "restart"):
            for cache in caches:
                getattr(cache, rows)(count)
            continue
        embeds = np.concatenate([probe.tokens(count) for _ in range(2)])[rows]
        for cache, out in zip(caches, outputs):
            out.append(onnx_lm.run(embeds, cache, rows))
    for cache, out in zip(caches, outputs):
        out += cache.filled(0) + cache.filled(1)
    return exact_on_cpu(compare(f"{name}: fixed-capacity cache (in place) == growing cache ({len(CACHE_SCRIPT)} steps)",
                                outputs[0], outputs[1], SAME_ARITHMETIC), onnx_lm.placement.device)


def streamed_decode_gate(stream, latents: np.ndarray, limits: Limits) -> Gate:
    """A streaming decoder graph (runtime.lm.StreamingConv) fed frame by frame with its states == the same graph
    on the whole sequence from zero states."""
    frames = latents.shape[1]
    state, pieces = stream.new_state(), []
    for i in range(frames):
        chunk, state = stream.run(latents[:, i : i + 1], state)
        pieces.append(chunk)
    return compare(f"decoder: {frames} streamed frames == whole decode", [np.concatenate(pieces, axis=2)],
                   [stream.whole(latents)], limits.same_path)


def limits_for(kind: str, precision: str) -> Limits:
    """The limits a bundle is judged by: its precision's, except that a kind whose graphs quantize their
    activations to int8 in every bundle (BitNet) is judged as int8 at fp32 too."""
    return LIMITS["int8" if precision == "fp32" and family(kind).int8_activations else precision]


def format_table(record: dict) -> str:
    rows = [GATE_COLUMNS, *map(gate_cells, record["gates"])]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for g in record["gates"]:
        if g["detail"] and (not g["passed"] or " agree" in g["name"]):
            lines.append(f"  {g['name']}: {g['detail']}")
    lines += record.get("notes", [])  # what a kind's gates report beside them (a fixed bundle: mobile usability)
    lines.append("all gates passed" if record["passed"] else "SOME GATES FAILED")
    if "not_recorded" in record:
        lines.append("warning: " + record["not_recorded"])
    return "\n".join(lines)


def resolve_checkpoint(bundle: Bundle, checkpoint: Checkpoint | Path | None) -> Checkpoint | Path:
    """The checkpoint given (opened or not), else the one the bundle was built from, if it is still there."""
    if isinstance(checkpoint, Checkpoint):
        return checkpoint
    path = Path(checkpoint) if checkpoint else Path(bundle.info.source_path)
    if not (path / "config.json").is_file():
        raise VibeVoiceError(f"{path}: checkpoint not found; pass --checkpoint with the directory this bundle was built from")
    return path


def gates_of(kind: str):
    """The module holding a kind's gates: run_gates(bundle, checkpoint, voice, log) -> (gates, info)."""
    return stage(kind, "gates", f"verifying {kind} bundles")


def verify_bundle(bundle_dir: Path, checkpoint: Checkpoint | Path | None = None, voice: str | None = None, log=None,
                  teacher: Path | None = None) -> dict:
    """Run the bundle's gates and record their verdict in its manifest: against the fp32 PyTorch reference of
    `checkpoint`, or, with `teacher`, against that fp32 bundle of the same checkpoint (the graphs written without
    torch: no PyTorch needed)."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    bundle = Bundle(Path(bundle_dir))
    limits = limits_for(bundle.kind, bundle.info.precision)
    if teacher is None:
        import torch

        module = gates_of(bundle.kind)

        checkpoint = Checkpoint.open(resolve_checkpoint(bundle, checkpoint))
        if checkpoint.hash != bundle.info.source_hash:
            raise VibeVoiceError(f"{checkpoint.root}: is not the checkpoint this bundle was built from (its hash differs)")
        with torch.no_grad():
            gates, info = module.run_gates(bundle, checkpoint, voice, log, limits)
        judged_by = {"checkpoint": str(checkpoint.root.resolve()), "reference": "fp32 PyTorch (transformers modules), CPU"}
    else:
        fp32 = teacher_bundle(bundle, Path(teacher))
        require_room(sum(fp32.weight_bytes(name) for name in fp32.info.graphs),
                     f"{bundle.path} ({bundle.kind} {bundle.info.precision})")
        module = gates_of(bundle.kind)
        gates, info = module.run_teacher_gates(bundle, fp32, voice, log, limits)
        judged_by = {"checkpoint": bundle.info.source_path, "reference": TEACHER_REFERENCE,
                     "teacher": {"bundle": str(fp32.path.resolve()), "graphs": fp32.info.tools.get("graphs"),
                                 "files_sha256": {name: record.get("sha256") for name, record in
                                                  sorted((fp32.info.files or {}).items()) if name.endswith(".onnx")}}}
    record = {
        "verified_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **judged_by,
        "precision": bundle.info.precision,
        "thresholds": {**limits.describe(), "same_arithmetic": SAME_ARITHMETIC.describe(),
                       "batched": BATCHED.describe(), "silent_rms": SILENT_RMS, "silent_max_abs": SILENT_MAX_ABS},
        **({} if bundle.info.precision == "fp32" else {"caveat": RANDOM_WEIGHTS_CAVEAT}),
        "loops": LOOP_REASONS,
        **info,
        "passed": all(g.passed for g in gates),
        "gates": [asdict(g) for g in gates],
    }
    try:
        write_manifest(bundle.path, dict(bundle.info.to_dict(), parity=record), "recording the results")
    except VibeVoiceError as e:
        record["not_recorded"] = str(e)
    return record




TEACHER_REFERENCE = ("fp32 ONNX graphs of the same checkpoint (the teacher: written from its safetensors without "
                     "PyTorch, held operator for operator to the traced export in tests/test_writer.py), CPU")


def require_room(weight_bytes: int, judged: str) -> None:
    """One sentence, before anything is built or run, where the teacher (fp32 graphs of `weight_bytes`, resident
    for each of its phases) does not fit in the memory this machine has available now."""
    available = available_memory()
    if available is not None and weight_bytes * MEMORY_ROOM > available:
        raise VibeVoiceError(
            f"judging {judged} without PyTorch holds its fp32 teacher in memory, about {weight_bytes * MEMORY_ROOM / 1e9:.1f} GB "
            f"with what runs beside it, and this machine has {available / 1e9:.1f} GB available: with the export "
            "extra (pip install 'vibevoice-onnx[export]') it is judged against the PyTorch reference, whose LM "
            "layers are read from the shards as they run")


def teacher_bundle(bundle: Bundle, path: Path) -> Bundle:
    """The fp32 bundle `path` as the teacher of `bundle`: the same checkpoint (by its hash), kind and device, both
    of the default profile (the teacher gates call the default profile's graphs)."""
    teacher = Bundle(path)
    ours, theirs = bundle.info, teacher.info
    if "fixed" in (bundle.profile, teacher.profile):
        raise VibeVoiceError(f"{bundle.path if bundle.profile == 'fixed' else path}: is a fixed-shape bundle, and those "
                             "are judged against the PyTorch reference only so far (pip install 'vibevoice-onnx[export]')")
    if theirs.precision != "fp32":
        raise VibeVoiceError(f"{path}: is a {theirs.precision} bundle; the teacher must be an fp32 bundle")
    if theirs.source_hash != ours.source_hash or teacher.kind != bundle.kind or theirs.device != ours.device:
        raise VibeVoiceError(f"{path}: was not built from the checkpoint {bundle.path} was built from (or is "
                             "another kind or device), so it cannot be its teacher")
    if theirs.parity and not theirs.parity.get("passed"):
        raise VibeVoiceError(f"{path}: failed its own gates, so it cannot be a teacher")
    return teacher


def sibling_teacher(bundle_dir: Path) -> Path:
    """The fp32 bundle beside a bundle (KIND/DEVICE_fp32), the teacher `verify` takes without torch."""
    bundle = Bundle(Path(bundle_dir))
    candidate = Path(bundle_dir).parent / f"{bundle.info.device}_fp32"
    if not (candidate / "manifest.json").is_file():
        raise VibeVoiceError(f"{bundle_dir}: verifying without PyTorch needs the fp32 bundle of the same checkpoint "
                             f"beside it as the teacher ({candidate}: build it with `vibevoice-onnx build CHECKPOINT "
                             "--precision fp32`), or pass --teacher")
    return candidate
