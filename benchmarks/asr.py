"""VibeVoice-ASR on a synthetic checkpoint: memory-bounded builds (int8, int4), and `transcribe` of the real
speech fixture against the PyTorch reference on the same weights, audio and prompt (the fp32 reference,
reading each LM layer from the shards as it runs: the 7B model fits 24 GB neither in fp32 nor in bf16).

    .venv/bin/python benchmarks/asr.py --size full --workdir bench-out/asr [--precisions int4,int8] [--tokens 32]

Each phase runs in its own process so its peak memory (max RSS) is its own. Both sides run the shared greedy
loop (generation/asr.py) on encoder means; the reference is then fed the runtime's tokens in one pass, which
says how many of them its own greedy choice agrees with. Results go to WORKDIR/results.json. Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from phases import CLI, run, run_phase, write_results

SPEECH = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "audio" / "demo3-hotwords.wav"

# Times the shared loop on either backend: encoding, the prefill (up to the first token), then the decode rate.
TIMED_LOOP = """
import json, sys, time
from pathlib import Path
from vibevoice_onnx.audio import db_normalize, read_audio
from vibevoice_onnx.generation.asr import audio_embeddings, forced_logits, greedy_agreement, transcribe_tokens, TranscriptionResult
from vibevoice_onnx.transcription import prompt_builder
from vibevoice_onnx.runtime.bundle import Bundle
side, bundle_dir, checkpoint, audio, tokens, threads, compare_with = sys.argv[1:]
if side == "runtime":  # one spinning pool for every session, as the command line runs them
    from vibevoice_onnx.runtime.bundle import share_threads
    share_threads(int(threads))
bundle = Bundle(Path(bundle_dir), threads=int(threads))  # sessions open only when the runtime side asks
samples = db_normalize(read_audio(Path(audio))[0])
if side == "reference":
    import torch
    torch.set_num_threads(int(threads))
    from vibevoice_onnx.reference.asr import load_asr_layer_streamed
    backend = load_asr_layer_streamed(checkpoint)
else:
    from vibevoice_onnx.runtime.asr import OnnxAsrBackend
    backend = OnnxAsrBackend(bundle)
prompt = prompt_builder(bundle.kind)(bundle.tokenizer, len(samples), None)  # ASR's JSON prompt, BitNet's plain text
start = time.perf_counter()
embeddings = audio_embeddings(backend, samples, None)
encoded = time.perf_counter()
result, stamps = TranscriptionResult(), []
for _ in transcribe_tokens(backend, prompt, embeddings, set(), int(tokens), result):
    stamps.append(time.perf_counter())
record = {"audio_seconds": round(len(samples) / 24000, 2), "prompt_tokens": len(prompt.ids),
          "encode_seconds": round(encoded - start, 2), "prefill_seconds": round(stamps[0] - encoded, 2),
          "prefill_tokens_per_second": round(len(prompt.ids) / (stamps[0] - encoded), 1),
          "decode_tokens_per_second": round((len(stamps) - 1) / (stamps[-1] - stamps[0]), 3), "tokens": result.tokens}
if compare_with:  # the other side's greedy tokens, fed in one pass: where this side's greedy pick agrees
    theirs = json.loads(Path(compare_with).read_text())["tokens"]
    record["forced_agreement"] = greedy_agreement(theirs, forced_logits(backend, prompt, embeddings, theirs))
    record["forced_of"] = len(theirs)
print(json.dumps(record))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["tiny", "full"], default="full")
    parser.add_argument("--workdir", default="bench-out/asr")
    parser.add_argument("--precisions", default="int4,int8")
    parser.add_argument("--tokens", type=int, default=32, help="greedy tokens to generate (stop tokens ignored)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--tokenizer", help="a Qwen2.5 tokenizer.json (default: the synthetic checkpoint's own)")
    parser.add_argument("--skip-build", action="store_true", help="reuse WORKDIR's bundles")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--reference-tokens", type=int, default=3, help="tokens the layer-streamed reference decodes")
    args = parser.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    checkpoint, results = work / "checkpoint", {"size": args.size, "tokens": args.tokens, "threads": args.threads}
    if not (checkpoint / "config.json").is_file():
        run_phase("make_checkpoint", [*CLI, "make-checkpoint", "asr", str(checkpoint), "--size", args.size], results, work)
    tokenizer = ["--tokenizer", args.tokenizer] if args.tokenizer else []
    precisions = args.precisions.split(",")
    for precision in precisions:
        if not args.skip_build:
            run_phase(f"build_{precision}", [*CLI, "build", str(checkpoint), "-o", str(work / "onnx"), "--precision",
                                             precision, *tokenizer], results, work)
        bundle = work / "onnx" / "asr" / f"cpu_{precision}"
        results[f"bundle_{precision}_gb"] = round(sum(f.stat().st_size for f in bundle.iterdir() if f.is_file()) / 1e9, 2)
        loop = [sys.executable, "-c", TIMED_LOOP, "runtime", str(bundle), str(checkpoint), str(SPEECH), str(args.tokens),
                str(args.threads), ""]
        proc = run_phase(f"transcribe_{precision}", loop, results, work)
        if proc.returncode == 0:
            results[f"transcribe_{precision}"].update(json.loads(proc.stdout.strip().splitlines()[-1]))
            (work / f"tokens_{precision}.json").write_text(json.dumps(results[f"transcribe_{precision}"]))
    if not args.skip_reference:
        # The fp32 reference of a 7B model does not fit 24 GB (nor does its bf16 copy beside a Python process):
        # it reads each LM layer from the shards as it runs, so each decode step reads the whole LM. It decodes
        # a few tokens for its rate, then is fed the first precision's tokens in one pass to judge them.
        bundle = work / "onnx" / "asr" / f"cpu_{precisions[0]}"  # for its tokenizer only
        loop = [sys.executable, "-c", TIMED_LOOP, "reference", str(bundle), str(checkpoint), str(SPEECH),
                str(args.reference_tokens), str(args.threads), str(work / f"tokens_{precisions[0]}.json")]
        proc = run_phase("transcribe_pytorch_reference", loop, results, work)
        if proc.returncode == 0:
            results["transcribe_pytorch_reference"].update(json.loads(proc.stdout.strip().splitlines()[-1]))
    return write_results(results, work)


if __name__ == "__main__":
    run(main)
