"""The gates of a realtime bundle against its fp32 reference: PyTorch's modules, or, without torch, the fp32
graphs written from the same checkpoint (the teacher: run_teacher_gates).

Per graph on realistic inputs (LM caches from real prefills, head conditions from real LM outputs), KV
incremental decode against a full prefill, streaming decode against whole decode, and the closed loop: the
whole generation run by the torch-free runtime and by the reference with the same noise. The loops take the
reference as a backend of the generation loop (generation/realtime.py), so the same gates judge a bundle against
either reference; the module imports torch only where PyTorch's side is asked for.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

from ..checkpoints.checkpoint import Checkpoint
from ..families import family
from ..generation.common import Teacher
from ..generation.realtime import FrameDecoder, GenerationResult, GuidedStreams, eos_fires, realtime_frames
from ..runtime.bundle import Bundle
from ..runtime.lm import OnnxDiffusionHead, OnnxLm, StreamingConv
from ..runtime.realtime import DECODE_GROUP, OnnxRealtimeBackend, RealtimeBatch, backend_for
from ..sampling import NoiseSource
from ..text import encode_tts_text
from ..voices import VoicePrompt
from .calibration import EOS, StepError, calibrated_gates, perturbed_runs
from .judge import BATCH_LATE_AFTER, BATCHED, SEED, Gate, Limits, batched_and_alone, bound_gate, compare, forced_gates, replay_gate
from .teacher import Resident, decode_each, held

CLOSED_LOOP_TEXT = (
    "The quick brown fox jumps over the lazy dog. Speech synthesis turns written text into spoken audio, "
    "one frame at a time."
)
CLOSED_LOOP_FRAMES = 18  # three speech windows, interleaved with the first three text windows
CFG_SCALE, STEPS = family("realtime").defaults.cfg_scale, family("realtime").defaults.steps  # upstream's defaults


def batched_guidance(model, runtime: OnnxRealtimeBackend, probe, limits: Limits) -> Gate:
    """The runtime's batch-2 CFG streams (one cache, rows of their own lengths) against the same graph run as
    two separate streams, each with the growing cache of before: batching and the in-place cache must change
    nothing, at any precision (the graph's own error is the per-graph gates' matter)."""
    from .common import cache_layers, cfg_steps, prefilled

    positive = cache_layers(prefilled(model.tts_language_model, probe, 9))
    negative = cache_layers(prefilled(model.tts_language_model, probe, 2))
    ours = runtime.guided_streams(positive, negative)
    separate = GuidedStreams(*(runtime.stream("upper_lm", layers, in_place=False) for layers in (positive, negative)))
    return compare("upper_lm: batched CFG streams == separate streams", *cfg_steps(ours, separate, probe), limits.same_path)


def graph_gates(bundle: Bundle, model, runtime: OnnxRealtimeBackend, log, limits: Limits) -> list[Gate]:
    """Each graph against the reference module it came from, then the KV, streaming and batching gates."""
    import torch
    from transformers.cache_utils import DynamicCache

    from .common import Probe, decoder_gates, head_gate, lm_gates, lm_step, module_gate

    probe = Probe(lambda ids: model.embed_text(torch.from_numpy(ids)).numpy(), model.dims.lm.vocab)
    latent = model.dims.head.latent
    log("  per-graph gates")
    gates = lm_gates("lower_lm", model.language_model, runtime.lms["lower_lm"], probe, limits, ((7, 5),))
    gates += lm_gates("upper_lm", model.tts_language_model, runtime.lms["upper_lm"], probe, limits)
    conditions = lm_step(model.tts_language_model, probe.tokens(4), np.arange(4)[None], DynamicCache())[0]
    gates.append(head_gate(model.diffusion_head, runtime.velocity, conditions, probe, limits.graph))
    gates.append(module_gate("acoustic_connector", model.acoustic_connector, runtime.connect, probe.normal(1, 4, latent),
                             limits.graph))
    eos = runtime.sessions["eos_classifier"]
    gates.append(module_gate("eos_classifier", model.eos_classifier, lambda h: eos.run(None, {"hidden_states": h})[0],
                             conditions, limits.graph))
    gates += decoder_gates(model.acoustic_decoder, runtime.decoder, runtime.unscale(probe.normal(1, 8, latent)), limits)
    gates.append(batched_guidance(model, runtime, probe, limits))
    return gates


DECODER = "acoustic_decoder_stream"
LOOP_GRAPHS = ("lower_lm", "upper_lm", "diffusion_head_conditioning", "diffusion_head_step", "acoustic_connector",
               "eos_classifier")  # a loop's graphs but the decoder
PROMPT_GRAPHS = ("lower_lm", "upper_lm", "acoustic_connector")  # what backend_prompt runs


class Partial(OnnxRealtimeBackend):
    """A realtime bundle's backend with only `graphs` opened (the others never are)."""

    def __init__(self, bundle: Bundle, graphs: tuple[str, ...]):
        self.wanted = set(graphs)
        super().__init__(bundle)

    def open_graphs(self, bundle: Bundle) -> None:
        self.max_positions = bundle.dims.tts_lm.max_positions
        self.sessions = {name: bundle.session(name) for name in bundle.info.graphs if name in self.wanted}
        self.lms = {name: OnnxLm(bundle, name) for name in ("lower_lm", "upper_lm") if name in self.wanted}
        heads = {"diffusion_head_conditioning", "diffusion_head_step"}
        self.head = OnnxDiffusionHead(bundle) if heads <= self.wanted else None
        self.decoder = StreamingConv(bundle, DECODER) if DECODER in self.wanted else None


