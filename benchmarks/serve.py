"""The server under load, on a real (full-size) bundle: time to first byte against `bench`'s first audio for
the same bundle, 1/2/4/8 concurrent streaming clients with batching on (--max-batch 8) and off (1), aggregate
audio seconds per wall second, and the
server's RSS over many sequential requests; the same for transcription when an ASR bundle is given.

    .venv/bin/python benchmarks/serve.py --tts /work/bench/onnx/realtime/cpu_int8 [--asr BUNDLE] \
        [--frames 30] [--sequential 200] --out bench-out/serve.json

A benchmark, not a test: numbers depend on the machine (its CPU flags are printed with them). Not in CI.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import KEY, Server  # noqa: E402  the same server harness as the tests

from phases import CLI, header  # noqa: E402

TEXT = ("The server adds no buffering of its own: each frame's audio leaves as soon as the decoder has it, "
        "while the model goes on with the next one.")


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024
    return 0


def stream_speech(url: str, frames: int, seed: int, fmt: str = "pcm") -> dict:
    body = json.dumps({"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": fmt, "seed": seed,
                       "max_frames": frames, "stream_format": "audio"}).encode()
    request = urllib.request.Request(f"{url}/v1/audio/speech", body, {
        "Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        first = response.read1(65536)
        ttfb = time.perf_counter() - start
        size = len(first) + len(response.read())
    return {"ttfb": ttfb, "total": time.perf_counter() - start, "audio_seconds": size / 2 / 24000}


def concurrent(url: str, clients: int, frames: int) -> dict:
    results = [None] * clients

    def one(i):
        results[i] = stream_speech(url, frames, 100 + i)

    start = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    done = [r for r in results if r]
    return {"clients": clients, "completed": len(done), "wall_seconds": round(wall, 3),
            "ttfb_median_s": round(statistics.median(r["ttfb"] for r in done), 4),
            "ttfb_max_s": round(max(r["ttfb"] for r in done), 4),
            "total_median_s": round(statistics.median(r["total"] for r in done), 3),
            "audio_seconds_per_wall_second": round(sum(r["audio_seconds"] for r in done) / wall, 3)}


def transcribe(url: str, audio: Path, tokens: int) -> float:
    import uuid

    boundary = uuid.uuid4().hex
    fields = {"model": "whisper-1", "response_format": "json", "max_new_tokens": str(tokens), "mean_latents": "true"}
    parts = [f"--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n".encode() for k, v in fields.items()]
    parts.append(f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{audio.name}\"\r\n"
                 "Content-Type: audio/wav\r\n\r\n".encode() + audio.read_bytes() + f"\r\n--{boundary}--\r\n".encode())
    request = urllib.request.Request(f"{url}/v1/audio/transcriptions", b"".join(parts), {
        "Content-Type": f"multipart/form-data; boundary={boundary}", "Authorization": f"Bearer {KEY}"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=3600) as response:
        json.load(response)
    return time.perf_counter() - start


def excerpt(audio: Path, seconds: float, work: Path) -> Path:
    """The first `seconds` of `audio` as a WAV file: a full-size 7B prefill costs ~3 s per second of speech."""
    import soundfile as sf

    samples, rate = sf.read(str(audio), frames=int(seconds * sf.info(str(audio)).samplerate), dtype="float32")
    path = work / f"{audio.stem}-{seconds:g}s.wav"
    sf.write(str(path), samples, rate)
    return path


def tts_server(bundle: Path, work: Path, max_batch: int) -> Server:
    return Server([bundle], work / f"serve-tts-batch{max_batch}.log", "--max-active", "8", "--max-queue", "8",
                  "--max-batch", str(max_batch), threads=None, start_seconds=600)


def unbatched_loads(bundle: Path, frames: int, work: Path) -> list[dict]:
    """The concurrent loads on a server that runs each generation on its own (--max-batch 1)."""
    server = tts_server(bundle, work, 1)
    try:
        stream_speech(server.url, 6, 0)
        return [concurrent(server.url, n, frames) for n in (1, 2, 4, 8)]
    finally:
        server.stop()


def bench_tts(bundle: Path, frames: int, sequential: int, work: Path) -> dict:
    reference = json.loads(subprocess.run([*CLI, "bench", str(bundle), "--frames", "12", "--json"], check=True,
                                          capture_output=True, text=True).stdout)["runtime"]
    server = tts_server(bundle, work, 8)
    try:
        stream_speech(server.url, 6, 0)  # warm: the first request pays for the sessions' first runs
        single = [stream_speech(server.url, 12, seed) for seed in range(5)]
        ttfb = statistics.median(r["ttfb"] for r in single)
        loads = [concurrent(server.url, n, frames) for n in (1, 2, 4, 8)]  # batched, up to 8 at once
        memory = [rss(server.process.pid)]
        for i in range(sequential):
            stream_speech(server.url, 6, i, fmt="mp3" if i % 2 else "wav")
            if (i + 1) % 20 == 0:
                memory.append(rss(server.process.pid))
    finally:
        server.stop()
    return {"bundle": str(bundle), "bench_first_audio_s": reference["first_audio_seconds"],
            "bench_warm_first_audio_s": reference["warm_first_audio_seconds"], "bench_rtf": reference["real_time_factor"],
            "server_ttfb_median_s": round(ttfb, 4),
            "server_minus_bench_warm_ms": round((ttfb - reference["warm_first_audio_seconds"]) * 1000, 1),
            "concurrent_batched": loads, "concurrent_unbatched": unbatched_loads(bundle, frames, work),
            "rss_mb_every_20_requests": [round(m / 2**20) for m in memory]}


def bench_asr(bundle: Path, audio: Path, tokens: int, sequential: int, work: Path) -> dict:
    server = Server([bundle], work / "serve-asr.log", "--max-active", "2", "--max-queue", "4", threads=None, start_seconds=1200)
    try:
        transcribe(server.url, audio, tokens)  # warm
        single = [transcribe(server.url, audio, tokens) for _ in range(2)]
        start = time.perf_counter()
        threads = [threading.Thread(target=transcribe, args=(server.url, audio, tokens)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        two = time.perf_counter() - start
        memory = [rss(server.process.pid)]
        for i in range(sequential):
            transcribe(server.url, audio, tokens)
            if (i + 1) % 5 == 0:
                memory.append(rss(server.process.pid))
    finally:
        server.stop()
    return {"bundle": str(bundle), "audio": audio.name, "tokens": tokens, "single_seconds": [round(s, 2) for s in single],
            "two_concurrent_wall_seconds": round(two, 2), "rss_mb_every_5_requests": [round(m / 2**20) for m in memory]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tts", type=Path, help="a realtime bundle (full size, int8)")
    parser.add_argument("--asr", type=Path, help="an ASR bundle")
    parser.add_argument("--audio", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "fixtures" /
                        "audio" / "demo3-hotwords.wav")
    parser.add_argument("--frames", type=int, default=30, help="frames per concurrent request (default 30 = 4 s)")
    parser.add_argument("--sequential", type=int, default=200, help="sequential requests for the RSS curve")
    parser.add_argument("--audio-seconds", type=float, default=6.0, help="the part of --audio sent (default 6 s)")
    parser.add_argument("--asr-tokens", type=int, default=8)
    parser.add_argument("--asr-sequential", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("bench-out/serve.json"))
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = header()  # date, cpu (and its flags), commit, command: what docs/benchmarks.md renders
    if args.tts:
        report["tts"] = bench_tts(args.tts, args.frames, args.sequential, args.out.parent)
        print(json.dumps(report["tts"], indent=2), flush=True)
    if args.asr:
        audio = excerpt(args.audio, args.audio_seconds, args.out.parent)
        report["asr"] = bench_asr(args.asr, audio, args.asr_tokens, args.asr_sequential, args.out.parent)
        print(json.dumps(report["asr"], indent=2), flush=True)
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
