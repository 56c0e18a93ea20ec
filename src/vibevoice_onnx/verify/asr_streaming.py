"""The gates of an ASR-Streaming bundle against its fp32 reference (PyTorch's modules, or, without torch, the
teacher: the fp32 graphs written from the same checkpoint): the ASR graphs' gates (the same graphs; the 1.5B's
head against the embedding it is tied to), both encoders over one whole window encoded cold as the loop encodes
it, and the streaming loop on the real speech fixture (all of it, every window, the last zero-padded): the
runtime's chunk by chunk tokens against the reference run along them in one pass (teacher forcing, as the ASR
gate does), every pick clear of the precision's margin floor the same, with the smallest top-2 margin beside it."""

from __future__ import annotations

import numpy as np

from ..checkpoints.checkpoint import Checkpoint
from ..generation.asr_streaming import StreamingSession, WindowFeeder, forced_logits, pad_window, split_windows
from ..runtime.asr import ENCODERS, OnnxAsrBackend
from ..runtime.bundle import Bundle
from . import asr
from .asr import forced_gates, verification_audio
from .judge import BATCHED, Gate, Limits, Tolerance, bound_gate, compare
from .teacher import Phased, Resident

TOKENS_PER_CHUNK = 8  # per window: enough picks to judge, few enough for a 7B reference on a CPU


def window_gates(bundle: Bundle, reference: Resident | Phased, runtime: Resident | Phased, samples: np.ndarray,
                 limit: Tolerance) -> list[Gate]:
    """Both encoders over the first window, cold, against the reference's; and StreamingTranscriber's path (each
    window encoded in segments as its audio arrives, two windows in flight over the lookahead) against each
    window encoded whole by the same graphs: a new path, so nothing may change."""
    geometry = bundle.streaming_geometry
    audio = next(split_windows(samples, geometry))[None, None]
    with reference.whole() as model:
        theirs = model.encode(audio)
    with runtime.whole() as backend:
        gates = [compare(f"{name} (one {geometry.window_frames}-frame window, cold)", [ours], [reference_out], limit)
                 for name, ours, reference_out in zip(ENCODERS, backend.encode(audio), theirs)]
        fed = arriving(backend, geometry, samples[:2 * geometry.chunk_samples + 12345])
        for i, name in enumerate(ENCODERS):
            ours = [means[i] for _, means in fed]
            whole = [backend.encode(pad_window(window, geometry)[None, None])[i] for window, _ in fed]
            gates.append(compare(f"{name}: {len(fed)} windows encoded as they arrive == each whole", ours, whole, BATCHED))
    return gates


def arriving(runtime: OnnxAsrBackend, geometry, samples: np.ndarray, pieces: int = 29) -> list[tuple]:
    """The windows of `samples` with their means as StreamingTranscriber computes them by default (each
    window's chunk encoded once complete, then its lookahead), the audio handed over in odd-sized pieces."""
    feeder, fed = WindowFeeder(geometry, runtime, geometry.chunk_frames), []
    for piece in np.array_split(samples, pieces):
        fed += feeder.feed(piece)
    return fed + feeder.finish()


def streaming_loop(bundle: Bundle, reference: Resident | Phased, runtime: Resident | Phased, samples: np.ndarray,
                   limits: Limits) -> tuple[list[Gate], dict]:
    geometry, tokenizer = bundle.streaming_geometry, bundle.tokenizer
    with runtime.whole() as backend:
        fed = arriving(backend, geometry, samples)  # the runtime's own path: each chunk encoded as it completes
        session = StreamingSession(backend, tokenizer, geometry, None, None, TOKENS_PER_CHUNK, keep_logits=True)
        chunks = [session.chunk(window, means) for window, means in fed]
    windows = [window for window, _ in fed]
    with reference.whole() as model:
        theirs = forced_logits(model, tokenizer, geometry, windows, chunks)
    tokens = [t for c in chunks for t in c.tokens]
    setting = (f"{len(windows)} windows of {geometry.window_samples} samples, {len(tokens)} greedy tokens (at most "
               f"{TOKENS_PER_CHUNK} a chunk), encoder means")
    gates, info = forced_gates("streaming loop", "pick", tokens, [l for c in chunks for l in c.logits],
                               np.concatenate(theirs), limits, setting)
    return gates, {**info, "windows": len(windows), "chunk_stops": [c.stop_reason for c in chunks]}


def bound_loop(samples: np.ndarray):
    """The streaming loop on a backend of the bundle given (verify.common.bound_gate)."""
    def run(bundle: Bundle) -> list[np.ndarray]:
        runtime, geometry = OnnxAsrBackend(bundle), bundle.streaming_geometry
        session = StreamingSession(runtime, bundle.tokenizer, geometry, None, None, TOKENS_PER_CHUNK, keep_logits=True)
        chunks = [session.chunk(window, means) for window, means in arriving(runtime, geometry, samples)]
        return [np.concatenate([np.stack(c.logits) for c in chunks if c.logits]), np.array([t for c in chunks for t in c.tokens])]

    return run


def run_gates(bundle: Bundle, checkpoint: Checkpoint, voice: str | None, log, limits: Limits) -> tuple[list[Gate], dict]:
    return asr.run_gates(bundle, checkpoint, voice, log, limits, loop_gates)


def run_teacher_gates(bundle: Bundle, teacher: Bundle, voice: str | None, log, limits: Limits) -> tuple[list[Gate], dict]:
    return asr.run_teacher_gates(bundle, teacher, voice, log, limits, loop_gates)


def loop_gates(bundle: Bundle, reference: Resident | Phased, runtime: Resident | Phased, voice: str | None, log,
               limits: Limits) -> tuple[list[Gate], dict]:
    """The windows' encoders and the streaming loop against the reference; the bound loop against the unbound."""
    samples, source = verification_audio(voice, None, normalize=bundle.streaming_geometry.normalize_audio)
    gates = window_gates(bundle, reference, runtime, samples, limits.graph)
    log(f"  streaming loop: {bundle.streaming_geometry.windows(len(samples))} windows, runtime vs reference")
    loop, info = streaming_loop(bundle, reference, runtime, samples, limits)
    bound = bound_gate(bundle, bound_loop(samples), "the streaming loop: every chunk's logits")
    return gates + loop + [bound], {"streaming_loop": {**info, "audio": source, "seconds": round(len(samples) / 24000, 3)}}
