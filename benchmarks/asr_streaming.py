"""VibeVoice-ASR-Streaming on a synthetic checkpoint: memory-bounded builds, then live transcription of the real
speech fixture played at the speed of speech, next to the non-streaming ASR loop on the same graphs and audio.

    .venv/bin/python benchmarks/asr_streaming.py --variant 1.5b --workdir bench-out/asr-streaming-1.5b \
        [--precisions int8,int4] [--repeat 3] [--tokens-per-chunk 8,12,16]

Live: the fixture (looped --repeat times) is handed to StreamingTranscriber in 0.1 s pieces as a microphone would
hand them (a piece is never early; when decoding falls behind, pieces wait and the delay shows). Per chunk: the
time from the chunk's last sample to its text (the chunk's lookahead, 0.53 s, is part of it: no chunk can be
decoded before its window is complete) and from the window's last sample (the decoding and any backlog), and
the work a chunk costs (the encoders run while its audio arrives, the rest once its window is complete); RTF is
all the work over the audio's duration: under 1 keeps up. A random-weight model never ends a chunk by itself, so every chunk decodes
--tokens-per-chunk tokens, a live run for each count (real speech, facts sheet 12.11: the cache grows about 16
positions a second, 29 of each 2.93 s chunk's 47 being the window and its chunk end: ~18 text tokens a chunk of
dense speech, fewer for slow or sparse speech). The non-streaming side runs VibeVoice-ASR's loop (generation/asr.py: the whole recording encoded, one
prefill, greedy tokens) on the same graphs for the same number of tokens: its text comes after the whole audio.
Each phase is its own process (its peak RSS its own). Results go to WORKDIR/results.json. Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from phases import CLI, cpu_flags, header, run, run_phase

SPEECH = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "audio" / "demo3-hotwords.wav"

LIVE = """
import json, statistics, sys, time
import numpy as np
from vibevoice_onnx.audio import read_audio
from vibevoice_onnx.runtime.asr_streaming import PIECE_SECONDS, StreamingTranscriber
from vibevoice_onnx.runtime.bundle import share_threads
bundle, audio, repeat, per_chunk, threads, ahead = sys.argv[1:]
share_threads(int(threads))  # as transcribe --stream runs it: one onnxruntime pool for every session
samples = np.tile(read_audio(audio)[0], int(repeat))
live = StreamingTranscriber(bundle, max_tokens_per_chunk=int(per_chunk), seed=0,
                            encode_ahead=None if ahead == "default" else int(ahead),
                            force=True)  # timed whatever its gates said (results.json says)
geometry, rate = live.geometry, live.geometry.sample_rate
step, after_window, busy, started = int(PIECE_SECONDS * rate), [], 0.0, time.monotonic()
for start in range(0, len(samples), step):
    due = started + min(start + step, len(samples)) / rate
    time.sleep(max(0.0, due - time.monotonic()))
    began = time.monotonic()
    for chunk in live.feed(samples[start:start + step], rate):
        after_window.append(chunk.ready_at - due)
    busy += time.monotonic() - began
end_of_audio, began = started + len(samples) / rate, time.monotonic()
for chunk in live.finish():
    after_window.append(chunk.ready_at - end_of_audio)
busy += time.monotonic() - began
lookahead = geometry.lookahead_frames * geometry.hop / rate
# the chunk's last sample came `lookahead` before its window's, except for windows cut by the end of the audio
after_chunk = [a + min(lookahead, max(0.0, len(samples) / rate - c.end)) for a, c in zip(after_window, live.chunks)]
decode = [c.seconds for c in live.chunks]
seconds = len(samples) / rate
print(json.dumps({"audio_seconds": round(seconds, 2), "chunks": len(live.chunks),
                  "tokens_per_chunk": statistics.mean(len(c.tokens) for c in live.chunks),
                  "chunk_seconds": round(geometry.chunk_samples / rate, 4),
                  "after_complete_window_s": {"median": round(statistics.median(decode), 3), "max": round(max(decode), 3)},
                  "work_per_chunk_s": round(busy / len(live.chunks), 3),
                  "after_chunk_s": {"first": round(after_chunk[0], 3), "median": round(statistics.median(after_chunk), 3),
                                    "max": round(max(after_chunk), 3)},
                  "after_window_s": {"median": round(statistics.median(after_window), 3), "max": round(max(after_window), 3)},
                  "rtf": round(busy / seconds, 3), "keeps_up": busy / len(live.chunks) < geometry.chunk_samples / rate,
                  "first_text_after_start_s": round(live.chunks[0].ready_at - started, 3),
                  "cache_positions": live.session.stream.position}))
