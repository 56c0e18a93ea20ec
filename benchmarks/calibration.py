"""Verdicts by what each precision costs: a realtime checkpoint whose loop has a high gain (its diffusion head's
conditioning scaled, verify.calibration.high_gain_copy), every CPU precision built from one fp32 bundle, and an
int8 bundle broken on purpose (one graph's quantization scales off by a factor), each verified: the one-step
error teacher forcing measures, the loop's amplification, the free run against its own spread, the verdict.

    .venv/bin/python benchmarks/calibration.py --workdir bench-out/calibration          # full size, ~30 min
    .venv/bin/python benchmarks/calibration.py --size tiny --workdir bench-out/calibration-tiny

Results go to WORKDIR/calibration.json. Not part of CI.
"""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import sys

from phases import CLI, cpu_flags, parse_arguments, run, run_phase

from vibevoice_onnx.verify.calibration import high_gain_copy, wrong_scale

PRECISIONS = ("fp32", "int8", "int4-mixed", "int4")
BROKEN_GRAPH, BROKEN_FACTOR = "diffusion_head_step.onnx", 1.5


def summary(parity: dict) -> dict:
    """What the note needs of one verify: the verdict, what failed, one step's cost, the loop's gain."""
    calibration = parity["closed_loop"]["calibration"]
    forced = parity["closed_loop"]["teacher_forced"]
    return {
        "passed": parity["passed"],
        "failed": [g["name"] for g in parity["gates"] if not g["passed"]],
        "teacher_forced_min": {"conditions": min(forced["condition_cosine"]), "latents": min(forced["latent_cosine"])},
        "one_step_latent_error": {"median": calibration["floor"], "max": max(calibration["one_step_error"]["latent_relative"])},
        "amplification_per_frame": calibration["amplification_per_frame"],
        "free_run_worst_multiple_of_spread": calibration["worst_ratio"],
        "free_run_latent_min_cosine": next(g["cosine"] for g in parity["gates"]
                                           if g["name"] == "closed loop: latent divergence within the loop's own spread"),
        "verdict": calibration["verdict"],
    }


def main() -> int:
    args = parse_arguments(__doc__, "bench-out/calibration", 0, "unused")
    work = args.workdir
    results = {"date": datetime.date.today().isoformat(), "cpu": cpu_flags(), "size": args.size,
               "command": "benchmarks/calibration.py " + " ".join(sys.argv[1:]),
               "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()}
    base, checkpoint, onnx_root = work / "base", work / "high-gain", work / "onnx"
    if not (base / "config.json").is_file():
        run_phase("make_checkpoint", [*CLI, "make-checkpoint", "realtime", str(base), "--size", args.size], results, work)
    if not (checkpoint / "config.json").is_file():
        high_gain_copy(base, checkpoint)
    bundles = {}
    for precision in PRECISIONS:
        run_phase(f"build_{precision}", [*CLI, "build", str(checkpoint), "-o", str(onnx_root), "--precision", precision],
                  results, work)
        bundles[precision] = onnx_root / "realtime" / f"cpu_{precision}"
    broken = work / "broken-int8"
    shutil.rmtree(broken, ignore_errors=True)
    shutil.copytree(bundles["int8"], broken)
    results["broken"] = {"graph": BROKEN_GRAPH, "factor": BROKEN_FACTOR,
                         "tensor": wrong_scale(broken / BROKEN_GRAPH, BROKEN_FACTOR)}
    bundles["int8, broken"] = broken
    verdicts = {}
    for name, bundle in bundles.items():
        phase = "verify_" + name.replace(", ", "_")
        proc = run_phase(phase, [*CLI, "verify", str(bundle), "--json"], results, work)
        if proc.returncode in (0, 1):
            verdicts[name] = summary(json.loads(proc.stdout))
            results[phase].update(verdicts[name])
    (work / "calibration.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(verdicts, indent=2))
    return 0


if __name__ == "__main__":
    run(main)
