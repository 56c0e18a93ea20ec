"""The PyTorch reference's side of `vibevoice-onnx bench`, run in a child process so its memory is its own:

    python -m vibevoice_onnx.reference.timing CHECKPOINT BUNDLE VOICE TEXT SEED FRAMES THREADS

prints one JSON line with the same timings the runtime side measures (the same loop, frames, text and noise).
"""

from __future__ import annotations

import json
import sys
import time

import torch

from ..generation.realtime import GenerationResult, realtime_frames
from ..runtime.bundle import Bundle
from ..sampling import NoiseSource
from ..text import encode_tts_text
from .loading import load_realtime
from .realtime import TorchRealtimeBackend


@torch.no_grad()
def main(argv: list[str]) -> None:
    checkpoint, bundle_dir, voice, text, seed, frames, threads = argv
    if int(threads):
        torch.set_num_threads(int(threads))
    bundle = Bundle(bundle_dir)
    backend = TorchRealtimeBackend(load_realtime(checkpoint))
    prompt, ids, noise = bundle.voice(voice), encode_tts_text(bundle.tokenizer, text), NoiseSource.from_seed(int(seed))
    result, chunk_times = GenerationResult(), []
    start = time.perf_counter()
    for _ in realtime_frames(backend, prompt, ids, noise, 1.5, 5, int(frames), result, stop_on_eos=False):
        chunk_times.append(time.perf_counter() - start)
    wall = time.perf_counter() - start
    print(json.dumps({"frames": result.frames, "wall_seconds": wall, "real_time_factor": wall / (result.frames * 3200 / 24000),
                      "first_audio_seconds": chunk_times[0], "chunk_times": chunk_times}))


if __name__ == "__main__":
    main(sys.argv[1:])
