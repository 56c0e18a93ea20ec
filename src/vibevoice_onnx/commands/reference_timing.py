"""The PyTorch reference's side of `vibevoice-onnx bench`, run in a child process so its memory is its own (a
command, above both the runtime and the reference, so the reference library imports nothing of the runtime):

    python -m vibevoice_onnx.commands.reference_timing CHECKPOINT BUNDLE VOICE FRAMES THREADS OPTIONS_JSON

runs the bundle kind's bench generation (the same loop, latents, text, voice, noise and options as the runtime
side) on the reference backend and prints one JSON line with the same timings.
"""

from __future__ import annotations

import json
import sys

import torch

from ..families import family, load
from ..runtime.bench import result_of, bench_kind, timed_run
from ..runtime.bundle import Bundle


def reference_backend(kind: str, checkpoint: str):
    """The PyTorch reference of the checkpoint behind the same interface as the runtime's backend."""
    facts = family(kind)
    return load(facts.torch_backend)(load(facts.reference)(checkpoint))


@torch.no_grad()
def main(argv: list[str]) -> None:
    checkpoint, bundle_dir, voice, frames, threads, options = argv
    if int(threads):
        torch.set_num_threads(int(threads))
    bundle = Bundle(bundle_dir)
    _, bench_frames, _ = bench_kind(bundle.kind)
    backend, result = reference_backend(bundle.kind, checkpoint), result_of(bundle.kind)
    run = timed_run(bench_frames(backend, bundle, voice, int(frames), result, **json.loads(options)))
    print(json.dumps({"frames": result.frames, **run, "real_time_factor": run["wall_seconds"] / (result.frames * 3200 / 24000),
                      "first_audio_seconds": run["chunk_times"][0]}))


if __name__ == "__main__":
    main(sys.argv[1:])