"""

WHOLE = """
import json, sys, time
import numpy as np
from vibevoice_onnx.audio import db_normalize, read_audio
from vibevoice_onnx.generation.asr import TranscriptionResult, audio_embeddings, transcribe_tokens
from vibevoice_onnx.runtime.asr import OnnxAsrBackend
from vibevoice_onnx.runtime.bundle import Bundle
from vibevoice_onnx.transcription import build_asr_prompt
bundle_dir, audio, repeat, tokens, threads = sys.argv[1:]
bundle = Bundle(bundle_dir, threads=int(threads))
backend = OnnxAsrBackend(bundle)
samples = db_normalize(np.tile(read_audio(audio)[0], int(repeat)))
prompt = build_asr_prompt(bundle.tokenizer, len(samples), None)
start = time.perf_counter()
embeddings = audio_embeddings(backend, samples, None)
encoded = time.perf_counter()
stamps = [time.perf_counter() for _ in transcribe_tokens(backend, prompt, embeddings, set(), int(tokens), TranscriptionResult())]
print(json.dumps({"audio_seconds": round(len(samples) / 24000, 2), "tokens": len(stamps), "prompt_tokens": len(prompt.ids),
                  "encode_s": round(encoded - start, 2), "prefill_s": round(stamps[0] - encoded, 2),
                  "decode_tokens_per_second": round((len(stamps) - 1) / (stamps[-1] - stamps[0]), 2),
                  "text_after_audio_s": round(stamps[-1] - start, 2), "rtf": round((stamps[-1] - start) / (len(samples) / 24000), 3)}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=["1.5b", "7b"], default="1.5b")
    parser.add_argument("--size", choices=["tiny", "full"], default="full")
    parser.add_argument("--workdir", default="bench-out/asr-streaming")
    parser.add_argument("--checkpoint", help="an existing checkpoint (default: WORKDIR/checkpoint, made if absent)")
    parser.add_argument("--precisions", default="int8,int4")
    parser.add_argument("--repeat", type=int, default=3, help="times the 17.28 s fixture is looped")
    parser.add_argument("--tokens-per-chunk", type=lambda text: [int(n) for n in text.split(",")], default=[8, 12, 16],
                        help="a live run for each (comma-separated)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--skip-build", action="store_true", help="reuse WORKDIR's bundles")
    parser.add_argument("--skip-whole", action="store_true", help="no non-streaming comparison")
    parser.add_argument("--encode-ahead", type=int, help="StreamingTranscriber's encode_ahead (frames a segment; 0: "
                        "each window encoded once complete; default: its own)")
    args = parser.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    checkpoint = Path(args.checkpoint) if args.checkpoint else work / "checkpoint"
    results = {"variant": args.variant, "size": args.size, "threads": args.threads, "repeat": args.repeat,
               "tokens_per_chunk": args.tokens_per_chunk, "cpu_flags": cpu_flags()}
    if not (checkpoint / "config.json").is_file():
        run_phase("make_checkpoint", [*CLI, "make-checkpoint", "asr-streaming", str(checkpoint), "--size", args.size,
                                      "--variant", args.variant], results, work)
    for precision in args.precisions.split(","):
        bundle = work / "onnx" / "asr-streaming" / f"cpu_{precision}"
        if not args.skip_build:
            run_phase(f"build_{precision}", [*CLI, "build", str(checkpoint), "-o", str(work / "onnx"), "--precision",
                                             precision], results, work)
        results[f"bundle_{precision}_gb"] = round(sum(f.stat().st_size for f in bundle.iterdir() if f.is_file()) / 1e9, 2)
        parity = json.loads((bundle / "manifest.json").read_text()).get("parity")
        results[f"bundle_{precision}_verified"] = None if parity is None else parity["passed"]
        common = [str(bundle), str(SPEECH), str(args.repeat)]
        for per_chunk in args.tokens_per_chunk:
            name = f"live_{precision}_{per_chunk}"
            live = run_phase(name, [sys.executable, "-c", LIVE, *common, str(per_chunk), str(args.threads),
                                    "default" if args.encode_ahead is None else str(args.encode_ahead)], results, work)
            if live.returncode == 0:
                results[name].update(json.loads(live.stdout.strip().splitlines()[-1]))
        live = results.get(f"live_{precision}_{max(args.tokens_per_chunk)}", {})
        if not args.skip_whole and "chunks" in live:  # as many tokens as the most the live runs decoded
            whole = run_phase(f"whole_{precision}", [sys.executable, "-c", WHOLE, *common,
                                                     str(round(live["chunks"] * live["tokens_per_chunk"])), str(args.threads)],
                              results, work)
            if whole.returncode == 0:
                results[f"whole_{precision}"].update(json.loads(whole.stdout.strip().splitlines()[-1]))
        (work / "results.json").write_text(json.dumps({**header(), **results}, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    run(main)
