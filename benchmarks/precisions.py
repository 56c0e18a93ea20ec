"""Every CPU precision of the realtime bundle: build (from the fp32 bundle), gates, and `bench` per precision
and decoder group size, with the PyTorch reference in the same run as the best passing variant.

    .venv/bin/python benchmarks/precisions.py --workdir bench-out/full     # after benchmarks/realtime.py

Needs WORKDIR/checkpoint and WORKDIR/onnx/realtime/cpu_fp32 (with voices) from benchmarks/realtime.py.
Results go to WORKDIR/precisions.json. Not part of CI.
"""

from __future__ import annotations

import json

from phases import CLI, header, parse_arguments, run, run_phase

PRECISIONS = ("int8", "int4-mixed", "int4")
GROUPS = (1, 3, 6)


def main() -> int:
    args = parse_arguments(__doc__, "bench-out/full", 48, "speech frames")
    work, results = args.workdir, {"frames": args.frames, "threads": args.threads}
    checkpoint, kind_root = work / "checkpoint", work / "onnx" / "realtime"
    for precision in PRECISIONS if not args.speak_only else ():
        run_phase(f"build_{precision}", [*CLI, "build", str(checkpoint), "-o", str(work / "onnx"), "--precision", precision],
                  results, work)
        proc = run_phase(f"verify_{precision}", [*CLI, "verify", str(kind_root / f"cpu_{precision}"), "--json"], results, work)
        if proc.returncode in (0, 1):
            parity = json.loads(proc.stdout)
            results[f"verify_{precision}"].update(passed=parity["passed"], closed_loop=parity["closed_loop"],
                                                  gates={g["name"]: [g["cosine"], g["max_abs"], g["passed"]] for g in parity["gates"]})
    best = None
    for precision in ("fp32", *PRECISIONS):
        for group in GROUPS:
            name = f"bench_{precision}_group{group}"
            proc = run_phase(name, [*CLI, "bench", str(kind_root / f"cpu_{precision}"), "--frames", str(args.frames),
                                    "--decode-group", str(group), "--threads", str(args.threads), "--json"], results, work)
            if proc.returncode == 0:
                report = json.loads(proc.stdout)
                results[name].update(report)
                rtf, gates = report["runtime"]["real_time_factor"], report["runtime"]["gates"]
                if gates == "passed" and (best is None or rtf < best[0]):
                    best = (rtf, precision, group)
    if best is not None:
        _, precision, group = best
        proc = run_phase("bench_best_with_reference", [
            *CLI, "bench", str(kind_root / f"cpu_{precision}"), "--frames", str(args.frames), "--decode-group", str(group),
            "--threads", str(args.threads), "--reference", str(checkpoint), "--json",
            "--plot", str(work / "latency.png")], results, work)
        if proc.returncode == 0:
            results["bench_best_with_reference"].update(json.loads(proc.stdout))
    (work / "precisions.json").write_text(json.dumps({**header(), **results}, indent=2) + "\n")
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk in ("seconds", "peak_rss_gb", "passed")}
                      for k, v in results.items() if isinstance(v, dict)}, indent=2))
    return 0


if __name__ == "__main__":
    run(main)
