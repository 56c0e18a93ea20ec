"""What the benchmark scripts share: each phase in its own process, timed, with its peak memory."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

CLI = [sys.executable, "-m", "vibevoice_onnx.cli"]


def run_phase(name: str, command: list[str], results: dict, workdir: Path) -> subprocess.CompletedProcess:
    """Run one phase in a child process and record its wall time and peak RSS (GNU time)."""
    log = workdir / f"{name}.time"
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", "-o", str(log), *command], capture_output=True, text=True)
    wall = time.perf_counter() - start
    peak = next((int(line.split()[-1]) for line in log.read_text().splitlines() if "Maximum resident" in line), 0)
    results[name] = {"seconds": round(wall, 1), "peak_rss_gb": round(peak / 2**20, 2), "exit": proc.returncode}
    print(f"{name}: {results[name]}", flush=True)
    if proc.returncode:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
    return proc


def prepare(kind: str, size: str, work: Path, checkpoint: Path, bundle: Path, voices, results: dict) -> None:
    """Make the checkpoint (once), build, import the (name, file) voices and verify, each phase timed."""
    if not (checkpoint / "config.json").is_file():
        run_phase("make_checkpoint", [*CLI, "make-checkpoint", kind, str(checkpoint), "--size", size], results, work)
    run_phase("build", [*CLI, "build", str(checkpoint), "-o", str(work / "onnx")], results, work)
    for name, source in voices:
        proc = run_phase(f"import_{name}", [*CLI, "voices", "import", str(bundle), str(source), "--name", name, "--force"],
                         results, work)
        results[f"import_{name}"]["message"] = proc.stdout.strip()
    proc = run_phase("verify", [*CLI, "verify", str(bundle), "--json"], results, work)
    if proc.returncode in (0, 1):
        parity = json.loads(proc.stdout)
        results["verify"]["passed"] = parity["passed"]
        results["verify"]["gates"] = {g["name"]: [g["cosine"], g["max_abs"], g["passed"]] for g in parity["gates"]}


def parse_arguments(doc: str, workdir: str, frames: int, what: str, precisions: tuple[str, ...] = ("fp32",)) -> argparse.Namespace:
    """The options every benchmark takes; WORKDIR is created."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["tiny", "full"], default="full")
    parser.add_argument("--workdir", default=workdir)
    parser.add_argument("--frames", type=int, default=frames, help=f"{what} to generate (7.5 per second)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--speak-only", action="store_true", help="reuse WORKDIR's bundle: time speak phases only")
    if len(precisions) > 1:
        parser.add_argument("--precision", choices=precisions, default=precisions[0],
                            help="the bundle to time (built from the fp32 one and verified, unless --speak-only)")
    args = parser.parse_args()
    args.workdir = Path(args.workdir)
    args.workdir.mkdir(parents=True, exist_ok=True)
    return args


def save(results: dict, args: argparse.Namespace) -> int:
    """Write the results (speak.json for --speak-only runs, else results.json; speak-int8.json with --precision
    int8) and print them."""
    precision = getattr(args, "precision", "fp32")
    name = ("speak" if args.speak_only else "results") + ("" if precision == "fp32" else f"-{precision}")
    results = {**header(), **results}
    (args.workdir / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


def print_results(results: dict, path: Path | None) -> int:
    """The results as JSON on standard output, and into `path` where one is given (--json)."""
    text = json.dumps(results, indent=2) + "\n"
    if path:
        path.write_text(text)
    print(text)
    return 0


def write_results(results: dict, work: Path) -> int:
    """WORKDIR/results.json: the header (date, CPU, commit, command), then `results`; printed too."""
    results = {**header(), **results}
    (work / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


def header() -> dict:
    """What makes a results file readable on its own (docs/benchmarks.md renders benchmarks/results/*.json): the
    date, this machine's CPU and flags, the commit and the command that made it."""
    import datetime

    commit = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    command = " ".join([f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]])
    return {"date": datetime.date.today().isoformat(), "cpu": cpu_flags(), "commit": commit, "command": command}


def cpu_flags() -> str:
    from vibevoice_onnx.runtime.bench import cpu_description

    return cpu_description()


def run(main) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crashing phase should not leave a core dump behind
    sys.exit(main())
