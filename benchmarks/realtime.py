"""Realtime end to end on a synthetic checkpoint: build time and memory, gates, and speak speed against the
PyTorch reference on the same weights, text, voice and noise.

    .venv/bin/python benchmarks/realtime.py --size full --workdir bench-out/full

Each phase runs in its own process so its peak memory (max RSS) is its own. Results go to
WORKDIR/results.json and are printed as they come. Not part of CI: a full-size run takes many minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

TEXT = (
    "VibeVoice turns text into speech one frame at a time. This benchmark measures how fast the ONNX runtime "
    "speaks compared with the PyTorch reference, on the same weights."
)
VOICES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "voices"
CLI = [sys.executable, "-m", "vibevoice_onnx.cli"]


def run_phase(name: str, command: list[str], results: dict, workdir: Path) -> subprocess.CompletedProcess:
    """Run one phase in a child process and record its wall time and peak RSS (GNU time)."""
    log = workdir / f"{name}.time"
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", "-o", str(log), *command], capture_output=True, text=True)
    wall = time.perf_counter() - start
    peak = next((int(line.split()[-1]) for line in log.read_text().splitlines() if "Maximum resident" in line), 0)
    results[name] = {"seconds": round(wall, 1), "peak_rss_gb": round(peak / 2**20, 2), "exit": proc.returncode}
    print(f"{name}: {results[name]}", flush=True)
    if proc.returncode:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
    return proc


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


def prepare(args, work: Path, checkpoint: Path, bundle: Path, voices, results: dict) -> None:
    """Make (once), build, import voices and verify, each phase timed."""
    if not (checkpoint / "config.json").is_file():
        run_phase("make_checkpoint", [*CLI, "make-checkpoint", "realtime", str(checkpoint), "--size", args.size], results, work)
    run_phase("build", [*CLI, "build", str(checkpoint), "-o", str(work / "onnx")], results, work)
    for name, preset in voices:
        proc = run_phase(f"import_{name}", [*CLI, "voices", "import", str(bundle), str(preset), "--name", name, "--force"], results, work)
        results[f"import_{name}"]["message"] = proc.stdout.strip()
    proc = run_phase("verify", [*CLI, "verify", str(bundle), "--json"], results, work)
    if proc.returncode in (0, 1):
        parity = json.loads(proc.stdout)
        results["verify"]["passed"] = parity["passed"]
        results["verify"]["gates"] = {g["name"]: [g["cosine"], g["max_abs"], g["passed"]] for g in parity["gates"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["tiny", "full"], default="full")
    parser.add_argument("--workdir", default="bench-out/realtime")
    parser.add_argument("--frames", type=int, default=48, help="speech frames to generate (7.5 per second)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--speak-only", action="store_true", help="reuse WORKDIR's bundle: time speak phases only")
    args = parser.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    checkpoint, bundle = work / "checkpoint", work / "onnx" / "realtime" / "cpu_fp32"
    results: dict = {"size": args.size, "frames": args.frames, "threads": args.threads, "text": TEXT}

    voices = [("synthetic", checkpoint / "voices" / "synthetic.pt")]
    if args.size == "full" and VOICES.is_dir():
        voices += [(p.stem, p) for p in sorted(VOICES.glob("*.pt"))]
    if not args.speak_only:
        prepare(args, work, checkpoint, bundle, voices, results)

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
    (work / ("speak.json" if args.speak_only else "results.json")).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.exit(main())
