"""A realtime bundle spoken by the JavaScript module in Node.js (onnxruntime-node, CPU) beside the Python runtime,
on the same machine in one run: the load (manifest read to sessions made), whole generations (cold, then warm:
first audio, seconds, RTF) at each --threads, and Node.js's peak memory; then `vibevoice-onnx bench` of the same
bundle at the same threads.

    .venv/bin/python benchmarks/node.py BUNDLE [--threads 1 2] [--frames 24] [--json FILE]

The module is installed as a developer installs it: its `npm pack` and onnxruntime-node from the npm registry, in
a fresh Node.js project (tests/helpers.node_project). Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from phases import header, print_results, run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

TEXT = "The whole realtime loop runs in this program, window after window, on the module's own loop."


def main() -> int:
    from browser import python_bench
    from helpers import NODE, node_project

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--frames", type=int, default=24, help="latents spoken (twice: cold, then warm)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    results = {**header(), "bundle": str(args.bundle.resolve()), "text": TEXT, "seed": 42, "frames": args.frames,
               "node": subprocess.run([NODE, "--version"], capture_output=True, text=True).stdout.strip(), "runs": {}}
    with tempfile.TemporaryDirectory(prefix="vibevoice-node-") as folder:
        project = node_project(Path(folder), 600)
        for threads in args.threads:
            request = {"action": "bench", "bundle": str(args.bundle.resolve()), "text": TEXT,
                       "options": {"cache": False, "threads": threads},
                       "speak": {"seed": 42, "maxFrames": args.frames}}
            done = subprocess.run([NODE, "driver.mjs"], cwd=project["folder"], input=json.dumps(request),
                                  capture_output=True, text=True, check=True)
            node = json.loads(done.stdout)
            if "error" in node:
                raise SystemExit(f"Node.js could not speak: {node['error']}")
            node.pop("progress", None)
            results["runs"][f"{threads} threads"] = {"node": node,
                                                     "python_bench": python_bench(args.bundle, args.frames, threads)}
            print(f"{threads} threads: {json.dumps(results['runs'][f'{threads} threads'])}", flush=True)
    return print_results(results, args.json)


if __name__ == "__main__":
    run(main)
