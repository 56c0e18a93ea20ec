"""A soak: N concurrent clients for M minutes against one server holding a realtime bundle and an ASR bundle,
every kind of client mixed: speech streamed (pcm) and whole (mp3), SSE, transcriptions, the text-in
websocket, clients that cancel after the first audio and clients that vanish mid-body. Every minute: p50/p99
time to first byte, answers by status, and the server's RSS and open file descriptors, which must stay flat
after warm-up.

    .venv/bin/python benchmarks/soak.py --tts onnx/realtime/cpu_int8 --asr onnx/asr/cpu_int8 \
        --minutes 30 --clients 6 --out benchmarks/results/DATE-soak.json

A benchmark, not a test: not in CI.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import KEY, Server, TEXT, excerpt, rss, transcribe  # noqa: E402

from phases import cpu_flags  # noqa: E402

AUTH = {"Authorization": f"Bearer {KEY}"}
SCENARIOS = {"speech-pcm": 3, "speech-mp3": 2, "speech-sse": 1, "transcription": 2, "socket": 2, "cancel": 1,
             "vanish": 1}


def speech_request(url: str, frames: int, seed: int, fmt: str, sse: bool = False) -> urllib.request.Request:
    body = json.dumps({"model": "tts-1", "input": TEXT, "voice": "synthetic", "response_format": fmt, "seed": seed,
                       "max_frames": frames, "stream_format": "sse" if sse else "audio"}).encode()
    return urllib.request.Request(f"{url}/v1/audio/speech", body, {"Content-Type": "application/json", **AUTH})


def first_byte(request, read_all: bool = True) -> tuple[int, float]:
    """(status, seconds to the first byte of the body); the rest read unless `read_all` is false (a client
    that cancels after the first audio: the connection closed under the server)."""
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        response.read1(65536)
        ttfb = time.perf_counter() - start
        if read_all:
            response.read()
        return response.status, ttfb


def socket_speech(url: str, frames: int, seed: int) -> tuple[int, float]:
    from websockets.sync.client import connect

    start, ttfb = time.perf_counter(), None
    with connect(url.replace("http", "ws") + "/v1/audio/speech/stream", additional_headers=AUTH) as ws:
        ws.send(json.dumps({"model": "tts-1", "voice": "synthetic", "response_format": "pcm", "seed": seed,
                            "max_frames": frames}))
        for word in TEXT.split():
            ws.send(json.dumps({"type": "input_text.delta", "delta": word + " "}))
        ws.send(json.dumps({"type": "input_text.done"}))
        while True:
            message = ws.recv(timeout=600)
            if isinstance(message, bytes):
                ttfb = ttfb or time.perf_counter() - start
            elif json.loads(message)["type"] == "audio.done":
                return 200, ttfb
            else:
                return 400, ttfb


def vanish(port: int) -> tuple[int, None]:
    """Half a body, then gone: the server must log it and forget it."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=30)
    connection.sendall(f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                       "Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n{\"model\": \"tts".encode())
    connection.close()
    return 499, None


def one_request(kind: str, server: Server, clip: Path, frames: int, rng: random.Random) -> tuple[object, float | None]:
    seed = rng.randrange(1 << 30)
    if kind == "speech-pcm":
        return first_byte(speech_request(server.url, frames, seed, "pcm"))
    if kind == "speech-mp3":
        return first_byte(speech_request(server.url, frames, seed, "mp3"))
    if kind == "speech-sse":
        return first_byte(speech_request(server.url, frames, seed, "pcm", sse=True))
    if kind == "cancel":
        return first_byte(speech_request(server.url, frames * 4, seed, "pcm"), read_all=False)
    if kind == "transcription":
        return 200, transcribe(server.url, clip, 8)  # no first byte before the transcript: its whole time
    if kind == "socket":
        return socket_speech(server.url, frames, seed)
    return vanish(server.port)


