"""What a Home Assistant user feels: the time from the first `synthesize-chunk` (an LLM's answer streaming in) to
the first `audio-chunk`, on a real-size realtime bundle, beside `serve`'s speech websocket for the same text
(first `input_text.delta` to the first audio bytes) and a whole-text `synthesize`; each server started alone,
warmed with one request, then measured over --runs requests. Driven by the `wyoming` package's own client.

    .venv/bin/python benchmarks/home_assistant.py --tts /work/bench/onnx/realtime/cpu_int8 [--runs 5] \
        [--frames 30] --out benchmarks/results/DATE-home-assistant.json

A benchmark, not a test: numbers depend on the machine (its CPU and flags are recorded with them). Not in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import KEY, Server, WyomingServer  # noqa: E402  the tests' server harness

from phases import header  # noqa: E402

# An assistant's answer as an LLM streams it: a few words at a time.
ANSWER = ("The living room lights are off, the front door is locked, and tomorrow will be sunny with a high of "
          "twenty one degrees.")
WORDS = [word + " " for word in ANSWER.split()]


async def wyoming_streamed(port: int, voice: str) -> dict:
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name=voice)).event())
        started = time.perf_counter()
        for word in WORDS:
            await client.write_event(SynthesizeChunk(word).event())
        await client.write_event(SynthesizeStop().event())
        return await _audio_events(client, started, "synthesize-stopped")


async def wyoming_whole(port: int, voice: str) -> dict:
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize, SynthesizeVoice

    async with AsyncTcpClient("127.0.0.1", port) as client:
        started = time.perf_counter()
        await client.write_event(Synthesize(ANSWER, voice=SynthesizeVoice(name=voice)).event())
        return await _audio_events(client, started, "audio-stop")


async def _audio_events(client, started: float, last: str) -> dict:
    first, size = None, 0
    while True:
        event = await asyncio.wait_for(client.read_event(), 600)
        if event is None or event.type == "error":
            raise RuntimeError(f"no audio: {event}")
        if event.type == "audio-chunk":
            first = first or time.perf_counter()
            size += len(event.payload)
        if event.type == last:
            return _timing(started, first, size)


def websocket_streamed(port: int, voice: str, frames: int) -> dict:
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{port}/v1/audio/speech/stream", additional_headers={"Authorization": f"Bearer {KEY}"},
                 open_timeout=30, max_size=None) as ws:
        ws.send(json.dumps({"model": "tts-1", "voice": voice, "response_format": "pcm", "max_frames": frames}))
        started = time.perf_counter()
        for word in WORDS:
            ws.send(json.dumps({"type": "input_text.delta", "delta": word}))
        ws.send(json.dumps({"type": "input_text.done"}))
        first, size = None, 0
        while isinstance(message := ws.recv(timeout=600), bytes):
            first = first or time.perf_counter()
            size += len(message)
        return _timing(started, first, size)


def _timing(started: float, first: float | None, size: int) -> dict:
    total = time.perf_counter() - started
    seconds = size / 2 / 24000
    return {"first_audio_s": round(first - started, 4), "total_s": round(total, 3), "audio_s": round(seconds, 3),
            "rtf": round(total / max(seconds, 1e-9), 4)}


def summary(runs: list[dict]) -> dict:
    return {"first_audio_median_s": round(statistics.median(r["first_audio_s"] for r in runs), 4),
            "first_audio_min_s": min(r["first_audio_s"] for r in runs),
            "rtf_median": round(statistics.median(r["rtf"] for r in runs), 4), "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tts", type=Path, required=True, help="a realtime bundle (full size, int8)")
    parser.add_argument("--voice", default="synthetic")
    parser.add_argument("--frames", type=int, default=30, help="frames per answer (default 30 = 4 s of audio)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench-out/wyoming.json"))
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = header()
    report.update(bundle=str(args.tts), text=ANSWER, chunks=len(WORDS), frames=args.frames)
    limits = ("--max-frames", str(args.frames), "--max-batch", "1")

    wyoming = WyomingServer([args.tts], args.out.parent / "wyoming.log", *limits, threads=None, start_seconds=600)
    try:
        asyncio.run(wyoming_whole(wyoming.port, args.voice))  # warm: the sessions' first runs
        report["wyoming_streamed"] = summary([asyncio.run(wyoming_streamed(wyoming.port, args.voice))
                                              for _ in range(args.runs)])
        report["wyoming_synthesize"] = summary([asyncio.run(wyoming_whole(wyoming.port, args.voice))
                                                for _ in range(args.runs)])
    finally:
        wyoming.stop()
    serve = Server([args.tts], args.out.parent / "serve.log", *limits, threads=None, start_seconds=600)
    try:
        websocket_streamed(serve.port, args.voice, args.frames)
        report["websocket_streamed"] = summary([websocket_streamed(serve.port, args.voice, args.frames)
                                                for _ in range(args.runs)])
    finally:
        serve.stop()
    report["wyoming_minus_websocket_first_audio_ms"] = round(
        (report["wyoming_streamed"]["first_audio_median_s"] - report["websocket_streamed"]["first_audio_median_s"])
        * 1000, 1)
    print(json.dumps({k: v for k, v in report.items() if not isinstance(v, dict)} | {
        k: {m: n for m, n in v.items() if m != "runs"} for k, v in report.items() if isinstance(v, dict)}, indent=2))
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
