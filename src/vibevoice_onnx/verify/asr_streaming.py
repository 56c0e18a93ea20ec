"""The gates of an ASR-Streaming bundle against the fp32 PyTorch reference: the ASR graphs' gates (the same
graphs; the 1.5B's head against the embedding it is tied to), both encoders over one whole window encoded
cold as the loop encodes it, and the streaming loop on the real speech fixture (all of it, every window, the
last zero-padded): the runtime's chunk by chunk tokens against the reference run along them in one pass
(teacher forcing, as the ASR gate does), every pick clear of the precision's margin floor the same, with the
smallest top-2 margin beside it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..generation.asr_streaming import StreamingSession, forced_logits, split_windows
from ..runtime.asr import OnnxAsrBackend
from ..runtime.bundle import Bundle
from .asr import forced_gates, graph_gates, load_reference, verification_audio
from .common import Gate, Limits, compare

TOKENS_PER_CHUNK = 8  # per window: enough picks to judge, few enough for a 7B reference on a CPU


def window_gates(bundle: Bundle, reference, runtime: OnnxAsrBackend, window: np.ndarray, limit: float) -> list[Gate]:
    audio = window[None, None]
    return [compare(f"{name} (one {bundle.streaming_geometry.window_frames}-frame window, cold)", [ours], [theirs],
                    min_cosine=limit)
            for name, ours, theirs in zip(("acoustic_encoder_stream", "semantic_encoder_stream"), runtime.encode(audio),
                                          reference.encode(audio))]


def streaming_loop(bundle: Bundle, reference, runtime: OnnxAsrBackend, samples: np.ndarray,
                   limits: Limits) -> tuple[list[Gate], dict]:
    geometry, tokenizer = bundle.streaming_geometry, bundle.tokenizer
    windows = list(split_windows(samples, geometry))
    session = StreamingSession(runtime, tokenizer, geometry, None, None, TOKENS_PER_CHUNK, keep_logits=True)
    chunks = [session.chunk(window) for window in windows]
    theirs = forced_logits(reference, tokenizer, geometry, windows, chunks)
    tokens = [t for c in chunks for t in c.tokens]
    setting = (f"{len(windows)} windows of {geometry.window_samples} samples, {len(tokens)} greedy tokens (at most "
               f"{TOKENS_PER_CHUNK} a chunk), encoder means")
    gates, info = forced_gates("streaming loop", "pick", tokens, [l for c in chunks for l in c.logits],
                               np.concatenate(theirs), limits, setting)
    return gates, {**info, "windows": len(windows), "chunk_stops": [c.stop_reason for c in chunks]}


def run_gates(bundle: Bundle, checkpoint: Path, voice: str | None, log, limits: Limits) -> tuple[list[Gate], dict]:
    reference = load_reference(checkpoint, log)
    runtime = OnnxAsrBackend(bundle)
    log("  per-graph gates")
    samples, source = verification_audio(voice, None, normalize=bundle.streaming_geometry.normalize_audio)
    windows = list(split_windows(samples, bundle.streaming_geometry))
    gates = graph_gates(bundle, reference, runtime, limits.graph) + window_gates(bundle, reference, runtime,
                                                                                 windows[0], limits.graph)
    log(f"  streaming loop: {len(windows)} windows, runtime vs reference")
    loop, info = streaming_loop(bundle, reference, runtime, samples, limits)
    return gates + loop, {"streaming_loop": {**info, "audio": source, "seconds": round(len(samples) / 24000, 3)}}
