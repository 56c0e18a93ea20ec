"""The fuzzers of the test suite, run long: Schemathesis over every route of the served schema and Hypothesis
over both websockets (tests/test_hostile.py, tests/test_asr_streaming_onnx.py), with SCALE times the examples
CI runs and a seed of the run's own, against real servers on tiny bundles. Each server's log must end free
of tracebacks and failure lines, as in CI.

    .venv/bin/python benchmarks/fuzz.py --scale 40 --seed 7 --out benchmarks/results/DATE-fuzz.json

A benchmark, not a test: not in CI.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from phases import cpu_flags  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/test_hostile.py", "tests/test_asr_streaming_onnx.py::test_random_message_sequences_on_the_live_socket_end_cleanly"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=int, default=40, help="times the examples CI runs (default 40)")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100000, help="not 1, CI's seed")
    parser.add_argument("--out", type=Path, default=Path("bench-out/fuzz.json"))
    args = parser.parse_args()
    env = {**os.environ, "VIBEVOICE_FUZZ_SCALE": str(args.scale), "VIBEVOICE_FUZZ_SEED": str(args.seed)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-s", "-q",
                           *TESTS], cwd=ROOT, env=env, capture_output=True, text=True)
    output = done.stdout + done.stderr
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    report = {"date": datetime.date.today().isoformat(), "cpu": cpu_flags(), "commit": commit.stdout.strip(),
              "command": "benchmarks/fuzz.py " + " ".join(sys.argv[1:]), "scale": args.scale, "seed": args.seed,
              "seconds": round(time.monotonic() - started), "pytest_exit": done.returncode,
              "pytest_summary": (re.findall(r"^=* ?(\d+ (?:passed|failed).*?) ?=*$", done.stdout, re.M) or [""])[-1],
              "schemathesis_cases": re.findall(r"(\d+ generated, \d+ (?:passed|found[^\n]*))", output),
              "schemathesis_max_examples_per_route": 25 * args.scale,
              "hypothesis_sequences": {"speech socket": 30 * args.scale, "live socket": 20 * args.scale}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    if done.returncode:
        print(output[-8000:], file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
