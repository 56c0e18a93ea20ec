"""The gates of a VibeVoice-1.5B or Large bundle against its fp32 reference: transformers' own modules, or,
without torch, the fp32 graphs written from the same checkpoint (the teacher: run_teacher_gates).

Per graph on realistic inputs; KV incremental == prefill; the semantic encoder fed chunk by chunk == one
pass; streamed decode == whole decode; the speculative batched CFG streams == upstream's separate streams;
and two closed loops over a two-speaker script with mean voice latents and the same noise in both: one with
a forced token schedule of several speech segments (so every checkpoint, whatever its LM would pick, runs
the segment logic: negative-stream restarts, conv states zeroed), gating latents, audio and the LM's own
picks; one free-running, gating the token sequence itself. Each is judged teacher-forced against absolute
limits and free-running against the loop's own spread (verify.calibration). The module imports torch only
where PyTorch's side is asked for.
"""

from __future__ import annotations

import math

import numpy as np

from ..audio import SAMPLE_RATE, db_normalize
from ..checkpoints.checkpoint import Checkpoint
from ..families import family
from ..generation.common import Teacher
from ..generation.tts15b import LongFormResult, SeparateStreams, TokenIds, long_form_frames, prompt_embeddings
from ..runtime.bundle import Bundle
from ..runtime.device import host
from ..runtime.lm import KvCache
from ..runtime.tts15b import LongFormBatch, OnnxTts15bBackend
from ..sampling import NoiseSource
from ..script import build_prompt, parse_script
from .calibration import StepError, calibrated_gates, perturbed_runs, picks
from .judge import (
    BATCH_LATE_AFTER, BATCHED, SEED, Gate, Limits, Probe, Tolerance, batched_and_alone, bound_gate, compare,
    forced_gates, lm_self_gates, streamed_decode_gate,
)
from .teacher import Phased, Resident, against_teacher, decode_each

CLOSED_LOOP_SCRIPT = (
    "Speaker 1: The quick brown fox jumps over the lazy dog.\n"
    "Speaker 2: Speech synthesis turns written text into spoken audio.\n"
    "Speaker 1: One latent at a time, for a long conversation."
)
SEGMENT_LATENTS, SEGMENTS = 8, 3  # the forced schedule: three speech segments of eight latents
FREE_STEPS = 12  # steps of the free-running loop
CFG_SCALE, STEPS = family("1.5b").defaults.cfg_scale, family("1.5b").defaults.steps  # upstream's demo


def synthetic_voices() -> list[np.ndarray]:
    """Two deterministic voice-like signals (harmonics with vibrato and breath noise), 2.3 s and 1.7 s long:
    neither a whole number of 3200-sample frames, so the encoder's padding is exercised."""
    voices = []
    for seconds, pitch, seed in ((2.3, 140.0, 1), (1.7, 210.0, 2)):
        t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
        phase = 2 * np.pi * pitch * t + 3.0 * np.sin(2 * np.pi * 5.0 * t)
        signal = sum(np.sin(k * phase) / k for k in range(1, 6)) * (0.6 + 0.4 * np.sin(2 * np.pi * 2.0 * t))
        signal += 0.05 * np.random.default_rng(seed).standard_normal(len(t))
        voices.append(db_normalize(signal.astype(np.float32)))
    return voices


def forced_segments(ids: TokenIds):
    """start is in the prompt; then [pad × 8, end, start] × 3 without the last end/start, then EOS."""
    segment = [ids.pad] * SEGMENT_LATENTS
    schedule = ([*segment, ids.end, ids.start] * SEGMENTS)[:-2] + [ids.eos]
    return lambda step, greedy: schedule[step] if step < len(schedule) else ids.eos


class OnnxSeparateStreams(SeparateStreams):
    """Upstream's separate CFG streams (the reference's logic) on the bundle's own LM graph: what the
    runtime's speculative batched streams must equal, at any precision."""

    def __init__(self, runtime: OnnxTts15bBackend):
        super().__init__(runtime.lm)

    def new_cache(self):
        return KvCache(self.lm, in_place=False)  # each stream its own growing cache, as before the in-place one

    def forward(self, embeds, cache, start):
        hidden, present = self.lm.unbatched(embeds, np.arange(start, start + embeds.shape[1])[None], cache)
        return hidden[:, -1], present


