"""VibeVoice-ASR-BitNet against Microsoft's own runtime (VibeASR.cpp: BitNet's I2_S kernels for the LM, I8_S for
the encoders), on one checkpoint and one recording, where their tools are built; ours alone where they are not.

    .venv/bin/python benchmarks/bitnet.py --size full --workdir bench-out/bitnet [--tokens 32] [--threads 2] \\
        [--vibeasr DIR] [--bitnet-cpp DIR --lm-gguf FILE]

Ours: `make-checkpoint asr-bitnet` (once), `build --precision int8`, `verify`, then the shared greedy loop
(benchmarks/asr.py's timed loop: encoding, the prefill, the decode rate; stop tokens ignored) and `transcribe`,
each phase in its own process with its wall time and peak memory. Theirs, with --vibeasr (a VibeASR.cpp checkout
built with cmake, see docs/bitnet.md): the same checkpoint converted by their scripts to F32 GGUF, quantized by
their llama-quantize (LM I2_S with Q6_K embeddings, encoders I8_S; once, kept in WORKDIR/gguf), and their
asr_infer on the same recording at the same thread count; its own timing lines are kept as it prints them.
With --bitnet-cpp (Microsoft's BitNet.cpp built with cmake) and --lm-gguf (the same checkpoint's LM converted by
VibeASR.cpp's utils/convert_lm_to_gguf.py and quantized by BitNet.cpp's `llama-quantize --token-embedding-type
Q6_K IN OUT I2_S 1 1`), the language models alone, as llama-bench measures one: their `llama-bench -p P -n T -t
THREADS` (prompt processing and generation, tokens a second, each its own test) against ours on the same P random
token ids then T greedy tokens (the LM and the tied head a token, as their generation test counts it; our LM step
alone beside it). Synthetic weights make both transcripts noise: only speed and memory are compared. Results go to
WORKDIR/results.json. Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from asr import SPEECH, TIMED_LOOP
from phases import CLI, run, run_phase, write_results


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


# Ours as llama-bench times theirs: a prompt of P token ids in one prefill, then T greedy tokens (the LM step and
# the tied head each), after a warm-up of the same shapes.
LM_LOOP = """
import json, sys, time
from pathlib import Path
import numpy as np
from vibevoice_onnx.generation.asr import prefill
from vibevoice_onnx.runtime.asr import OnnxAsrBackend
from vibevoice_onnx.runtime.bundle import Bundle, share_threads
bundle_dir, prompt, tokens, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
share_threads(threads)  # one spinning pool for every session, as the command line runs them
backend = OnnxAsrBackend(Bundle(Path(bundle_dir), threads=threads))
ids = np.random.default_rng(0).integers(0, backend.embed_table.shape[0], prompt)
def run(count):
    stream = backend.lm_stream(prompt + count)
    start = time.perf_counter()
    hidden = prefill(stream, backend.embed(ids))
    prefilled, steps, heads = time.perf_counter(), [], []
    for _ in range(count):
        t = time.perf_counter()
        token = int(np.argmax(backend.logits(hidden)))
        heads.append(time.perf_counter() - t)
        t = time.perf_counter()
        hidden = stream.step(backend.embed([token]))[:, -1]
        steps.append(time.perf_counter() - t)
    return prefilled - start, time.perf_counter() - prefilled, steps, heads
run(2)
prefill_seconds, decode_seconds, steps, heads = run(tokens)
print(json.dumps({"prompt_tokens": prompt, "tokens": tokens, "prefill_tokens_per_second": round(prompt / prefill_seconds, 1),
                  "decode_tokens_per_second": round(tokens / decode_seconds, 2),
                  "ms_a_token": round(1e3 * decode_seconds / tokens, 2),
                  "lm_step_ms_median": round(1e3 * float(np.median(steps)), 2),
                  "head_ms_median": round(1e3 * float(np.median(heads)), 2)}))
"""


def language_models(args, bundle: Path, results: dict, work: Path) -> None:
    """Both LMs alone, as llama-bench measures one (see LM_LOOP), the same prompt length, tokens and threads."""
    bench = Path(args.bitnet_cpp) / "build" / "bin" / "llama-bench"
    if not bench.is_file():
        raise SystemExit(f"{bench}: missing; build BitNet.cpp first (docs/bitnet.md)")
    proc = run_phase("lm_ours", [sys.executable, "-c", LM_LOOP, str(bundle), str(args.prompt_tokens), str(args.tokens),
                                 str(args.threads)], results, work)
    if proc.returncode == 0:
        results["lm_ours"].update(json.loads(proc.stdout.strip().splitlines()[-1]))
    proc = run_phase("lm_bitnet_cpp", [str(bench), "-m", str(args.lm_gguf), "-p", str(args.prompt_tokens), "-n",
                                       str(args.tokens), "-t", str(args.threads), "-o", "json"], results, work)
    if proc.returncode == 0:
        tests = json.loads(proc.stdout)
        results["lm_bitnet_cpp"]["tests"] = [{k: t.get(k) for k in ("n_prompt", "n_gen", "avg_ts", "stddev_ts", "model_size",
                                                                     "type_k", "cpu_info")} for t in tests]


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
    parser.add_argument("--bitnet-cpp", help="a built BitNet.cpp checkout: also time both language models alone")
    parser.add_argument("--lm-gguf", type=Path, help="with --bitnet-cpp: the checkpoint's LM as I2_S GGUF")
    parser.add_argument("--prompt-tokens", type=int, default=363, help="with --bitnet-cpp: the prompt's length")
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
    if args.bitnet_cpp:
        if args.lm_gguf is None:
            parser.error("--bitnet-cpp needs --lm-gguf")
        language_models(args, work / "onnx" / "asr-bitnet" / "cpu_int8", results, work)
    if args.vibeasr:
        theirs(args, work, checkpoint, results)
    return write_results(results, work)


if __name__ == "__main__":
    run(main)