class LoopOnly(Partial):
    """A bundle's loop without its decoder resident: each frame's audio is left silent and decoded afterwards
    (decode_recorded), frame by frame from zero states, as the loop decodes one frame a call: the same calls on
    the same latents, so the same samples."""

    def __init__(self, bundle: Bundle):
        self.hop = bundle.dims.acoustic_decoder.hop
        super().__init__(bundle, LOOP_GRAPHS)

    def new_decoder_state(self):
        return None

    def decode_frames(self, latent, state):
        return np.zeros(latent.shape[1] * self.hop, np.float32), state


def decode_recorded(backend: OnnxRealtimeBackend, results: list[GenerationResult]) -> None:
    """The audio of loops run by LoopOnly, decoded now by `backend` (the bundle's decoder alone)."""
    for result in results:
        state, chunks = backend.new_decoder_state(), []
        for latent in result.latents:
            audio, state = backend.decode_frames(backend.unscale(latent[None, None]), state)
            chunks.append(audio)
        result.chunks[:] = chunks


class Always(Resident):
    """A reference or runtime kept resident throughout, with a loop's phase too (the same object)."""

    def __init__(self, backend):
        super().__init__(backend)
        self.latent = (backend.bundle if hasattr(backend, "bundle") else backend).dims.head.latent

    @contextlib.contextmanager
    def loop(self, results: list):
        yield self.backend