def guided_streams_gate(runtime: OnnxTts15bBackend, probe: Probe, limits: Limits) -> Gate:
    """The runtime's speculative batch-2 CFG streams against upstream's separate streams on the same graph,
    through the cases the loop meets: the negative right after the prompt, a pick that is not speech
    (speculation dropped) followed by speech, a restart of the negative stream, and speech steps. A new path against the old
    one: the LM itself is gated against the reference by lm_gates and the closed loops."""
    ours, theirs = runtime.guided_lm(), OnnxSeparateStreams(runtime)
    prompt = probe.tokens(9)
    outputs, references = [ours.prefill(prompt)], [theirs.prefill(prompt)]
    outputs.append(ours.negative(prompt[:, -1:]))
    references.append(theirs.negative(prompt[:, -1:]))
    for kind in ("speech", "other", "speech", "restart", "speech", "speech"):  # a restart would hide a bad drop
        embed = probe.tokens(1)
        if kind == "restart":
            ours.restart_negative()
            theirs.restart_negative()
        outputs.append(ours.positive(embed))
        references.append(theirs.positive(embed))
        if kind != "other":
            outputs.append(ours.negative(embed))
            references.append(theirs.negative(embed))
    return compare("lm: speculative batched CFG streams == separate streams", outputs, references, limits.same_path)


def voice_batch(probe: Probe, hop: int) -> np.ndarray:
    """Two voices of 2.4 and 1.7 frames in one zero-padded batch [2, 1, N], as upstream pads a batch."""
    audio = probe.normal(2, 1, int(2.4 * hop)) * 0.1
    audio[1, :, int(1.7 * hop):] = 0.0
    return audio


def encoder_gates(reference, runtime: OnnxTts15bBackend, probe: Probe, limits: Limits) -> list[Gate]:
    """The acoustic encoder on a zero-padded batch of two lengths (upstream's padding), the streaming
    semantic encoder (chunks and states) against the reference, and streamed chunks == one pass."""
    from ..reference.modules import ConvState, UpstreamPadding, as_tensor, conv_state_specs

    hop = reference.dims.semantic_encoder.hop
    audio = voice_batch(probe, hop)
    encoded = reference.acoustic_encoder(as_tensor(audio), padding_cache=UpstreamPadding()).latents.numpy()
    gates = [compare("acoustic_encoder (batch of 2, 2.4 frames)", [runtime.encode_voices(audio)], [encoded], limits.graph)]
    chunks = probe.normal(1, 1, 4 * hop) * 0.1
    state, ours_state = ConvState.zeros(conv_state_specs(reference.semantic_encoder)), runtime.new_semantic_state()
    outputs, references = [], []
    for i in range(4):
        chunk = chunks[:, :, i * hop : (i + 1) * hop]
        ours, ours_state = runtime.semantic.run(chunk, ours_state)
        outputs.append(ours)
        references.append(reference.semantic_encoder(as_tensor(chunk), padding_cache=state).latents.numpy())
    gates.append(compare("semantic_encoder_stream (4 chunks, states)", outputs + [host(v) for v in ours_state],
                         references + [state.tensors[s["name"]].numpy() for s in runtime.semantic.states], limits.graph))
    whole = reference.semantic_encoder(as_tensor(chunks)).latents.numpy()
    gates.append(compare("semantic encoder: 4 streamed chunks == one pass", [np.concatenate(outputs, axis=1)], [whole],
                         limits.same_path))
    return gates


