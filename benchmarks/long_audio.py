"""An hour of audio against a minute: `transcribe` of a long recording and of its first 60 s, each in its own
process, with wall time, real-time factor and peak memory (issue 40: users report an hour needing 34 GB).

    .venv/bin/python benchmarks/long_audio.py onnx/asr/cpu_int8 onnx/asr/cpu_int4-mixed --minutes 60 \\
        --workdir bench-out/long-audio --out benchmarks/results/DATE-long-audio.json

The recording is the speech fixture (../shared/fixtures/audio) and silence in turn, 24 kHz 16-bit, made once
in the workdir. Each run: `transcribe BUNDLE FILE --format json --mean-latents --max-new-tokens N` under GNU time
(peak RSS). Decoding N tokens costs the same for either length but for reading a longer cache, so the runs
compare what length changes: the encoders (60 s segments with their states carried), the prompt's prefill (in
calls of 512 tokens) and the KV cache it leaves. A benchmark, not a test: not in CI.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import soundfile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from phases import CLI, header, run, run_phase  # noqa: E402

SPEECH = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "audio" / "demo3-hotwords.wav"
RATE = 24000


def recording(path: Path, seconds: float, silence: float = 5.0) -> Path:
    """`seconds` of the speech fixture and `silence` seconds of silence in turn, written once."""
    if path.is_file():
        return path
    from vibevoice_onnx.audio import read_audio

    speech, _ = read_audio(SPEECH)
    turn = np.concatenate([speech, np.zeros(int(silence * RATE), np.float32)])
    total = int(seconds * RATE)
    with soundfile.SoundFile(path, "w", RATE, 1, "PCM_16") as out:
        for start in range(0, total, len(turn)):
            out.write(turn[:total - start])
    return path


def context_memory(bundle: Path, samples: int) -> dict:
    """The prompt's positions for `samples` of audio and the fp32 KV cache they fill: what the LM's context needs."""
    from vibevoice_onnx.runtime.bundle import Bundle
    from vibevoice_onnx.transcription import prompt_builder

    opened = Bundle(bundle)
    positions = len(prompt_builder(opened.kind)(opened.tokenizer, samples).ids)
    lm = opened.dims.lm
    return {"prompt_positions": positions,
            "kv_cache_gb": round(lm.layers * 2 * lm.kv_heads * lm.head_dim * 4 * positions / 2**30, 2)}


def write(results: dict, args: argparse.Namespace) -> str:
    """The results so far, after every run: an hour-long run that dies leaves the runs before it."""
    text = json.dumps({**header(), **results}, indent=2) + "\n"
    for path in (args.workdir / "results.json", args.out):
        if path:
            path.write_text(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundles", nargs="+", type=Path, help="ASR bundles (say the int8 and int4-mixed ones)")
    parser.add_argument("--minutes", type=float, default=60.0, help="the long recording (default 60)")
    parser.add_argument("--short-seconds", type=float, default=60.0, help="the short one (default 60)")
    parser.add_argument("--tokens", type=int, default=32, help="greedy tokens each run decodes at most (default 32)")
    parser.add_argument("--force", action="store_true", help="run bundles whose gates have not run (a cost, not a quality)")
    parser.add_argument("--workdir", type=Path, default=Path("bench-out/long-audio"))
    parser.add_argument("--out", type=Path, help="also write the results here (benchmarks/results/DATE-....json)")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    lengths = {"short": args.short_seconds, "long": 60 * args.minutes}
    files = {name: recording(args.workdir / f"{name}-{seconds:g}s.wav", seconds) for name, seconds in lengths.items()}
    results: dict = {"tokens": args.tokens, "recordings": {name: {"seconds": s, "file": str(files[name])}
                                                            for name, s in lengths.items()}}
    for bundle in args.bundles:
        for name, seconds in lengths.items():
            label = f"{bundle.name}-{name}"
            command = [*CLI, "transcribe", str(bundle), str(files[name]), "--format", "json", "--mean-latents",
                       "--max-new-tokens", str(args.tokens), *(["--force"] if args.force else [])]
            phase: dict = {}
            run_phase(label, command, phase, args.workdir)
            record = {**phase[label], "command": " ".join(["vibevoice-onnx", *command[3:]]), "audio_seconds": seconds,
                      **context_memory(bundle, int(seconds * RATE))}
            if not record["exit"]:
                record["real_time_factor"] = round(record["seconds"] / seconds, 4)
            results[label] = record  # a run at the top level: the docs' benchmarks page tabulates it
            write(results, args)
        short, long = (results[f"{bundle.name}-{n}"] for n in ("short", "long"))
        if short["exit"] or long["exit"]:
            continue
        growth = long["peak_rss_gb"] - short["peak_rss_gb"]
        results[f"{bundle.name}: long over short"] = {
            "peak_rss_long_over_short": round(long["peak_rss_gb"] / max(short["peak_rss_gb"], 1e-9), 3),
            "peak_rss_growth_gb": round(growth, 2),
            "growth_beyond_the_kv_cache_gb": round(growth - (long["kv_cache_gb"] - short["kv_cache_gb"]), 2),
            "seconds_long_over_short": round(long["seconds"] / max(short["seconds"], 1e-9), 2)}
    print(write(results, args))
    return 0


if __name__ == "__main__":
    run(main)
