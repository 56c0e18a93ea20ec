"""Batch jobs with 1 and 2 workers, and what a worker killed mid-job costs: `vibevoice-onnx batch` as a user runs it.

    python benchmarks/batch_jobs.py synthesize onnx/realtime/cpu_int8 --items 200 --work /tmp/jobs
    python benchmarks/batch_jobs.py transcribe onnx/asr/cpu_int8 --items 50 --audio speech.wav --work /tmp/jobs

Synthesis items are sentences of the bench texts (seed per item, `--max-frames` each); transcription items are
cuts of `--audio` of 2-6 s. Each run is a fresh job folder and a fresh local Ray cluster (the CLI's own). The
kill run SIGKILLs one worker process once `--kill-after` items are done and counts the items made twice.

`--nodes N` runs instead one job on a cluster of N Ray nodes made on this machine as on N machines (`ray start
--head`, then `ray start --address` N-1 times, separate processes of one CPU each) with N workers, and counts
the items each node made (the manifest's worker column is NODE/PID). It ends with `ray stop`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CLI = [sys.executable, "-m", "vibevoice_onnx.cli"]


def synthesis_items(count: int, max_frames: int) -> list[dict]:
    from vibevoice_onnx.runtime.realtime import BENCH_TEXTS

    sentences = [s.strip() + "." for text in BENCH_TEXTS for s in text.split(".") if s.strip()]
    return [{"id": f"s{k:04d}", "text": sentences[k % len(sentences)], "seed": k, "max_frames": max_frames}
            for k in range(count)]


def transcription_items(count: int, audio: Path, work: Path, tokens: int) -> list[dict]:
    import soundfile as sf

    samples, rate = sf.read(str(audio), dtype="float32")
    folder = work / "clips"
    folder.mkdir(parents=True, exist_ok=True)
    items = []
    for k in range(count):
        seconds = 2 + k % 5
        start = (k * rate) % max(1, len(samples) - seconds * rate)
        path = folder / f"c{k:04d}.wav"
        sf.write(str(path), samples[start:start + seconds * rate], rate)
        items.append({"id": path.stem, "audio": str(path), "max_new_tokens": tokens, "seed": k})
    return items


def worker_pids() -> list[int]:
    """The Ray Data worker processes (their title names the map stage)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if "MapWorker(MapBatches(" in line]


def run(task: str, bundle: str, items: Path, out: Path, workers: int, kill_after: int | None, extra: list[str]) -> dict:
    command = [*CLI, "batch", task, bundle, str(items), "-o", str(out), "--workers", str(workers), *extra]
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # Ray talks on stdout
    killed = None
    rows = out / "rows"
    while process.poll() is None:
        time.sleep(0.5)
        if kill_after is not None and killed is None and rows.is_dir() and len(list(rows.glob("*.json"))) >= kill_after:
            pids = worker_pids()
            if pids:
                killed = {"pid": pids[0], "rows_then": len(list(rows.glob("*.json"))),
                          "seconds": time.perf_counter() - start}
                os.kill(pids[0], signal.SIGKILL)
    log = process.stderr.read()
    wall = time.perf_counter() - start
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    made = [line for line in log.splitlines() if "items," in line]
    return {"workers": workers, "returncode": process.returncode, "wall_seconds": wall,
            "items": len(manifest), "ok": sum(r["status"] == "ok" for r in manifest),
            "duplicate_ids": len(manifest) - len({r["id"] for r in manifest}),
            "item_seconds": sum(r["seconds"] for r in manifest), "audio_seconds": sum(r["audio_seconds"] or 0 for r in manifest),
            "tokens": sum(r["tokens"] or 0 for r in manifest), "items_per_hour": 3600 * len(manifest) / wall,
            "killed": killed, "last_progress": made[-1] if made else None}


def run_on_nodes(task: str, bundle: str, items: Path, out: Path, nodes: int, extra: list[str]) -> dict:
    """One job on a cluster of `nodes` Ray nodes started here, each declaring one CPU (so Ray places one worker
    on each), as `ray start` makes them on separate machines."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"127.0.0.1:{port}"
    ray = [str(Path(sys.executable).with_name("ray"))]
    # Ray 2.5x's head turns token authentication on; the other nodes and the job then need it on to join
    os.environ["RAY_AUTH_MODE"] = "token"
    common = ["--num-cpus", "1", "--object-store-memory", str(200 * 2**20), "--disable-usage-stats"]
    try:
        subprocess.run([*ray, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                        "--include-dashboard", "false", *common], check=True, capture_output=True)
        for _ in range(nodes - 1):
            subprocess.run([*ray, "start", "--address", address, "--node-ip-address", "127.0.0.1", *common],
                           check=True, capture_output=True)
        result = run(task, bundle, items, out, nodes, None, ["--address", address, "--threads-per-worker", "1", *extra])
    finally:
        subprocess.run([*ray, "stop", "--force"], capture_output=True)
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    per_node: dict[str, int] = {}
    for row in manifest:
        node = (row.get("worker") or "?").split("/")[0]
        per_node[node] = per_node.get(node, 0) + 1
    return {**result, "nodes": nodes, "items_per_node": per_node}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=["synthesize", "transcribe"])
    parser.add_argument("bundle")
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--max-frames", type=int, default=24, help="synthesis: latents per item (24 = 3.2 s)")
    parser.add_argument("--tokens", type=int, default=16, help="transcription: greedy tokens per item at most")
    parser.add_argument("--audio", type=Path, help="transcription: the recording the items are cut from")
    parser.add_argument("--kill-after", type=int, default=20, help="the kill run: SIGKILL a worker after this many items")
    parser.add_argument("--work", type=Path, default=Path("batch-jobs"))
    parser.add_argument("--nodes", type=int, help="instead: one job on a cluster of this many Ray nodes on this machine")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    items = (synthesis_items(args.items, args.max_frames) if args.task == "synthesize"
             else transcription_items(args.items, args.audio, args.work, args.tokens))
    path = args.work / "items.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    extra = ["--force"] if args.force else []
    if args.nodes:
        result = run_on_nodes(args.task, args.bundle, path, args.work / f"out-{args.nodes}-nodes", args.nodes, extra)
        print(json.dumps({"task": args.task, "bundle": args.bundle, "items": args.items, "runs": [result]}, indent=2))
        return
    results = [run(args.task, args.bundle, path, args.work / f"out-{label}", workers, kill, extra)
               for label, workers, kill in (("1", 1, None), ("2", 2, None), ("2-kill", 2, args.kill_after))]
    print(json.dumps({"task": args.task, "bundle": args.bundle, "items": args.items, "runs": results}, indent=2))


if __name__ == "__main__":
    main()
