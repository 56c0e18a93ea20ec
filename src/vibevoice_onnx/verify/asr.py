"""The gates of an ASR bundle against its fp32 reference: PyTorch's modules, or, without torch, the fp32 graphs
written from the same checkpoint (the teacher: run_teacher_gates). Every graph, KV incremental == prefill, the
streaming encoders over several segments == one pass, and the closed loop: the runtime's greedy tokens equal the
reference's on a speech clip (the encoder means, so both see the same audio embeddings), with the smallest top-2
logit margin beside it; and several clips' greedy decodes batched == each alone. The module imports torch only
where PyTorch's side is asked for."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from ..audio import db_normalize, read_audio
from ..checkpoints.checkpoint import Checkpoint
from ..families import load
from ..generation.asr import (TranscriptionResult, audio_embeddings, encoder_means, forced_logits, greedy_agreement,
                              run_transcription, stop_ids, transcribe_tokens)
from ..runtime.asr import ENCODERS, PIECE_FRAMES, AsrBatch, OnnxAsrBackend
from ..runtime.bundle import Bundle
from ..transcription import prompt_builder
from .judge import (BATCH_LATE_AFTER, BATCHED, Gate, Limits, Probe, batched_and_alone, bound_gate, compare,
                    frames_gate, lm_self_gates)
from .teacher import Phased, Resident, against_teacher

LOOP_TOKENS = 32
SPEECH = Path(__file__).resolve().parents[4] / "shared" / "fixtures" / "audio" / "demo3-hotwords.wav"
CLIP_SAMPLES = 24000 * 6 + 1234  # six seconds and a partial frame: upstream's rounding up is in play
SPEECH_SAMPLES = int(17.28 * 24000)  # the shared clip's length (six streaming windows), for its stand-in


def verification_audio(voice: str | None, samples: int | None = CLIP_SAMPLES, normalize: bool = True) -> tuple[np.ndarray, str]:
    """A real speech clip (its first `samples`; None: all of it): `voice` names an audio file, else the shared demo
    clip, else a synthetic signal."""
    path = Path(voice) if voice else SPEECH
    level = db_normalize if normalize else np.asarray
    if path.is_file():
        audio, _ = read_audio(path)
        return level(audio[:samples]), str(path)
    t = np.arange(samples or SPEECH_SAMPLES) / 24000
    signal = 0.2 * np.sin(2 * np.pi * 160 * t + 3 * np.sin(2 * np.pi * 3 * t)) * (1 + np.sin(2 * np.pi * 0.7 * t))
    return level(signal.astype(np.float32)), "(a synthetic voiced signal: ../shared is not available)"


def encoder_cases(probe: Probe, hop: int) -> list[tuple[str, np.ndarray, int | None]]:
    """(label, audio [1, 1, N], segment): one segment from zero states (audio up to 60 s), alone and longer than
    the runtime's pieces, then long audio's path on short segments of 5 frames: two whole ones and a partial last
    one."""
    pieces = f"{PIECE_FRAMES + 7}.2 frames, one segment in pieces of {PIECE_FRAMES}"
    return [("2.2 frames, one segment", probe.normal(1, 1, 2 * hop + 777) * 0.1, None),
            (pieces, probe.normal(1, 1, (PIECE_FRAMES + 7) * hop + 777) * 0.1, None),
            ("3 segments, states", probe.normal(1, 1, 13 * hop + 555) * 0.1, 5 * hop)]


def graph_gates(bundle: Bundle, reference, runtime: OnnxAsrBackend, limits: Limits) -> list[Gate]:
    """Each graph against PyTorch's module (`reference`: reference.asr.AsrReference), each encoder case against one
    pass of the reference with upstream's padding; the LM's own paths."""
    import torch

    from ..reference.modules import UpstreamPadding, as_tensor
    from .common import lm_gates

    dims, parts = reference.dims, reference.parts
    probe = Probe(lambda ids: parts.language_model.embed_tokens(torch.from_numpy(ids)).numpy(), dims.lm.vocab)
    gates = lm_gates("lm", parts.language_model, runtime.lm, probe, limits)
    hidden = probe.normal(3, dims.lm.hidden)
    gates.append(compare("lm_head", [np.stack([runtime.logits(h[None]) for h in hidden])],
                         [reference.model.lm_head(as_tensor(hidden)).numpy()], limits.graph))
    encoders = (parts.acoustic_tokenizer_encoder, parts.semantic_tokenizer_encoder)
    for label, audio, segment in encoder_cases(probe, dims.acoustic_encoder.hop):
        ours = encoder_means(runtime, audio[0, 0], segment=segment or audio.shape[-1])
        for name, encoder, out in zip(ENCODERS, encoders, ours):
            theirs = encoder(as_tensor(audio), padding_cache=UpstreamPadding()).latents.numpy()
            gates.append(compare(f"{name} ({label}) == one pass, upstream's padding", [out], [theirs], limits.graph))
    acoustic, semantic = probe.normal(1, 4, dims.acoustic_encoder.vae_dim), probe.normal(1, 4, dims.semantic_encoder.vae_dim)
    gates.append(compare("audio_connector", [runtime.connect(acoustic, semantic)],
                         [parts.multi_modal_projector(as_tensor(acoustic), as_tensor(semantic)).numpy()], limits.graph))
    return gates


def teacher_graph_gates(teacher: Phased, student: Phased, limits: Limits) -> list[Gate]:
    """Each graph of the bundle against the teacher's on the same inputs (its LM's hidden states for the head,
    the encoder cases of graph_gates), then the LM's own paths: the LM on a 9-token prefill and 3 steps with its
    cache, the head, both encoders (means and every case's segments), the connector."""
    def inputs(backend: OnnxAsrBackend) -> dict:
        dims = backend.bundle.dims
        probe = Probe(lambda ids: backend.embed_table[ids].astype(np.float32), dims.lm.vocab)
        tokens = probe.tokens(12)
        return {"tokens": tokens, "hidden": backend.lm_stream().step(tokens)[0, -3:],
                "cases": encoder_cases(probe, dims.acoustic_encoder.hop),
                "latents": (probe.normal(1, 4, dims.acoustic_encoder.vae_dim), probe.normal(1, 4, dims.semantic_encoder.vae_dim))}

    def calls(backend: OnnxAsrBackend, x: dict) -> dict[str, list]:
        stream, tokens = backend.lm_stream(), x["tokens"]
        found = {"lm (9-token prefill, 3 steps)": [stream.step(tokens[:, :9])] + [stream.step(tokens[:, i:i + 1])
                                                                                 for i in range(9, 12)],
                 "lm_head": [backend.head_logits(x["hidden"])]}
        for label, audio, segment in x["cases"]:
            means = encoder_means(backend, audio[0, 0], segment=segment or audio.shape[-1])
            found.update({f"{name} ({label})": [out] for name, out in zip(ENCODERS, means)})
        found["audio_connector"] = [backend.connect(*x["latents"])]
        return found

    gates = against_teacher(teacher, student, inputs, calls, limits.graph)
    with student.whole() as backend:
        probe = Probe(lambda ids: backend.embed_table[ids].astype(np.float32), backend.bundle.dims.lm.vocab)
        return gates + lm_self_gates("lm", backend.lm, probe, limits)


def closed_loop(bundle: Bundle, reference: Resident | Phased, runtime: Resident | Phased, samples: np.ndarray,
                limits: Limits) -> tuple[list[Gate], dict]:
    """The runtime transcribes greedily; the reference is fed the same prompt and tokens in one pass, so its
    greedy choice at every step is the argmax of that step's logits (one reference pass however long).

    That is teacher forcing with the runtime's trajectory as the teacher: at every step both have the same
    prefix, so each step measures one step of the bundle's error, and a split at one near tie does not make
    the later steps incomparable (as it would if the reference ran free). Every step whose reference top-2
    margin clears the precision's decision floor must pick the same token. `reference` and `runtime` are held
    for their phase each (the runtime's run, then the reference's pass)."""
    tokenizer = bundle.tokenizer
    prompt, stops = prompt_builder(bundle.kind)(tokenizer, len(samples)), stop_ids(tokenizer)
    with runtime.whole() as backend:
        ours = run_transcription(backend, prompt, samples, stops, LOOP_TOKENS, rng=None, keep_logits=True)
    with reference.whole() as model:
        theirs = forced_logits(model, prompt, audio_embeddings(model, samples, None), ours.tokens)
    setting = (f"{len(ours.tokens)} greedy tokens ({ours.stop_reason}), {len(prompt.audio_positions)} audio tokens, "
               "encoder means")
    gates, info = forced_gates("closed loop", "step", ours.tokens, ours.logits, theirs, limits, setting)
    return gates, {**info, "prompt_tokens": len(prompt.ids), "audio_tokens": len(prompt.audio_positions)}


def bound_loop(samples: np.ndarray):
    """The closed loop's greedy transcription on a backend of the bundle given (verify.common.bound_gate)."""
    def run(bundle: Bundle) -> list[np.ndarray]:
        prompt, stops = prompt_builder(bundle.kind)(bundle.tokenizer, len(samples)), stop_ids(bundle.tokenizer)
        result = run_transcription(OnnxAsrBackend(bundle), prompt, samples, stops, LOOP_TOKENS, rng=None, keep_logits=True)
        return [np.stack(result.logits), np.array(result.tokens)]

    return run


def forced_gates(loop: str, step: str, tokens: list[int], ours: list[np.ndarray], theirs: np.ndarray, limits: Limits,
                 setting: str) -> tuple[list[Gate], dict]:
    """The runtime's greedy `tokens` and their logits `ours` against the reference's logits for the same steps
    (teacher-forced): every step whose reference top-2 margin clears the precision's decision floor must pick
    the same token, and the logits must stay within the precision's conditions tolerance (worst step's cosine
    and relative error, every step's gain at once)."""
    top2 = np.sort(theirs, axis=1)[:, -2:]
    margins = top2[:, 1] - top2[:, 0]
    clear = [i for i, margin in enumerate(margins) if margin > limits.decision_floor]
    picks = theirs.argmax(axis=1)
    disagree = [i for i in clear if picks[i] != tokens[i]]
    agree, smallest = greedy_agreement(tokens, theirs), float(margins.min(initial=np.inf))
    detail = (f"{setting}; {len(clear)} of {len(margins)} {step}s clear of the {limits.decision_floor} margin floor, "
              f"{len(disagree)} disagree{f' ({step}s ' + ', '.join(map(str, disagree[:10])) + ')' if disagree else ''}; "
              f"the reference's greedy pick agrees on the first {agree}; smallest top-2 logit margin {smallest:.3g}")
    logits = frames_gate(f"{loop}, teacher-forced: per-{step} logits", list(zip(ours, theirs)),
                         limits.forced_condition, detail)
    gates = [Gate(f"{loop}, teacher-forced: greedy picks agree", None, logits.max_abs, not disagree, detail), logits]
    return gates, {"tokens": len(tokens), "agreeing_prefix": agree, "decided_steps": len(clear),
                   "disagreeing_steps": disagree, "smallest_margin": smallest}


BATCH_GATE_CLIPS = ((0.0, 1.0), (0.0, 0.45), (0.3, 0.8))  # (start, end) of the clip: other lengths and audio
BATCH_GATE_TOKENS = (16, 12, 16)


def batched_streams(bundle: Bundle, runtime: OnnxAsrBackend, samples: np.ndarray) -> Gate:
    """Three clips of the verification audio, of other lengths, transcribed with their greedy steps batched on
    one model (the third joining after the first has made three tokens) against each alone: the same tokens
    and every step's logits the same (cosine 0.99999). Batching must change nothing, at any precision."""
    tokenizer, stops, build_prompt = bundle.tokenizer, stop_ids(bundle.tokenizer), prompt_builder(bundle.kind)
    jobs = []
    for (start, end), tokens in zip(BATCH_GATE_CLIPS, BATCH_GATE_TOKENS):
        clip = samples[int(start * len(samples)): int(end * len(samples))]
        jobs.append((build_prompt(tokenizer, len(clip)), clip, tokens))

    def run(backend, job, result):
        prompt, clip, tokens = job
        return transcribe_tokens(backend, prompt, audio_embeddings(backend, clip, None), stops, tokens, result,
                                 keep_logits=True)

    batch = AsrBatch(runtime, len(jobs))
    alone, batched = batched_and_alone(runtime, batch, jobs, run, TranscriptionResult)
    gate = compare("batched streams == separate streams", [np.stack(r.logits) for r in batched],
                   [np.stack(r.logits) for r in alone], BATCHED,
                   f"3 clips of {'/'.join(str(len(clip) // 3200) for _, clip, _ in jobs)} audio tokens, "
                   f"{'/'.join(str(len(r.tokens)) for r in alone)} greedy tokens, the third joining at the first's "
                   f"token {BATCH_LATE_AFTER}; largest batch {max(batch.batcher.batches['lm_step'])}")
    gate.passed &= all(a.tokens == b.tokens for a, b in zip(alone, batched))
    return gate


def load_reference(checkpoint: Checkpoint, log):
    """The fp32 reference (the kind's: ASR-BitNet's ternarizes its projections), its LM layers read from the
    shards as they run where the model does not fit (the float ASR reference only)."""
    from ..reference.asr import load_asr, load_asr_layer_streamed
    from ..reference.loading import fp32_model_fits

    loader = load(checkpoint.family.reference)
    if fp32_model_fits(checkpoint.files) or loader is not load_asr:
        return loader(checkpoint)
    log("  the fp32 reference does not fit in memory: its LM layers are read from the shards as they run")
    return load_asr_layer_streamed(checkpoint)


def run_gates(bundle: Bundle, checkpoint: Checkpoint, voice: str | None, log, limits: Limits,
              loops: Callable | None = None) -> tuple[list[Gate], dict]:
    """Against PyTorch: every graph, then `loops` (default: this kind's loop_gates; ASR-Streaming gives its own)."""
    reference = load_reference(checkpoint, log)
    runtime = OnnxAsrBackend(bundle)
    log("  per-graph gates")
    gates = graph_gates(bundle, reference, runtime, limits)
    loop, info = (loops or loop_gates)(bundle, Resident(reference), Resident(runtime), voice, log, limits)
    return gates + loop, info


def run_teacher_gates(bundle: Bundle, teacher: Bundle, voice: str | None, log, limits: Limits,
                      loops: Callable | None = None) -> tuple[list[Gate], dict]:
    """The gates without torch: the bundle against `teacher`, the fp32 graphs written from the same checkpoint,
    as run_gates judges it against PyTorch; teacher and bundle held one phase at a time, never both."""
    reference, runtime = Phased(teacher.path, OnnxAsrBackend), Phased(bundle.path, OnnxAsrBackend)
    log("  per-graph gates against the teacher's graphs")
    gates = teacher_graph_gates(reference, runtime, limits)
    loop, info = (loops or loop_gates)(bundle, reference, runtime, voice, log, limits)
    return gates + loop, info


def loop_gates(bundle: Bundle, reference: Resident | Phased, runtime: Resident | Phased, voice: str | None, log,
               limits: Limits) -> tuple[list[Gate], dict]:
    """The closed loop against the reference; batched transcriptions and the bound loop against the runtime's own."""
    log("  closed loop: greedy transcription, runtime vs reference")
    samples, source = verification_audio(voice)
    loop, info = closed_loop(bundle, reference, runtime, samples, limits)
    log("  batched transcriptions against each alone; the bound loop against the unbound one")
    with runtime.whole() as backend:
        batched = batched_streams(bundle, backend, samples)
    bound = bound_gate(bundle, bound_loop(samples), f"{LOOP_TOKENS} greedy tokens of the verification audio: every step's logits")
    return loop + [batched, bound], {"closed_loop": {**info, "audio": source, "seconds": round(len(samples) / 24000, 3)}}
