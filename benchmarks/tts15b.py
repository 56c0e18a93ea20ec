"""VibeVoice-1.5B end to end on a synthetic checkpoint: build time and memory, gates, and `speak` of a
two-speaker script against the PyTorch reference on the same weights, script, voices and noise.

    .venv/bin/python benchmarks/tts15b.py --size full --workdir bench-out/15b [--precision int8]

Each phase runs in its own process so its peak memory (max RSS) is its own. Voices: the real speech
fixture (44.1 kHz, resampled) and a generated sample. Results go to WORKDIR/results.json. Not part of CI.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from phases import CLI, parse_arguments, prepare, run, run_phase, save

SCRIPT = (
    "Speaker 1: Welcome back to the show. Today we talk about running speech models on ordinary computers.\n"
    "Speaker 2: Thanks for having me. It is a topic close to my heart.\n"
    "Speaker 1: Let us start with the basics, then."
)
SPEECH = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "audio" / "demo3-hotwords.wav"

REFERENCE_SPEAK = """
import json, sys, time, numpy as np, torch
from vibevoice_onnx.audio import voice_from_file
from vibevoice_onnx.generation.tts15b import LongFormResult, TokenIds, long_form_frames, prompt_embeddings
from vibevoice_onnx.reference.tts15b import TorchTts15bBackend, load_tts15b
from vibevoice_onnx.runtime.bundle import Bundle
from vibevoice_onnx.sampling import NoiseSource
from vibevoice_onnx.script import build_prompt, parse_script
checkpoint, bundle_dir, script, noise_path, out, threads, *voices = sys.argv[1:]
torch.set_num_threads(int(threads))
bundle = Bundle(bundle_dir)
reference = load_tts15b(checkpoint)
samples = [bundle.voice(v).samples if v in bundle.voices() else voice_from_file(v).samples for v in voices]
prompt = build_prompt(bundle.tokenizer, parse_script(script), [-(-len(s) // 3200) for s in samples])
noise = NoiseSource.from_file(noise_path)
backend, result = TorchTts15bBackend(reference), LongFormResult()
with torch.no_grad():
    start = time.perf_counter(); first = None
    embeds = prompt_embeddings(backend, prompt, samples, None)
    for chunk in long_form_frames(backend, embeds, TokenIds.from_tokenizer(bundle.tokenizer), noise, 1.3, 10, noise.frames, result):
        first = first or time.perf_counter() - start
    wall = time.perf_counter() - start
np.save(out, np.stack(result.latents))
audio = result.frames * 3200 / 24000
print(json.dumps({"frames": result.frames, "audio_seconds": audio, "wall_seconds": round(wall, 3),
                  "seconds_per_latent_after_first": round((wall - first) / (result.frames - 1), 4),
                  "real_time_factor": round(wall / audio, 4), "first_audio_seconds": round(first, 4),
                  "prompt_tokens": len(prompt.ids)}))
"""


def main() -> int:
    args = parse_arguments(__doc__, "bench-out/15b", 24, "latents", ("fp32", "int8", "int4"))
    work = args.workdir
    checkpoint, bundle = work / "checkpoint", work / "onnx" / "1.5b" / "cpu_fp32"
    results: dict = {"size": args.size, "frames": args.frames, "threads": args.threads, "script": SCRIPT,
                     "precision": args.precision}
    sample = work / "generated-voice.wav"
    import numpy as np
    import soundfile as sf

    t = np.arange(int(3.1 * 24000)) / 24000
    sf.write(str(sample), (0.2 * np.sin(2 * np.pi * 150 * t + 2 * np.sin(2 * np.pi * 4 * t))).astype(np.float32), 24000)
    if not args.speak_only:
        prepare("1.5b", args.size, work, checkpoint, bundle, (("speech", SPEECH), ("generated", sample)), results)
    if args.precision != "fp32":  # built from the fp32 sibling, its voices carried over
        bundle = bundle.with_name(f"cpu_{args.precision}")
        if not args.speak_only:
            run_phase(f"build_{args.precision}", [*CLI, "build", str(checkpoint), "-o", str(work / "onnx"), "--precision",
                                                  args.precision], results, work)
            proc = run_phase(f"verify_{args.precision}", [*CLI, "verify", str(bundle), "--json"], results, work)
            if proc.returncode in (0, 1):
                results[f"verify_{args.precision}"]["passed"] = json.loads(proc.stdout)["passed"]
    noise = work / "noise.npy"
    np.save(noise, np.stack([np.random.default_rng([42, i]).standard_normal(64, dtype=np.float32) for i in range(args.frames)]))
    speak = [*CLI, "speak", str(bundle), SCRIPT, "--speaker", "1=speech", "--speaker", "2=generated", "--noise", str(noise),
             "--voice-latents", "mean", "--max-frames", str(args.frames), "--threads", str(args.threads),
             "-o", str(work / "dialogue.wav"), "--save-latents", str(work / "onnx_latents.npy")]
    proc = run_phase("speak_onnx", speak, results, work)
    results["speak_onnx"]["summary"] = proc.stderr.strip().splitlines()[-3:]
    found = re.search(r"wall ([\d.]+) s, real-time factor ([\d.]+), first audio after ([\d.]+) s", proc.stderr)
    if found:
        wall, rtf, first = map(float, found.groups())
        results["speak_onnx"].update(wall_seconds=wall, real_time_factor=rtf, first_audio_seconds=first,
                                     seconds_per_latent_after_first=round((wall - first) / (args.frames - 1), 4))
    reference = [sys.executable, "-c", REFERENCE_SPEAK, str(checkpoint), str(bundle), SCRIPT, str(noise),
                 str(work / "reference_latents.npy"), str(args.threads), "speech", "generated"]
    proc = run_phase("speak_pytorch_reference", reference, results, work)
    if proc.returncode == 0:
        results["speak_pytorch_reference"].update(json.loads(proc.stdout.strip().splitlines()[-1]))
        ours, theirs = np.load(work / "onnx_latents.npy"), np.load(work / "reference_latents.npy")
        cos = [float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))) for a, b in zip(ours, theirs)]
        results["speak_latent_min_cosine"] = min(cos) if cos else None
    return save(results, args)


if __name__ == "__main__":
    run(main)
