"""Realtime end to end on a synthetic checkpoint: build time and memory, gates, and speak speed against the
PyTorch reference on the same weights, text, voice and noise.

    .venv/bin/python benchmarks/realtime.py --size full --workdir bench-out/full

Each phase runs in its own process so its peak memory (max RSS) is its own. Results go to
WORKDIR/results.json and are printed as they come. Not part of CI: a full-size run takes many minutes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from phases import CLI, parse_arguments, prepare, run, run_phase, save

TEXT = (
    "VibeVoice turns text into speech one frame at a time. This benchmark measures how fast the ONNX runtime "
    "speaks compared with the PyTorch reference, on the same weights."
)
VOICES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "voices"
REFERENCE_SPEAK = """
import json, sys, time, numpy as np, torch
from vibevoice_onnx.generation.realtime import GenerationResult, realtime_frames
from vibevoice_onnx.reference.realtime import TorchRealtimeBackend
from vibevoice_onnx.reference.loading import load_realtime
from vibevoice_onnx.runtime.bundle import Bundle
from vibevoice_onnx.sampling import NoiseSource
from vibevoice_onnx.text import encode_tts_text
checkpoint, bundle_dir, voice, noise_path, text, out = sys.argv[1:7]
torch.set_num_threads(int(sys.argv[7]))
bundle = Bundle(bundle_dir)
model = load_realtime(checkpoint)
prompt = bundle.voice(voice)
ids = encode_tts_text(bundle.tokenizer, text)
noise = NoiseSource.from_file(noise_path)
result = GenerationResult()
with torch.no_grad():
    start = time.perf_counter(); first = None
    for chunk in realtime_frames(TorchRealtimeBackend(model), prompt, ids, noise, 1.5, 5, noise.frames, result):
        first = first or time.perf_counter() - start
    wall = time.perf_counter() - start
np.save(out, np.stack(result.latents))
audio = result.frames * 3200 / 24000
print(json.dumps({"frames": result.frames, "audio_seconds": audio, "wall_seconds": round(wall, 3),
                  "real_time_factor": round(wall / audio, 4), "first_audio_seconds": round(first, 4)}))
"""


def main() -> int:
    args = parse_arguments(__doc__, "bench-out/realtime", 48, "speech frames")
    work = args.workdir
    checkpoint, bundle = work / "checkpoint", work / "onnx" / "realtime" / "cpu_fp32"
    results: dict = {"size": args.size, "frames": args.frames, "threads": args.threads, "text": TEXT}

    voices = [("synthetic", checkpoint / "voices" / "synthetic.pt")]
    if args.size == "full" and VOICES.is_dir():
        voices += [(p.stem, p) for p in sorted(VOICES.glob("*.pt"))]
    if not args.speak_only:
        prepare("realtime", args.size, work, checkpoint, bundle, voices, results)

    voice = voices[-1][0]  # a real preset when there is one
    noise = work / "noise.npy"
    subprocess.run([sys.executable, "-c", f"import numpy as np; from vibevoice_onnx.sampling import NoiseSource as N; "
                    f"s=N.from_seed(42); np.save('{noise}', np.stack([s(i) for i in range({args.frames})]))"], check=True)
    speak = [*CLI, "speak", str(bundle), TEXT, "--voice", voice, "--noise", str(noise), "--max-frames", str(args.frames),
             "--threads", str(args.threads), "-o", str(work / "speech.wav"), "--save-latents", str(work / "onnx_latents.npy")]
    proc = run_phase("speak_onnx", speak, results, work)
    results["speak_onnx"]["summary"] = proc.stderr.strip().splitlines()[-3:]
    reference = [sys.executable, "-c", REFERENCE_SPEAK, str(checkpoint), str(bundle), voice, str(noise), TEXT,
                 str(work / "reference_latents.npy"), str(args.threads)]
    proc = run_phase("speak_pytorch_reference", reference, results, work)
    if proc.returncode == 0:
        results["speak_pytorch_reference"].update(json.loads(proc.stdout.strip().splitlines()[-1]))
    return save(results, args)


if __name__ == "__main__":
    run(main)