class OneAtATime:
    """A bundle whose graphs are opened for the phase that runs them and released after it, so that a teacher
    and a student are never both resident for the whole model: a loop's phase holds every graph but the decoder
    (LoopOnly; the runs' audio is decoded when it ends, with the decoder alone), the runtime's phase the whole
    bundle, a per-graph gate one graph of each."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.latent = Bundle(self.path).dims.head.latent

    @contextlib.contextmanager
    def loop(self, results: list):
        with held(LoopOnly(Bundle(self.path))) as backend:
            yield backend
        with held(Partial(Bundle(self.path), (DECODER,))) as decoder:
            decode_recorded(decoder, results)

    def whole(self):
        return held(OnnxRealtimeBackend(Bundle(self.path)))

    def graphs(self, names: tuple[str, ...]):
        return held(Partial(Bundle(self.path), names))


def resident(reference) -> Always | OneAtATime:
    return reference if isinstance(reference, OneAtATime) else Always(reference)


def closed_loop(reference, runtime: OnnxRealtimeBackend, prompt: VoicePrompt, ids: list[int],
                limits: Limits, seed: int = SEED, frames: int = CLOSED_LOOP_FRAMES,
                runs: dict | None = None) -> tuple[list[Gate], dict]:
    """The whole generation, `frames` long in every run: EOS is decided every frame but not acted on, so the
    gates judge agreement however early a (random) checkpoint would stop. The runtime runs it twice:
    teacher-forced (the reference's latents fed back: one step of its error per frame, judged by `limits`)
    and free (its own latents fed back), judged against the reference run again with that one-step error
    (verify.calibration). `runs`, when given, receives the runs (free, reference, perturbed, error) for a
    caller that judges the free run further. `reference`: PyTorch's RealtimeModel, a backend, or a bundle held
    one phase at a time (OneAtATime); `runtime`: a backend, or OneAtATime."""
    reference, runtime = resident(reference), resident(runtime)
    noise = NoiseSource.from_seed(seed, reference.latent)
    made: list[GenerationResult] = []
    with reference.loop(made) as teacher:
        made.append(reference_loop(teacher, prompt, ids, noise, frames, GenerationResult(conditions=[])))
    reference_run, ours, forced = made[0], GenerationResult(), GenerationResult(conditions=[])
    with runtime.whole() as student:
        for _ in realtime_frames(student, prompt, ids, noise, CFG_SCALE, STEPS, frames, ours, stop_on_eos=False):
            pass
        for _ in realtime_frames(student, prompt, ids, noise, CFG_SCALE, STEPS, frames, forced,
                                 steering=Teacher(reference_run.latents)):
            pass
    windows = -(-len(ids) // 5)
    detail = (f"{frames} frames, {min(windows, -(-frames // 6))} text windows, cfg {CFG_SCALE}, {STEPS} steps, "
              f"seed {seed}")
    forced_loop, forced_curves = forced_gates("closed loop", forced, reference_run, detail, limits)
    forced_eos, _ = eos_agreement("closed loop, teacher-forced", forced, reference_run, limits.decision_floor)
    error = StepError.measure(forced, reference_run, EOS)
    perturbed: list[GenerationResult] = []
    with reference.loop(perturbed) as teacher:
        perturbed += perturbed_runs(lambda steering: reference_loop(teacher, prompt, ids, noise, frames,
                                                                    steering=steering), error)
    gates, calibration = calibrated_gates("closed loop", ours, reference_run, perturbed, error, EOS, detail)
    if runs is not None:
        runs.update(free=ours, reference=reference_run, perturbed=perturbed, error=error)
    with runtime.whole() as student:
        gates += [*forced_loop, forced_eos, grouped_decode_gate(student, ours, DECODE_GROUP, limits)]
    eos_logits = {name: [round(float(x), 5) for x in run.eos_logits]
                  for name, run in (("reference", reference_run), ("free_running", ours), ("teacher_forced", forced))}
    info = {"eos_frame_reference": reference_run.eos_frame, "eos_frame_runtime": ours.eos_frame}
    return gates, {"frames": frames, "text_tokens": len(ids), "seed": seed, **info, "calibration": calibration,
                   "teacher_forced": forced_curves, "eos_logits": eos_logits}


def reference_loop(model, prompt: VoicePrompt, ids: list[int], noise: NoiseSource,
                   frames: int = CLOSED_LOOP_FRAMES, result: GenerationResult | None = None,
                   steering=None) -> GenerationResult:
    """The closed loop as the reference runs it: `frames` long, EOS recorded every frame, not acted on. `model`:
    PyTorch's RealtimeModel, or a backend (the teacher's fp32 graphs) running the same loop."""
    if not hasattr(model, "velocity"):
        from ..reference.realtime import generate

        return generate(model, prompt, ids, noise, cfg_scale=CFG_SCALE, steps=STEPS, max_frames=frames,
                        stop_on_eos=False, result=result, steering=steering)
    result = GenerationResult() if result is None else result
    for _ in realtime_frames(model, prompt, ids, noise, CFG_SCALE, STEPS, frames, result, stop_on_eos=False,
                             steering=steering):
        pass
    return result


def grouped_decode_gate(runtime: OnnxRealtimeBackend, frame_by_frame: GenerationResult, group: int,
                        limits: Limits) -> Gate:
    """The loop's latents decoded as `speak` decodes them (the first alone, then groups) == frame by frame."""
    grouped = GenerationResult()
    decoder = FrameDecoder(runtime, grouped, group)
    for z in frame_by_frame.latents:
        decoder.add(z)
    decoder.flush()
    return compare(f"decoder: first frame alone, then groups of {group} == frame by frame", [grouped.audio],
                   [frame_by_frame.audio], limits.same_path, f"{frame_by_frame.frames} frames of the closed loop")


