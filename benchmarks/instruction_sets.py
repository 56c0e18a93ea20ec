"""Whether a quantized bundle's verdict depends on the CPU it is judged on: tiny int8 and int4 bundles verified on
this host and again under QEMU's user-mode emulation of an AVX2-only CPU (`qemu-x86_64 -cpu Haswell`: AVX2 and FMA,
no AVX-512), where onnxruntime's and torch's kernels pick their AVX2 code through CPUID as they would on such a
machine (torch reports its capability: it is printed). Each gate's verdict and measured values, side by side.

    .venv/bin/python benchmarks/instruction_sets.py --workdir /tmp/isa --out benchmarks/results/DATE-instruction-sets.json

Needs QEMU's user mode (Debian: apt install qemu-user). Emulation is slow (a tiny verify: about 1.5 minutes against
15 s). No AMX: QEMU does not emulate it. Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from phases import CLI, header, run

HOSTS = {"this host": [], "AVX2 only (QEMU Haswell)": ["qemu-x86_64", "-cpu", "Haswell"]}
CASES = [("realtime", "int8"), ("realtime", "int4"), ("1.5b", "int8"), ("1.5b", "int4")]


def capability(prefix: list[str]) -> str:
    """torch's view of the CPU under `prefix` (AVX512, AVX2, ...)."""
    probe = [*prefix, sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"]
    return subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()


def bundle(work: Path, kind: str, precision: str) -> tuple[Path, Path]:
    """The tiny checkpoint of `kind` and its bundle at `precision` (graphs written), made once in `work`."""
    checkpoint, built = work / f"ck-{kind}", work / "bundles" / kind / f"cpu_{precision}"
    if not (checkpoint / "config.json").is_file():
        subprocess.run([*CLI, "make-checkpoint", kind, str(checkpoint), "--size", "tiny"], check=True,
                       capture_output=True)
    if not (built / "manifest.json").is_file():
        subprocess.run([*CLI, "build", str(checkpoint), "-o", str(work / "bundles"), "--precision", precision,
                        "--graphs", "written"], check=True, capture_output=True)
    return checkpoint, built


def verified(prefix: list[str], checkpoint: Path, built: Path) -> tuple[dict, float]:
    """`verify --json` under `prefix`: its record, and the seconds it took."""
    start = time.perf_counter()
    done = subprocess.run([*prefix, *CLI, "verify", str(built), "--checkpoint", str(checkpoint), "--json"],
                          capture_output=True, text=True)
    if not done.stdout.strip():
        raise SystemExit(f"verify under {prefix or 'this host'} gave no record: {done.stderr[-2000:]}")
    return json.loads(done.stdout), round(time.perf_counter() - start, 1)


def measured(gate: dict) -> dict:
    """A gate's numbers (what it measured), without its limits and words."""
    return {k: v for k, v in gate.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and not k.startswith(("min_", "max_", "limit"))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, required=True, help="the tiny checkpoints and their bundles")
    parser.add_argument("--out", default="instruction-sets.json", help="the results file to write")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    report = {**header(), "hosts": {name: capability(prefix) for name, prefix in HOSTS.items()}, "cases": []}
    for kind, precision in CASES:
        checkpoint, built = bundle(args.workdir, kind, precision)
        case = {"kind": kind, "precision": precision, "hosts": {}, "gates": {}}
        for name, prefix in HOSTS.items():
            record, seconds = verified(prefix, checkpoint, built)
            case["hosts"][name] = {"passed": record["passed"], "seconds": seconds,
                                   "failed": [g["name"] for g in record["gates"] if not g["passed"]]}
            for gate in record["gates"]:
                case["gates"].setdefault(gate["name"], {})[name] = {"passed": gate["passed"], **measured(gate)}
        verdicts = {tuple(sorted(h["failed"])) for h in case["hosts"].values()}
        case["same_verdicts"] = len(verdicts) == 1
        print(f"{kind} {precision}: " + ", ".join(f"{n} {'passed' if h['passed'] else 'failed ' + str(h['failed'])}"
                                                  for n, h in case["hosts"].items()), flush=True)
        report["cases"].append(case)
    report["same_verdicts_everywhere"] = all(c["same_verdicts"] for c in report["cases"])
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if report["same_verdicts_everywhere"] else 1


if __name__ == "__main__":
    run(main)