def graph_gates(bundle: Bundle, reference, runtime: OnnxTts15bBackend, log, limits: Limits) -> list[Gate]:
    """Each graph against PyTorch's module (`reference`: reference.tts15b.Tts15bReference), and the runtime's own
    paths."""
    import torch
    from transformers.cache_utils import DynamicCache

    from .common import decoder_gates, head_gate, lm_gates, lm_step, module_gate

    dims, parts = reference.dims, reference.parts
    probe = Probe(lambda ids: parts.language_model.embed_tokens(torch.from_numpy(ids)).numpy(), dims.lm.vocab)
    log("  per-graph gates")
    gates = lm_gates("lm", parts.language_model, runtime.lm, probe, limits)
    gates.append(choice_head_gate(reference, runtime, probe, TokenIds.from_tokenizer(bundle.tokenizer), limits.graph))
    conditions = lm_step(parts.language_model, probe.tokens(4), np.arange(4)[None], DynamicCache())[0]
    gates.append(head_gate(parts.diffusion_head, runtime.velocity, conditions, probe, limits.graph))
    gates.append(module_gate("acoustic_connector", parts.multi_modal_projector, runtime.connect_acoustic,
                             probe.normal(1, 4, dims.acoustic_encoder.vae_dim), limits.graph))
    gates.append(module_gate("semantic_connector", parts.semantic_connector, runtime.connect_semantic,
                             probe.normal(1, 4, dims.semantic_encoder.vae_dim), limits.graph))
    gates += encoder_gates(reference, runtime, probe, limits)
    gates += decoder_gates(reference.acoustic_decoder, runtime.decoder,
                           runtime.unscale(probe.normal(1, 8, dims.acoustic_decoder.vae_dim)), limits)
    gates.append(guided_streams_gate(runtime, probe, limits))
    return gates


def picks_gate(name: str, ours: LongFormResult, theirs: LongFormResult, floor: float) -> Gate:
    """The LM's own greedy pick agrees at every step where the reference's top-2 margin clears the floor."""
    margins = [float(np.diff(np.sort(logits)[-2:])[0]) for logits in theirs.logits]
    clear = [i for i, margin in enumerate(margins) if margin > floor]
    disagree = [i for i in clear if i < len(ours.greedy) and ours.greedy[i] != theirs.greedy[i]]
    diff = max((float(np.abs(a - b).max()) for a, b in zip(ours.logits, theirs.logits)), default=0.0)
    passed = len(ours.greedy) == len(theirs.greedy) and not disagree
    detail = (f"{len(clear)} of {len(margins)} steps clear of the {floor} margin floor, {len(disagree)} "
              f"disagree; smallest top-2 margin {min(margins, default=math.inf):.3g}; max |Δ logit| {diff:.2e}")
    return Gate(name, None, diff, passed, detail)


