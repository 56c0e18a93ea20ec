"""How a TTS bundle's speed scales with CPU threads: `bench --threads N --json` for each N, each in its own process,
the counts interleaved over --rounds rounds so that every count sees the same machine, into one dated file.

    .venv/bin/python benchmarks/threads.py BUNDLE [--threads 1,2,4,8,16] [--frames 48] [--rounds 2] [--json FILE]

Counts above the cores this process may use are skipped and said so (more threads than cores only contend). For
each count: RTF, first audio (cold and warm), ms a latent of the upper LM and the decoder, and peak memory, the
median over the rounds with every round's value beside it. Run it on the 2-core CI machines for 1 and 2, and on a
device machine's 16 cores (after benchmarks/gpu.py) for the rest. Not part of CI (tests/test_benchmarks.py runs a
tiny bundle at 1 and 2 threads).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
from pathlib import Path

from phases import CLI, header, print_results, run

MEASURES = {"real_time_factor": "real_time_factor", "first_audio_seconds": "first_audio_seconds",
            "warm_first_audio_seconds": "warm_first_audio_seconds", "peak_memory_bytes": "peak_memory_bytes"}


def bench_once(bundle: Path, threads: int, frames: int, voice: str | None) -> dict:
    command = [*CLI, "bench", str(bundle), "--threads", str(threads), "--frames", str(frames), "--json",
               *(["--voice", voice] if voice else [])]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    report = json.loads(proc.stdout)["runtime"]
    graphs = {name: round(cost["ms_per_frame"], 2) for name, cost in report["graphs"].items()}
    return {**{key: report[field] for key, field in MEASURES.items()}, "graphs_ms_per_frame": graphs}


def summary(rounds: list[dict]) -> dict:
    """Each measure's median over the rounds, and every round's value."""
    out = {key: {"median": statistics.median(r[key] for r in rounds), "rounds": [r[key] for r in rounds]} for key in MEASURES}
    names = rounds[0]["graphs_ms_per_frame"]
    out["graphs_ms_per_frame"] = {n: statistics.median(r["graphs_ms_per_frame"][n] for r in rounds) for n in names}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--threads", default="1,2,4,8,16", help="thread counts, comma-separated")
    parser.add_argument("--frames", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--voice")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    counts = [int(n) for n in args.threads.split(",")]
    runnable, skipped = [n for n in counts if n <= cores], [n for n in counts if n > cores]
    if not runnable:
        raise SystemExit(f"none of the thread counts {counts} fits the {cores} cores this process may use")
    measured = {n: [] for n in runnable}
    for round_ in range(args.rounds):
        for n in runnable:
            measured[n].append(bench_once(args.bundle, n, args.frames, args.voice))
            print(f"round {round_ + 1}, {n} threads: RTF {measured[n][-1]['real_time_factor']:.3f}", flush=True)
    results = {**header(), "bundle": str(args.bundle), "cores": cores, "frames": args.frames, "rounds": args.rounds,
               "skipped_thread_counts": skipped, "threads": {str(n): summary(r) for n, r in measured.items()}}
    return print_results(results, args.json)


if __name__ == "__main__":
    run(main)
