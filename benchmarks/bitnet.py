"""VibeVoice-ASR-BitNet against Microsoft's own runtime (VibeASR.cpp: BitNet's I2_S kernels for the LM, I8_S for
the encoders), on one checkpoint and one recording, where their tools are built; ours alone where they are not.

    .venv/bin/python benchmarks/bitnet.py --size full --workdir bench-out/bitnet [--tokens 32] [--threads 2] \\
        [--vibeasr DIR]

Ours: `make-checkpoint asr-bitnet` (once), `build --precision int8`, `verify`, then the shared greedy loop
(benchmarks/asr.py's timed loop: encoding, the prefill, the decode rate; stop tokens ignored) and `transcribe`,
each phase in its own process with its wall time and peak memory. Theirs, with --vibeasr (a VibeASR.cpp checkout
built with cmake, see docs/bitnet.md): the same checkpoint converted by their scripts to F32 GGUF, quantized by
their llama-quantize (LM I2_S with Q6_K embeddings, encoders I8_S; once, kept in WORKDIR/gguf), and their
asr_infer on the same recording at the same thread count; its own timing lines are kept as it prints them.
Synthetic weights make both transcripts noise: only speed and memory are compared. Results go to
WORKDIR/results.json. Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from asr import SPEECH, TIMED_LOOP
from phases import CLI, header, run, run_phase


def ours(args, work: Path, checkpoint: Path, results: dict) -> None:
    run_phase("build_int8", [*CLI, "build", str(checkpoint), "-o", str(work / "onnx"), "--precision", "int8"], results, work)
    bundle = work / "onnx" / "asr-bitnet" / "cpu_int8"
    results["bundle_gb"] = round(sum(f.stat().st_size for f in bundle.iterdir() if f.is_file()) / 1e9, 2)
    proc = run_phase("verify_int8", [*CLI, "verify", str(bundle), "--json"], results, work)
    if proc.returncode in (0, 1):
        results["verify_int8"]["passed"] = json.loads(proc.stdout)["passed"]
    loop = [sys.executable, "-c", TIMED_LOOP, "runtime", str(bundle), str(checkpoint), str(args.audio), str(args.tokens),
            str(args.threads), ""]
    proc = run_phase("loop_int8", loop, results, work)
    if proc.returncode == 0:
        record = json.loads(proc.stdout.strip().splitlines()[-1])
        record.pop("tokens")
        results["loop_int8"].update(record)
    run_phase("transcribe_int8", [*CLI, "transcribe", str(bundle), str(args.audio), "--max-new-tokens", str(args.tokens),
                                  "--threads", str(args.threads)], results, work)


def theirs(args, work: Path, checkpoint: Path, results: dict) -> None:
    """Microsoft's conversion (once) and one asr_infer run; their printed timing lines are the record."""
    tool, gguf = Path(args.vibeasr), work / "gguf"
    binaries = tool / "build" / "bin"
    for needed in (binaries / "asr_infer", binaries / "llama-quantize"):
        if not needed.is_file():
            raise SystemExit(f"{needed}: missing; build VibeASR.cpp first (cmake -B build && cmake --build build)")
    vae, lm = gguf / "vibeasr-vae-encoder-i8_s.gguf", gguf / "vibeasr-lm-i2_s-embed-q6_k.gguf"
    if not (vae.is_file() and lm.is_file()):
        convert(tool, gguf, checkpoint, vae, lm, results, work)
    results["gguf_gb"] = round((vae.stat().st_size + lm.stat().st_size) / 1e9, 2)
    proc = run_phase("vibeasr_asr_infer", [str(binaries / "asr_infer"), "--vae-model", str(vae), "--lm-model", str(lm),
                                           "--audio", str(args.audio), "-t", str(args.threads),
                                           *args.vibeasr_args.split()], results, work)
    results["vibeasr_asr_infer"]["printed"] = [line for line in (proc.stdout + proc.stderr).splitlines()
                                               if any(w in line.lower() for w in ("ms", "tok", "rtf", "time", "speed"))]


def convert(tool: Path, gguf: Path, checkpoint: Path, vae: Path, lm: Path, results: dict, work: Path) -> None:
    """Their scripts write F32 GGUF files beside the weights, and their LM converter rewrites config.json and moves
    the shards while it runs: so they work in a folder of their own, links to the shards, copies of the rest."""
    import shutil

    gguf.mkdir(exist_ok=True)
    for source in checkpoint.iterdir():
        target = gguf / source.name
        if target.exists() or target.is_symlink():
            continue
        if source.suffix == ".safetensors":
            target.symlink_to(source.resolve())
        else:
            shutil.copy(source, target)
    python = os.environ.get("VIBEASR_PYTHON", sys.executable)
    run_phase("vibeasr_convert_lm", [python, str(tool / "utils" / "convert_lm_to_gguf.py"), str(gguf)], results, work)
    run_phase("vibeasr_convert_vae", [python, str(tool / "utils" / "convert_vae_to_gguf.py"), str(gguf)], results, work)
    quantize = str(tool / "build" / "bin" / "llama-quantize")
    run_phase("vibeasr_quantize_vae", [quantize, str(gguf / "vibeasr-vae-encoder-f32.gguf"), str(vae), "I8_S", "1", "1"],
              results, work)
    run_phase("vibeasr_quantize_lm", [quantize, "--token-embedding-type", "Q6_K", str(gguf / "vibeasr-lm-f32.gguf"),
                                      str(lm), "I2_S", "1", "1"], results, work)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["tiny", "full"], default="full")
    parser.add_argument("--workdir", default="bench-out/bitnet")
    parser.add_argument("--audio", type=Path, default=SPEECH)
    parser.add_argument("--tokens", type=int, default=32, help="greedy tokens to generate (stop tokens ignored)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--vibeasr", help="a built VibeASR.cpp checkout: also run Microsoft's runtime")
    parser.add_argument("--vibeasr-args", default="", help="more arguments for their asr_infer")
    parser.add_argument("--skip-ours", action="store_true", help="time Microsoft's runtime only")
    args = parser.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    checkpoint = work / "checkpoint"
    results = {"size": args.size, "tokens": args.tokens, "threads": args.threads, "audio": str(args.audio)}
    if not (checkpoint / "config.json").is_file():
        run_phase("make_checkpoint", [*CLI, "make-checkpoint", "asr-bitnet", str(checkpoint), "--size", args.size],
                  results, work)
    if not args.skip_ours:
        ours(args, work, checkpoint, results)
    if args.vibeasr:
        theirs(args, work, checkpoint, results)
    results = {**header(), **results}
    (work / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    run(main)