def eos_agreement(label: str, runtime: GenerationResult, reference: GenerationResult, floor: float) -> tuple[Gate, dict]:
    """Per-frame EOS decisions agree wherever the reference logit is clear of the noise floor."""
    ours, theirs = runtime.eos_logits, reference.eos_logits
    decided = [i for i, logit in enumerate(theirs) if abs(logit) > floor]
    disagree = [i for i in decided if i < len(ours) and eos_fires(ours[i]) != eos_fires(theirs[i])]
    diff = max((abs(a - b) for a, b in zip(ours, theirs)), default=0.0)
    info = {"eos_frame_reference": reference.eos_frame, "eos_frame_runtime": runtime.eos_frame}
    passed = len(ours) == len(theirs) and not disagree
    detail = (f"{len(decided)} of {len(theirs)} frames clear of the ±{floor} noise floor, "
              f"{len(disagree)} disagree{' (frames ' + ', '.join(map(str, disagree[:10])) + ')' if disagree else ''}; "
              f"EOS would first fire after frame {info['eos_frame_runtime']} (runtime) / {info['eos_frame_reference']} "
              f"(reference); max |Δ eos logit| {diff:.2e}")
    return Gate(f"{label}: per-frame EOS decisions agree", None, diff, passed, detail), info


def verification_prompt(bundle: Bundle, model, voice: str | None) -> tuple[VoicePrompt, str]:
    """A bundle voice when asked for, else a prompt the reference computes from this very checkpoint.

    The default matters on synthetic checkpoints: a real preset's caches in a random-weight model make the
    loop chaotic (a 1e-4 nudge of one frame's noise grows ~3x per frame), which would measure the model, not
    the port. A prompt from the model's own forward pass keeps the loop as stable as the model is.
    """
    if voice is not None:
        return bundle.voice(voice), voice
    return reference_prompt(model, bundle.tokenizer), "(computed by the reference)"


def reference_prompt(model, tokenizer, text: str = "A voice prompt.\n") -> VoicePrompt:
    """A voice prompt computed from `text` by the reference (PyTorch's model, a backend, or a bundle held one
    phase at a time: backend_prompt)."""
    if isinstance(model, OneAtATime):
        with model.graphs(PROMPT_GRAPHS) as backend:
            return backend_prompt(backend, tokenizer, text)
    if hasattr(model, "velocity"):
        return backend_prompt(model, tokenizer, text)
    from ..reference.presets import as_voice_prompt, prompt_from_text

    return as_voice_prompt(prompt_from_text(model, tokenizer, text))


PROMPT_SPEECH_FRAMES = 8  # as reference.presets writes synthetic presets


