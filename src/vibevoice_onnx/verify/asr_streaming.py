"""The gates of an ASR-Streaming bundle against the fp32 PyTorch reference: the ASR graphs' gates (the same
graphs; the 1.5B's head against the embedding it is tied to), both encoders over one whole window encoded
cold as the loop encodes it, and the streaming loop on the real speech fixture (all of it, every window, the
last zero-padded): the runtime's chunk by chunk tokens against the reference run along them in one pass
(teacher forcing, as the ASR gate does), every pick clear of the precision's margin floor the same, with the
smallest top-2 margin beside it."""

from __future__ import annotations


import numpy as np

from ..checkpoints.checkpoint import Checkpoint
from ..generation.asr_streaming import StreamingSession, WindowFeeder, forced_logits, pad_window, split_windows
from ..runtime.asr import ENCODERS, OnnxAsrBackend
from ..runtime.bundle import Bundle
from .asr import forced_gates, graph_gates, load_reference, verification_audio
from .common import BATCHED, Gate, Limits, Tolerance, bound_gate, compare

TOKENS_PER_CHUNK = 8  # per window: enough picks to judge, few enough for a 7B reference on a CPU


def window_gates(bundle: Bundle, reference, runtime: OnnxAsrBackend, samples: np.ndarray, limit: Tolerance) -> list[Gate]:
    """Both encoders over the first window, cold, against the reference's; and StreamingTranscriber's path (each
    window encoded in segments as its audio arrives, two windows in flight over the lookahead) against each
    window encoded whole by the same graphs: a new path, so nothing may change."""
    geometry = bundle.streaming_geometry
    audio = next(split_windows(samples, geometry))[None, None]
    gates = [compare(f"{name} (one {geometry.window_frames}-frame window, cold)", [ours], [theirs], limit)
             for name, ours, theirs in zip(ENCODERS, runtime.encode(audio), reference.encode(audio))]
    fed = arriving(runtime, geometry, samples[:2 * geometry.chunk_samples + 12345])
    for i, name in enumerate(ENCODERS):
        ours = [means[i] for _, means in fed]
        whole = [runtime.encode(pad_window(window, geometry)[None, None])[i] for window, _ in fed]
        gates.append(compare(f"{name}: {len(fed)} windows encoded as they arrive == each whole", ours, whole, BATCHED))
    return gates


def arriving(runtime: OnnxAsrBackend, geometry, samples: np.ndarray, pieces: int = 29) -> list[tuple]:
    """The windows of `samples` with their means as StreamingTranscriber computes them by default (each
    window's chunk encoded once complete, then its lookahead), the audio handed over in odd-sized pieces."""
    feeder, fed = WindowFeeder(geometry, runtime, geometry.chunk_frames), []
    for piece in np.array_split(samples, pieces):
        fed += feeder.feed(piece)
    return fed + feeder.finish()


def streaming_loop(bundle: Bundle, reference, runtime: OnnxAsrBackend, samples: np.ndarray,
                   limits: Limits) -> tuple[list[Gate], dict]:
    geometry, tokenizer = bundle.streaming_geometry, bundle.tokenizer
    fed = arriving(runtime, geometry, samples)  # the runtime's own path: each chunk encoded as it completes
    windows = [window for window, _ in fed]
    session = StreamingSession(runtime, tokenizer, geometry, None, None, TOKENS_PER_CHUNK, keep_logits=True)
    chunks = [session.chunk(window, means) for window, means in fed]
    theirs = forced_logits(reference, tokenizer, geometry, windows, chunks)
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
    reference = load_reference(checkpoint, log)
    runtime = OnnxAsrBackend(bundle)
    log("  per-graph gates")
    samples, source = verification_audio(voice, None, normalize=bundle.streaming_geometry.normalize_audio)
    gates = graph_gates(bundle, reference, runtime, limits) + window_gates(bundle, reference, runtime, samples,
                                                                                 limits.graph)
    log(f"  streaming loop: {bundle.streaming_geometry.windows(len(samples))} windows, runtime vs reference")
    loop, info = streaming_loop(bundle, reference, runtime, samples, limits)
    bound = bound_gate(bundle, bound_loop(samples), "the streaming loop: every chunk's logits")
    return gates + loop + [bound], {"streaming_loop": {**info, "audio": source, "seconds": round(len(samples) / 24000, 3)}}