class Soak:
    def __init__(self, server: Server, clip: Path, frames: int):
        self.server, self.clip, self.frames = server, clip, frames
        self.lock, self.rows, self.stop = threading.Lock(), [], threading.Event()

    def client(self, index: int) -> None:
        rng = random.Random(index)
        kinds, weights = zip(*SCENARIOS.items())
        while not self.stop.is_set():
            kind = rng.choices(kinds, weights)[0]
            try:
                status, ttfb = one_request(kind, self.server, self.clip, self.frames, rng)
            except urllib.error.HTTPError as e:
                status, ttfb = e.code, None
            except Exception as e:  # noqa: BLE001 - counted, not fatal: the soak is about what the server does
                status, ttfb = f"client {type(e).__name__}", None
            with self.lock:
                self.rows.append((time.monotonic(), kind, status, ttfb))

    def minute(self, since: float) -> dict:
        pid = self.server.process.pid
        with self.lock:
            rows = [r for r in self.rows if r[0] >= since]
        ttfbs = sorted(r[3] for r in rows if r[3] is not None)
        return {"requests": len(rows), "by_status": dict(Counter(str(r[2]) for r in rows)),
                "by_kind": dict(Counter(r[1] for r in rows)),
                "ttfb_p50_s": round(statistics.median(ttfbs), 3) if ttfbs else None,
                "ttfb_p99_s": round(ttfbs[min(len(ttfbs) - 1, int(0.99 * len(ttfbs)))], 3) if ttfbs else None,
                "rss_mb": round(rss(pid) / 2**20, 1), "open_fds": len(os.listdir(f"/proc/{pid}/fd"))}


def soak(args) -> dict:
    work = args.out.parent
    clip = excerpt(args.audio, args.audio_seconds, work)
    server = Server([args.tts, args.asr], work / "soak-server.log", "--max-active", "4", "--max-queue", "16",
                    threads=None, start_seconds=900)
    try:
        run = Soak(server, clip, args.frames)
        threads = [threading.Thread(target=run.client, args=(i,), daemon=True) for i in range(args.clients)]
        for thread in threads:
            thread.start()
        minutes = []
        for m in range(args.minutes):
            since = time.monotonic()
            time.sleep(60)
            minutes.append({"minute": m + 1, **run.minute(since)})
            print(json.dumps(minutes[-1]), flush=True)
        run.stop.set()
        for thread in threads:
            thread.join(600)
    finally:
        status = server.stop(60)
    log = (work / "soak-server.log").read_text()
    return {"minutes": minutes, "server_exit": status, "tracebacks_in_log": log.count("Traceback"),
            "failure_lines_in_log": log.count(" failed: "), **summary(minutes, args.warmup)}


def summary(minutes: list[dict], warmup: int) -> dict:
    after = minutes[warmup - 1:] if len(minutes) >= warmup else minutes
    statuses = Counter()
    for m in minutes:
        statuses.update(m["by_status"])
    return {"requests": sum(m["requests"] for m in minutes), "by_status": dict(statuses),
            "rss_mb_after_warmup": [after[0]["rss_mb"], after[-1]["rss_mb"], round(after[-1]["rss_mb"] - after[0]["rss_mb"], 1)],
            "open_fds_after_warmup": [after[0]["open_fds"], after[-1]["open_fds"]],
            "ttfb_p50_s_median_of_minutes": statistics.median(m["ttfb_p50_s"] for m in minutes if m["ttfb_p50_s"]),
            "ttfb_p99_s_worst_minute": max(m["ttfb_p99_s"] for m in minutes if m["ttfb_p99_s"])}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tts", type=Path, required=True, help="a realtime bundle (full size, int8)")
    parser.add_argument("--asr", type=Path, required=True, help="an ASR bundle")
    parser.add_argument("--audio", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "fixtures" /
                        "audio" / "demo3-hotwords.wav")
    parser.add_argument("--audio-seconds", type=float, default=4.0)
    parser.add_argument("--minutes", type=int, default=30)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--frames", type=int, default=24, help="latent frames per speech request (7.5 a second)")
    parser.add_argument("--warmup", type=int, default=3, help="minutes before memory must stay flat")
    parser.add_argument("--out", type=Path, default=Path("bench-out/soak/soak.json"))
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {"date": datetime.date.today().isoformat(), "cpu": cpu_flags(), "commit": commit,
              "command": "benchmarks/soak.py " + " ".join(sys.argv[1:]), "clients": args.clients,
              "scenarios": SCENARIOS, **soak(args)}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "minutes"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