def backend_prompt(backend: OnnxRealtimeBackend, tokenizer, text: str, seed: int = 0) -> VoicePrompt:
    """reference.presets.compute_prompt on a backend's graphs: the text through the lower LM, the same positions
    (text type) and a few random latents (speech type) through the upper LM, one `<|image_pad|>` (speech type)
    through the upper LM for the negative stream."""
    dims = backend.bundle.dims
    ids = tokenizer.encode(text, add_special_tokens=False).ids

    def stream(name: str, lm):
        empty = np.zeros((1, lm.kv_heads, 0, lm.head_dim), np.float32)
        return backend.stream(name, [(empty, empty)] * lm.layers, in_place=False)

    lower, upper, negative = stream("lower_lm", dims.lm), stream("upper_lm", dims.tts_lm), stream("upper_lm", dims.tts_lm)
    text_hidden = lower.step(backend.embed_text(ids)) + backend.type_embedding(1)
    latents = np.random.default_rng(seed).standard_normal((1, PROMPT_SPEECH_FRAMES, dims.head.latent)).astype(np.float32)
    hidden = upper.step(np.concatenate([text_hidden, backend.connect(latents) + backend.type_embedding(0)], axis=1))
    pad = backend.embed_text([tokenizer.token_to_id("<|image_pad|>")]) + backend.type_embedding(0)
    negative_hidden = negative.step(pad)

    def layers(lm_stream) -> list:
        filled = lm_stream.cache.filled(0)
        return [(filled[2 * i].copy(), filled[2 * i + 1].copy()) for i in range(len(filled) // 2)]

    return VoicePrompt(lm=layers(lower), tts_lm=layers(upper), neg_tts_lm=layers(negative),
                       neg_condition=negative_hidden[0, -1].copy(), tts_condition=hidden[0, -1].copy())


BATCH_GATE_VOICES = ("A voice prompt.\n", "Another voice, with a longer prompt of its own.\n", "Third.\n")
BATCH_GATE_FRAMES = (CLOSED_LOOP_FRAMES, 12, 9)
BATCH_GATE_TEXTS = (CLOSED_LOOP_TEXT, "A shorter text for the second stream.", "The third joins late.")


def batch_jobs(model, tokenizer) -> list[tuple]:
    """The batch gate's three streams: (prompt computed by the reference, text ids, frames, seed)."""
    return [(reference_prompt(model, tokenizer, voice), encode_tts_text(tokenizer, text), frames, SEED + k)
            for k, (voice, text, frames) in enumerate(zip(BATCH_GATE_VOICES, BATCH_GATE_TEXTS, BATCH_GATE_FRAMES))]


def batched_streams(model, runtime: OnnxRealtimeBackend, tokenizer, jobs: list[tuple] | None = None) -> Gate:
    """Three streams of different voices, texts and lengths batched on one model (the third joining after
    the first has made three frames) against each run alone: latents and audio the same (cosine 0.99999),
    the same EOS decision at every frame. Batching must change nothing, at any precision. `jobs`: batch_jobs
    made before (by a reference no longer resident)."""
    jobs = batch_jobs(model, tokenizer) if jobs is None else jobs
    latent = runtime.bundle.dims.head.latent

    def run(backend, job, result):
        prompt, ids, frames, seed = job
        noise = NoiseSource.from_seed(seed, latent)
        return realtime_frames(backend, prompt, ids, noise, CFG_SCALE, STEPS, frames, result, stop_on_eos=False,
                               decode_group=DECODE_GROUP)

    batch = RealtimeBatch(runtime, len(jobs))
    alone, batched = batched_and_alone(runtime, batch, jobs, run, GenerationResult)
    decisions = all([eos_fires(x) for x in a.eos_logits] == [eos_fires(x) for x in b.eos_logits]
                    for a, b in zip(batched, alone))
    gate = compare("batched streams == separate streams", [r.latents for r in batched] + [r.audio for r in batched],
                   [r.latents for r in alone] + [r.audio for r in alone], BATCHED,
                   f"3 streams of {'/'.join(map(str, BATCH_GATE_FRAMES))} frames, the third joining at the first's "
                   f"frame {BATCH_LATE_AFTER}; largest batch {max(batch.batcher.batches['lm_step'])}")
    gate.passed &= decisions and [r.frames for r in batched] == [r.frames for r in alone]
    return gate


EOS_WEIGHT, EOS_BIAS = "tts_eos_classifier.fc2.weight", "tts_eos_classifier.fc2.bias"


def eos_hovering_copy(checkpoint: Path, out: Path, spread: float = 0.5) -> np.ndarray:
    """A copy of a realtime checkpoint whose EOS logits along verify's closed loop (default prompt) are centred
    on zero with standard deviation `spread`, as a trained model's hover around the decision near the end of
    speech: a gate must judge such a checkpoint on its bundle's error, not on which side of zero each frame of
    a diverged generation lands. Only the EOS classifier's output layer changes (logit -> a·logit + b, in its
    stored dtype). Returns the new logits, as the reference computes them from the written copy."""
    from ..checkpoints.files import edited_copy
    from ..reference.loading import load_realtime
    from ..text import load_tokenizer

    def closed_loop_logits(root: Path) -> np.ndarray:
        model = load_realtime(root)
        tokenizer = load_tokenizer(root / "tokenizer.json")
        result = reference_loop(model, reference_prompt(model, tokenizer), encode_tts_text(tokenizer, CLOSED_LOOP_TEXT),
                                NoiseSource.from_seed(SEED, model.dims.head.latent))
        return np.array(result.eos_logits)

    import torch

    with torch.no_grad():
        logits = closed_loop_logits(checkpoint)
    scale, centre = spread / max(float(logits.std()), 1e-6), float(logits.mean())
    edited_copy(checkpoint, out, {EOS_WEIGHT: lambda weight: weight * scale,
                                  EOS_BIAS: lambda bias: (bias - centre) * scale})
    with torch.no_grad():
        return closed_loop_logits(out)


def run_gates(bundle: Bundle, checkpoint: Checkpoint, voice: str | None, log, limits: Limits) -> tuple[list[Gate], dict]:
    from ..reference.loading import load_realtime

    model = load_realtime(checkpoint)
    prompt, voice = verification_prompt(bundle, model, voice)
    ids = encode_tts_text(bundle.tokenizer, CLOSED_LOOP_TEXT)
    bound = bound_gate(bundle, bound_loop(prompt, ids), f"{BOUND_FRAMES} frames of the closed loop: latents, audio, EOS logits")
    if bundle.profile == "fixed":
        from . import realtime_fixed

        gates, info = realtime_fixed.run_gates(bundle, model, prompt, ids, log, limits, closed_loop)
        if bundle.placement.device == "cuda":  # static shapes: captured once as CUDA graphs, replayed per call
            gates.append(replay_gate(bundle, bound_loop(prompt, ids), f"{BOUND_FRAMES} frames of the closed loop"))
        return gates + [bound], {**info, "closed_loop": {**info["closed_loop"], "voice": voice}}
    runtime = OnnxRealtimeBackend(bundle)
    gates = graph_gates(bundle, model, runtime, log, limits)
    log("  closed loop: the whole generation, runtime vs reference")
    loop, loop_info = closed_loop(model, runtime, prompt, ids, limits)
    log("  batched streams against each alone")
    return gates + loop + [batched_streams(model, runtime, bundle.tokenizer), bound], {"closed_loop": {**loop_info, "voice": voice}}


def teacher_graph_gates(teacher: OneAtATime, runtime: OneAtATime, prompt: VoicePrompt, limits: Limits,
                        seed: int = 0) -> list[Gate]:
    """Each graph of the bundle against the same graph of the teacher (the fp32 graphs written from the same
    checkpoint), on the same realistic inputs, one graph of each resident at a time: both LMs continuing the
    verification prompt's caches with a 7-token prefill and 3 steps, the head on the upper LM's hidden states,
    the connector and EOS classifier, the decoder streaming 3 frames from zero states (their audio and its
    states, as the gate against PyTorch)."""
    rng = np.random.default_rng(seed)
    dims = Bundle(teacher.path).dims
    with teacher.graphs(()) as embedder:
        tokens = embedder.embed_text(rng.integers(0, dims.lm.vocab, 7))

    def lm_calls(backend, name: str, layers) -> list[np.ndarray]:
        stream = backend.stream(name, layers, in_place=False)
        return [stream.step(tokens)] + [stream.step(tokens[:, i:i + 1]) for i in range(3)]

    def both(graphs: tuple[str, ...], call) -> tuple[list, list]:
        with teacher.graphs(graphs) as theirs, runtime.graphs(graphs) as ours:
            return call(theirs), call(ours)

    gates, detail, conditions = [], "7-token prefill then 3 steps after the verification prompt's cache", None
    for name, layers in (("lower_lm", prompt.lm), ("upper_lm", prompt.tts_lm)):
        reference, ours = both((name,), lambda b: lm_calls(b, name, layers))
        gates.append(compare(f"{name}: against the teacher's graph", ours, reference, limits.graph, detail))
        conditions = reference[0][0]  # at the end, the upper LM's hidden states
    noisy = rng.standard_normal((len(conditions), dims.head.latent)).astype(np.float32)
    timesteps = np.linspace(999, 100, len(conditions)).round().astype(np.float32)
    latents = rng.standard_normal((1, 4, dims.head.latent)).astype(np.float32)
    calls = {
        "diffusion_head": (("diffusion_head_conditioning", "diffusion_head_step"),
                           lambda b: [b.velocity(noisy, timesteps, conditions)]),
        "acoustic_connector": (("acoustic_connector",), lambda b: [b.connect(latents)]),
        "eos_classifier": (("eos_classifier",),
                           lambda b: [b.sessions["eos_classifier"].run(None, {"hidden_states": conditions})[0]]),
        "acoustic_decoder_stream (3 frames, states)": ((DECODER,), lambda b: decode_each(b, b.unscale(latents[:, :3]))),
    }
    for name, (graphs, call) in calls.items():
        reference, ours = both(graphs, call)
        gates.append(compare(f"{name}: against the teacher's graph", ours, reference, limits.graph))
    return gates


def run_teacher_gates(bundle: Bundle, teacher: Bundle, voice: str | None, log, limits: Limits) -> tuple[list[Gate], dict]:
    """The gates without torch: the bundle against `teacher`, the fp32 graphs written from the same checkpoint,
    as run_gates judges it against PyTorch (each graph, the closed loop with its calibration, batched streams,
    the bound path); the verification prompt computed by the teacher from text unless a voice is named. Teacher
    and bundle are held one phase at a time (OneAtATime): never both whole."""
    reference, runtime = OneAtATime(teacher.path), OneAtATime(bundle.path)
    if voice is None:
        prompt, voice = reference_prompt(reference, bundle.tokenizer), "(computed by the teacher)"
    else:
        prompt = bundle.voice(voice)
    ids = encode_tts_text(bundle.tokenizer, CLOSED_LOOP_TEXT)
    log("  per-graph gates against the teacher's graphs")
    gates = teacher_graph_gates(reference, runtime, prompt, limits)
    log("  closed loop: the whole generation, bundle vs teacher")
    loop, loop_info = closed_loop(reference, runtime, prompt, ids, limits)
    log("  batched streams against each alone")
    jobs = batch_jobs(reference, bundle.tokenizer)
    with runtime.whole() as student:
        batched = batched_streams(reference, student, bundle.tokenizer, jobs)
    bound = bound_gate(bundle, bound_loop(prompt, ids), f"{BOUND_FRAMES} frames of the closed loop: latents, audio, EOS logits")
    return gates + loop + [batched, bound], {"closed_loop": {**loop_info, "voice": voice}}


BOUND_FRAMES = 8


def bound_loop(prompt: VoicePrompt, ids: list[int]):
    """BOUND_FRAMES frames of the closed loop on a backend of the bundle given (verify.common.bound_gate)."""
    def run(bundle: Bundle) -> list[np.ndarray]:
        result, noise = GenerationResult(), NoiseSource.from_seed(SEED, bundle.dims.head.latent)
        for _ in realtime_frames(backend_for(bundle), prompt, ids, noise, CFG_SCALE, STEPS, BOUND_FRAMES, result,
                                 stop_on_eos=False, decode_group=DECODE_GROUP):
            pass
        return [np.stack(result.latents), result.audio, np.array(result.eos_logits)]

    return run