def closed_loops(bundle: Bundle, reference: Resident | Phased, runtime: Resident | Phased,
                 voices: list[np.ndarray], limits: Limits) -> tuple[list[Gate], dict]:
    """Each loop (forced segments, free-running) runs in the reference, in the runtime teacher-forced (the
    reference's tokens and latents fed back: one step of its error, judged by `limits`) and in the runtime
    free (its own latents and, free-running, its own picks fed back), judged against the reference run again
    with that one-step error (verify.calibration). Three phases: the reference's runs, the runtime's, the
    reference's perturbed runs (each side a backend: PyTorch's modules, or a bundle's graphs)."""
    script = parse_script(CLOSED_LOOP_SCRIPT)
    prompt = build_prompt(bundle.tokenizer, script, [-(-len(v) // 3200) for v in voices])
    ids = TokenIds.from_tokenizer(bundle.tokenizer)
    noise = NoiseSource.from_seed(SEED, bundle.dims.head.latent)
    loops = {"closed loop, forced segments": (forced_segments(ids), None),
             "closed loop, free-running": (None, FREE_STEPS)}

    def run(backend, embeds, label: str, result: LongFormResult, steering=None) -> LongFormResult:
        choose, max_steps = loops[label]
        for _ in long_form_frames(backend, embeds, ids, noise, CFG_SCALE, STEPS, None, result, choose, max_steps,
                                  steering=steering):
            pass
        return result

    with reference.whole() as model:
        embeds = prompt_embeddings(model, prompt, voices, None)
        theirs = {label: run(model, embeds, label, LongFormResult(conditions=[], features=[])) for label in loops}
    ours, forced = {}, {}
    with runtime.whole() as backend:
        embeds = prompt_embeddings(backend, prompt, voices, None)
        for label in loops:
            ours[label] = run(backend, embeds, label, LongFormResult())
            forced[label] = run(backend, embeds, label, LongFormResult(conditions=[], features=[]),
                                Teacher(theirs[label].latents, theirs[label].tokens))
    decisions = picks(ids.pad)
    errors = {label: StepError.measure(forced[label], theirs[label], decisions) for label in loops}
    with reference.whole() as model:
        embeds = prompt_embeddings(model, prompt, voices, None)
        perturbed = {label: perturbed_runs(lambda steering, label=label: run(model, embeds, label, LongFormResult(),
                                                                             steering), errors[label])
                     for label in loops}
    gates, curves = [], {}
    for label in loops:
        detail = (f"{len(theirs[label].tokens)} steps, {theirs[label].frames} latents, two speakers, cfg {CFG_SCALE}, "
                  f"{STEPS} steps, seed {SEED}, mean voice latents")
        if theirs[label].frames:
            forced_loop, curves[f"{label}, teacher-forced"] = forced_gates(label, forced[label], theirs[label], detail,
                                                                           limits)
            gates += forced_loop
        gates.append(picks_gate(f"{label}, teacher-forced: the LM's picks agree", forced[label], theirs[label],
                                limits.decision_floor))
        loop, curves[label] = calibrated_gates(label, ours[label], theirs[label], perturbed[label], errors[label],
                                               decisions, detail)
        gates += loop
    info = {"script": CLOSED_LOOP_SCRIPT, "prompt_tokens": len(prompt.ids), "segments": SEGMENTS,
            "latents_per_segment": SEGMENT_LATENTS, "free_steps": FREE_STEPS, "cfg_scale": CFG_SCALE,
            "diffusion_steps": STEPS, "seed": SEED, "voice_latents": "mean", "curves": curves}
    return gates, info


BATCH_GATE_SCRIPTS = (  # (script, token schedule, steps, latent limit): other lengths, speakers and schedules
    (CLOSED_LOOP_SCRIPT, "segments", None, None),
    ("Speaker 1: A second script with one speaker, running free.", None, FREE_STEPS, None),
    ("Speaker 1: The third joins late.\nSpeaker 2: And answers at once.", "segments", None, 2 * SEGMENT_LATENTS + 3),
)


def batched_streams(bundle: Bundle, runtime: OnnxTts15bBackend, voices: list[np.ndarray]) -> Gate:
    """Three scripts of different lengths and speaker counts batched on one model (the third joining after the
    first has made three latents; two with the forced segment schedule, so their negative rows restart and their
    conv states are zeroed mid-batch) against each run alone: the same tokens, latents and audio (cosine 0.99999).
    Batching must change nothing, at any precision."""
    ids = TokenIds.from_tokenizer(bundle.tokenizer)
    jobs = []
    for k, (text, schedule, max_steps, max_frames) in enumerate(BATCH_GATE_SCRIPTS):
        script = parse_script(text)
        chosen = voices[: len(script.speakers)]
        prompt = build_prompt(bundle.tokenizer, script, [-(-len(v) // 3200) for v in chosen])
        choose = forced_segments(ids) if schedule else None
        jobs.append((prompt_embeddings(runtime, prompt, chosen, None), choose, max_steps, max_frames, SEED + k))

    def run(backend, job, result):
        embeds, choose, max_steps, max_frames, seed = job
        noise = NoiseSource.from_seed(seed, runtime.bundle.dims.head.latent)
        return long_form_frames(backend, embeds, ids, noise, CFG_SCALE, STEPS, max_frames, result, choose, max_steps)

    batch = LongFormBatch(runtime, len(jobs))
    alone, batched = batched_and_alone(runtime, batch, jobs, run, LongFormResult)
    spoken = [k for k, result in enumerate(alone) if result.frames]
    gate = compare("batched streams == separate streams",
                   [np.stack(batched[k].latents) for k in spoken] + [batched[k].audio for k in spoken],
                   [np.stack(alone[k].latents) for k in spoken] + [alone[k].audio for k in spoken], BATCHED,
                   f"3 scripts of {'/'.join(str(r.frames) for r in alone)} latents, the third joining at the first's "
                   f"latent {BATCH_LATE_AFTER}; largest batch {max(batch.batcher.batches['lm_step'])}") if spoken else Gate("batched streams == separate streams", None, 0.0,
                                                                       False, "no script made a latent")
    gate.passed &= all(a.tokens == b.tokens and a.stop_reason == b.stop_reason and a.frames == b.frames
                       for a, b in zip(alone, batched))
    return gate


def teacher_graph_gates(bundle: Bundle, teacher: Phased, student: Phased, limits: Limits) -> list[Gate]:
    """Each graph of the bundle against the teacher's on the same inputs, the teacher's phase first (its LM's
    hidden states are the head's conditions), then the runtime's own paths: the LM on a 9-token prefill and 3
    steps (hidden states and cache), the four choice logits, the head, both connectors, the acoustic encoder on a
    padded batch of two voices, the semantic encoder streaming 4 chunks and the decoder 3 frames (with states)."""
    choices = TokenIds.from_tokenizer(bundle.tokenizer).choices

    def probe_of(backend: OnnxTts15bBackend) -> Probe:
        return Probe(lambda ids: backend.embed_table[ids].astype(np.float32), backend.bundle.dims.lm.vocab)

    def inputs(backend: OnnxTts15bBackend) -> dict:
        dims, probe = backend.bundle.dims, probe_of(backend)
        tokens = probe.tokens(12)
        conditions = backend.lm.run(tokens[:, :4], KvCache(backend.lm))[0]
        hop = dims.semantic_encoder.hop
        return {"tokens": tokens, "conditions": conditions, "hidden": probe.normal(4, dims.lm.hidden),
                "noisy": probe.normal(len(conditions), dims.head.latent),
                "acoustic": probe.normal(1, 4, dims.acoustic_encoder.vae_dim),
                "semantic": probe.normal(1, 4, dims.semantic_encoder.vae_dim), "voices": voice_batch(probe, hop),
                "chunks": probe.normal(4, 1, 1, hop) * 0.1, "latents": probe.normal(1, 3, dims.acoustic_decoder.vae_dim)}

    def calls(backend: OnnxTts15bBackend, x: dict) -> dict[str, list]:
        cache, tokens = KvCache(backend.lm), x["tokens"]
        lm = [backend.lm.run(tokens[:, :9], cache)] + [backend.lm.run(tokens[:, i:i + 1], cache) for i in range(9, 12)]
        timesteps = np.linspace(999, 100, len(x["conditions"])).round().astype(np.float32)
        state, semantic = backend.new_semantic_state(), []
        for chunk in x["chunks"]:
            features, state = backend.semantic.run(chunk, state)
            semantic.append(features)
        return {"lm (9-token prefill, 3 steps)": lm + cache.filled(0),
                "choice logits": [backend.choice_logits(h[None], choices) for h in x["hidden"]],
                "diffusion_head": [backend.velocity(x["noisy"], timesteps, x["conditions"])],
                "acoustic_connector": [backend.connect_acoustic(x["acoustic"])],
                "semantic_connector": [backend.connect_semantic(x["semantic"])],
                "acoustic_encoder (batch of 2, 2.4 frames)": [backend.encode_voices(x["voices"])],
                "semantic_encoder_stream (4 chunks, states)": semantic + [host(v) for v in state],
                "acoustic_decoder_stream (3 frames, states)": decode_each(backend, backend.unscale(x["latents"]))}

    gates = against_teacher(teacher, student, inputs, calls, limits.graph)
    with student.whole() as backend:
        probe = probe_of(backend)
        latents = backend.unscale(probe.normal(1, 8, backend.bundle.dims.acoustic_decoder.vae_dim))
        return gates + [*lm_self_gates("lm", backend.lm, probe, limits), streamed_decode_gate(backend.decoder, latents, limits),
                        guided_streams_gate(backend, probe, limits)]


def verification_voices(bundle: Bundle, voice: str | None) -> tuple[list[np.ndarray], str]:
    """Two voice samples: synthetic signals, or bundle voices named "A" or "A,B" (the second defaults to
    the second synthetic signal)."""
    synthetic = synthetic_voices()
    if voice is None:
        return synthetic, "(synthetic signals)"
    names = voice.split(",")
    chosen = [bundle.voice(name).samples for name in names[:2]]
    return chosen + synthetic[len(chosen):], voice


def load_reference(bundle: Bundle, checkpoint: Checkpoint, log):
    """bf16-stored and fp32-computed where that fits beside the bundle's sessions (1.5B); else (Large on a
    small machine) with its LM layers streamed from the shards: the same fp32 numbers, slower."""
    from ..reference.loading import fp32_model_fits
    from ..reference.tts15b import load_tts15b, load_tts15b_layer_streamed

    sessions = sum(bundle.weight_bytes(name) for name in bundle.info.graphs)
    if fp32_model_fits(checkpoint.files, bytes_per_parameter=2, beside=sessions):
        return load_tts15b(checkpoint, compact=True)
    log("  the reference does not fit beside the bundle: its LM layers are read from the shards as they run")
    return load_tts15b_layer_streamed(checkpoint)


def choice_head_gate(reference, runtime: OnnxTts15bBackend, probe: Probe, ids: TokenIds,
                     tolerance: Tolerance) -> Gate:
    """The four logits each step decides on: from the untied head's rows (Large) or the embedding's (1.5B)."""
    hidden = probe.normal(4, reference.dims.lm.hidden)
    ours = [runtime.choice_logits(h[None], ids.choices) for h in hidden]
    theirs = [reference.model.lm_head.weight[ids.choices].numpy() @ h for h in hidden]
    head = "untied lm_head" if reference.dims.kind == "large" else "the embedding (tied)"
    return compare(f"choice logits (the {head}'s rows of the four picks)", ours, theirs, tolerance)


def run_gates(bundle: Bundle, checkpoint: Checkpoint, voice: str | None, log, limits: Limits) -> tuple[list[Gate], dict]:
    from ..reference.tts15b import TorchTts15bBackend

    reference = load_reference(bundle, checkpoint, log)
    runtime = OnnxTts15bBackend(bundle)
    gates = graph_gates(bundle, reference, runtime, log, limits)
    loops, info = loop_gates(bundle, Resident(TorchTts15bBackend(reference)), Resident(runtime), voice, log, limits)
    return gates + loops, info


def run_teacher_gates(bundle: Bundle, teacher: Bundle, voice: str | None, log, limits: Limits) -> tuple[list[Gate], dict]:
    """The gates without torch: the bundle against `teacher`, the fp32 graphs written from the same checkpoint,
    as run_gates judges it against PyTorch; teacher and bundle held one phase at a time, never both."""
    reference, runtime = Phased(teacher.path, OnnxTts15bBackend), Phased(bundle.path, OnnxTts15bBackend)
    log("  per-graph gates against the teacher's graphs")
    gates = teacher_graph_gates(bundle, reference, runtime, limits)
    loops, info = loop_gates(bundle, reference, runtime, voice, log, limits)
    return gates + loops, info


def loop_gates(bundle: Bundle, reference: Resident | Phased, runtime: Resident | Phased, voice: str | None, log,
               limits: Limits) -> tuple[list[Gate], dict]:
    """The closed loops against the reference; batched streams and the bound loop against the runtime's own."""
    log("  closed loops: the whole generation, runtime vs reference")
    voices, source = verification_voices(bundle, voice)
    loops, info = closed_loops(bundle, reference, runtime, voices, limits)
    log("  batched streams against each alone; the bound loop against the unbound one")
    with runtime.whole() as backend:
        batched = batched_streams(bundle, backend, voices)
    return (loops + [batched, bound_gate(bundle, bound_loop(voices), BOUND_DETAIL)],
            {"closed_loop": {**info, "voices": source}})


BOUND_DETAIL = "the closed loop's script with forced segments: voice encoding, prompt, tokens, latents and audio"


def bound_loop(voices: list[np.ndarray]):
    """The forced-segments closed loop on a backend of the bundle given (verify.common.bound_gate)."""
    def run(bundle: Bundle) -> list[np.ndarray]:
        runtime, ids = OnnxTts15bBackend(bundle), TokenIds.from_tokenizer(bundle.tokenizer)
        prompt = build_prompt(bundle.tokenizer, parse_script(CLOSED_LOOP_SCRIPT), [-(-len(v) // 3200) for v in voices])
        embeds, result = prompt_embeddings(runtime, prompt, voices, None), LongFormResult()
        noise = NoiseSource.from_seed(SEED, bundle.dims.head.latent)
        for _ in long_form_frames(runtime, embeds, ids, noise, CFG_SCALE, STEPS, None, result, forced_segments(ids)):
            pass
        return [embeds, np.stack(result.latents), result.audio, np.array(result.tokens)]

    return run
