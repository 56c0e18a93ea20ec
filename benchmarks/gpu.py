"""The GPU run: synthetic checkpoints built for onnxruntime's CUDA provider (fp16 and fp32, and the realtime fixed
profile), their gates, and `bench` at 1, 8, 32 and 64 batched streams with the GPU's peak memory, in one script.

    python benchmarks/gpu.py                      # on a machine with an NVIDIA GPU and onnxruntime-gpu
    python benchmarks/gpu.py --device cpu         # the same plan's plumbing on the CPU (tiny checkpoints)

Offline: the checkpoints are made here (`make-checkpoint`, tokenizer included), nothing is downloaded. The plan:
a tiny realtime, a full-size realtime and a tiny 1.5B checkpoint, each built cuda_fp32 and cuda_fp16 (the fp16
graphs converted from the fp32 ones), the full-size one also cuda_fp16 with `--profile fixed`; each bundle
verified (`verify --json`: pass or fail and every gate's numbers) and timed with `bench --json`: the full-size
fp16 one at every --streams count, its fp32 one at one stream and the largest count, the fixed one at one stream
with and without `--cuda-graphs` (where this version's `bench` has it), the tiny ones at one stream.

Each step runs in its own process with its own time limit while a thread polls nvidia-smi for the GPU's peak
memory; a step that fails or runs out of time is recorded so and the plan goes on; past --deadline (default
450 s) the rest is recorded as skipped, so a run ends within 8 minutes (a second run with --reuse --only ITEMS
finishes what it cut, reusing the builds). --dry-run prints the plan's commands and limits and runs nothing.

Results: one JSON (each number beside the command that measured it, the commit, the GPU, onnxruntime's version
and providers), default benchmarks/results/DATE-gpu-GPUNAME.json, and a markdown table printed and written
beside it. Without a CUDA provider or nvidia-smi it refuses (exit 2) unless --device cpu is given: then the plan
runs on the CPU provider with the tiny checkpoints only, fp32, and fewer frames (a smoke run of its plumbing).
Not part of CI (tests/test_gpu_benchmark.py runs the CPU smoke of one item).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from phases import CLI, header, run

REPO = Path(__file__).resolve().parents[1]
SWAP = "pip uninstall -y onnxruntime && pip install onnxruntime-gpu"
CHECKPOINTS = {"realtime-tiny": ("realtime", "tiny"), "1.5b-tiny": ("1.5b", "tiny"), "realtime-full": ("realtime", "full")}
LIMITS = {  # seconds a step may take, by checkpoint size (a datacenter GPU host; the CPU smoke runs tiny ones only)
    "tiny": {"make": 60, "build": 90, "voice": 60, "verify": 90, "bench": 90},
    "full": {"make": 150, "build": 240, "voice": 60, "verify": 180, "bench": 120},
}


@dataclass
class Item:
    """One bundle of the plan and how it is timed: `streams` None for every --streams count, or these."""

    name: str
    checkpoint: str
    precision: str
    fixed: bool = False
    streams: tuple[int, ...] | None = None


def plan(device: str, largest: int) -> list[Item]:
    """The bundles in the order they are measured, what matters most first so that the deadline cuts the least:
    the tiny checkpoints' gates and one stream (quick; the tiny 1.5B's the only 1.5B check), the full-size realtime
    fp16 at every stream count, its fixed profile, and last the fp32 baseline. On the CPU the tiny realtime stands
    in for the full-size one."""
    if device == "cpu":
        return [Item("realtime-tiny", "realtime-tiny", "fp32"), Item("realtime-tiny-fixed", "realtime-tiny", "fp32", True, (1,)),
                Item("1.5b-tiny", "1.5b-tiny", "fp32", streams=(1,))]
    return [Item("realtime-tiny", "realtime-tiny", "fp16", streams=(1,)),
            Item("realtime-tiny", "realtime-tiny", "fp32", streams=(1,)),
            Item("realtime-full", "realtime-full", "fp16"),
            Item("realtime-full-fixed", "realtime-full", "fp16", True, (1,)),
            Item("1.5b-tiny", "1.5b-tiny", "fp16", streams=(1,)), Item("1.5b-tiny", "1.5b-tiny", "fp32", streams=(1,)),
            Item("realtime-full", "realtime-full", "fp32", streams=(1, largest))]


@dataclass
class Runner:
    """Runs the steps in order against one deadline, each recorded under its name in `results`."""

    deadline: float
    workdir: Path
    gpu: bool
    dry: bool = False
    results: dict = field(default_factory=dict)

    def ok(self, name: str) -> bool:
        return self.results.get(name, {}).get("status") in ("ok", "planned")

    def step(self, name: str, command: list[str] | None, limit: float, needs: tuple[str, ...] = (), note: str = "") -> dict:
        record: dict = {"command": shlex.join(command) if command else None}
        self.results[name] = record
        missing = [n for n in needs if not self.ok(n)]
        left = self.deadline - time.monotonic()
        if command is None:
            record["status"] = note
        elif missing:
            record["status"] = f"skipped: {missing[0]} did not succeed"
        elif self.dry:
            record.update(status="planned", limit_seconds=limit)
        elif left < 5:
            record["status"] = "skipped: past the total deadline"
        else:
            record.update(self._run(name, command, min(limit, left)))
        if not self.dry:
            print(f"{name}: {record['status']}" + (f" in {record['seconds']} s" if "seconds" in record else ""), flush=True)
        return record

    def _run(self, name: str, command: list[str], limit: float) -> dict:
        """The command in its own process group, its output to WORKDIR/logs; killed (the group) at `limit`."""
        logs = self.workdir / "logs"
        logs.mkdir(exist_ok=True)
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
        out, err = logs / f"{slug}.out", logs / f"{slug}.err"
        poll = GpuPoll() if self.gpu else None
        start = time.monotonic()
        with open(out, "w") as stdout, open(err, "w") as stderr:
            proc = subprocess.Popen(command, stdout=stdout, stderr=stderr, start_new_session=True)
        timed_out = False
        while True:  # wait4: this child's own peak RSS, not the maximum over every child so far
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - start > limit and not timed_out:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        record = {"seconds": round(time.monotonic() - start, 1), "exit": proc.returncode,
                  "host_peak_rss_gb": round(usage.ru_maxrss / 2**20, 2), "log": str(err)}
        if poll is not None:
            record.update(poll.stop())
        record["status"] = (f"timed out after {limit:.0f} s" if timed_out else "ok" if proc.returncode == 0
                            else f"failed (exit {proc.returncode})")
        record["stdout"] = str(out)
        return record


class GpuPoll:
    """nvidia-smi's memory.used, polled in a thread from construction to stop(): the peak, in MiB."""

    def __init__(self, every: float = 0.2):
        self.before = gpu_memory_used()
        self.peak, self.every, self.done = self.before, every, threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.done.wait(self.every):
            used = gpu_memory_used()
            if used is not None:
                self.peak = max(self.peak or 0, used)

    def stop(self) -> dict:
        self.done.set()
        self.thread.join()
        return {"gpu_memory_before_mib": self.before, "gpu_peak_mib": self.peak}


def gpu_memory_used() -> int | None:
    """The most memory in use on any visible GPU, MiB (None where nvidia-smi does not answer)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=5).stdout
        return max(int(line) for line in out.split())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def gpu_description() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return "; ".join(f"{name}, driver {driver}, {memory}" for name, driver, memory in
                     (line.split(", ") for line in out.splitlines() if line.count(", ") == 2)) or None


def cuda_missing() -> str | None:
    """Why this machine cannot run the GPU plan, or None."""
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return f"onnxruntime {onnxruntime.__version__} here has no CUDAExecutionProvider"
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi is not on PATH"
    return None


def has_cuda_graphs() -> bool:
    """Whether this version's `bench` takes --cuda-graphs (fixed-profile CUDA bundles)."""
    proc = subprocess.run([*CLI, "bench", "--help"], capture_output=True, text=True, timeout=60)
    return "--cuda-graphs" in proc.stdout


def voice_sample(path: Path) -> Path:
    """A few seconds of a voiced tone for the 1.5B's voice (its voices are recordings; no fixture is needed)."""
    import numpy as np
    import soundfile

    t = np.arange(3 * 24000) / 24000
    tone = sum(np.sin(2 * np.pi * 140 * k * t + np.sin(2 * np.pi * 5 * t)) / k for k in (1, 2, 3))
    soundfile.write(str(path), (0.15 * tone).astype(np.float32), 24000)
    return path


def parse_verify(stdout: str) -> dict:
    parity = json.loads(stdout)
    gates = {g["name"]: [g["cosine"], g["max_abs"], g["passed"]] for g in parity["gates"]}
    return {"passed": parity["passed"], "gates_failed": [n for n, g in gates.items() if not g[2]],
            "worst_cosine": min((g[0] for g in gates.values() if g[0] is not None), default=None), "gates": gates}


def parse_bench(stdout: str) -> dict:
    """bench's headline numbers (runtime.bench): per stream, the median and worst real-time factor and first audio,
    the late frames (their audio due before it was ready) over all streams, the throughput in seconds of audio a
    second, and the host process's peak memory."""
    from vibevoice_onnx.runtime.bench import late_frames

    report = json.loads(stdout)
    if "runtime" in report:  # one stream
        one = report["runtime"]
        streams = [{"real_time_factor": one["real_time_factor"], "first_audio_seconds": one["first_audio_seconds"],
                    "late_frames": late_frames(one["chunk_times"])}]
        numbers = {"throughput": 1 / one["real_time_factor"], "gates": one["gates"],
                   "warm_first_audio_ms": 1000 * one["warm_first_audio_seconds"],
                   "host_peak_gb": one["peak_memory_bytes"] / 1e9}
    else:
        streams = report["together"]["per_stream"]
        numbers = {"throughput": report["together"]["throughput"], "throughput_vs_one": report["throughput_ratio"],
                   "steady_vs_one": report["steady_ratio"], "gates": report["gates"],
                   "host_peak_gb": report["peak_memory_bytes"] / 1e9}
    rtf = [s["real_time_factor"] for s in streams]
    first = [1000 * s["first_audio_seconds"] for s in streams]
    numbers.update(rtf=statistics.median(rtf), rtf_max=max(rtf), first_audio_ms=statistics.median(first),
                   first_audio_ms_max=max(first), late_frames=sum(s["late_frames"] for s in streams),
                   streams_late=sum(1 for s in streams if s["late_frames"]))
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in numbers.items()}


def measured(runner: Runner, name: str, command: list[str], limit: float, needs: tuple[str, ...], parse) -> None:
    record = runner.step(name, command, limit, needs)
    if "stdout" in record and record["exit"] in (0, 1) and Path(record["stdout"]).stat().st_size:
        try:
            record.update(parse(Path(record["stdout"]).read_text()))
        except (ValueError, KeyError) as error:
            record["parse_error"] = f"{type(error).__name__}: {error}"


def run_plan(args: argparse.Namespace, runner: Runner, cuda_graphs: bool) -> None:
    prepared: set[tuple] = set()
    for item in plan(args.device, max(args.streams)):
        if args.only and item.name not in args.only:
            continue
        checkpoint, made = prepare_checkpoint(args, runner, item.checkpoint)
        variants = [(item.precision, item.fixed)]
        if item.precision != "fp32" and not item.fixed:
            variants.insert(0, ("fp32", False))  # fp16 starts from the fp32 graphs beside it
        for precision, fixed in variants:
            if (item.checkpoint, precision, fixed) not in prepared:
                prepared.add((item.checkpoint, precision, fixed))
                prepare_bundle(args, runner, item.checkpoint, checkpoint, made, precision, fixed)
        measure(args, runner, item, cuda_graphs)


def bundle_of(args: argparse.Namespace, name: str, precision: str, fixed: bool) -> tuple[Path, str]:
    """WORKDIR/NAME/onnx/KIND/DEVICE_PRECISION[_fixed], and the steps' name for it."""
    bundle = args.workdir / name / "onnx" / CHECKPOINTS[name][0] / f"{args.device}_{precision}{'_fixed' if fixed else ''}"
    return bundle, f"{name} {bundle.name}"


def prepare_checkpoint(args: argparse.Namespace, runner: Runner, name: str) -> tuple[Path, str]:
    """The checkpoint NAME (--checkpoint's, or WORKDIR/NAME/checkpoint made once), and its step's name."""
    kind, size = CHECKPOINTS[name]
    checkpoint = args.checkpoint.get(name, args.workdir / name / "checkpoint")
    made = f"{name} make-checkpoint"
    if made in runner.results:
        pass
    elif (checkpoint / "config.json").is_file():
        runner.results[made] = {"command": None, "status": "ok", "note": f"reused {checkpoint}"}
    else:
        runner.step(made, [*CLI, "make-checkpoint", kind, str(checkpoint), "--size", size], LIMITS[size]["make"])
    return checkpoint, made


def prepare_bundle(args: argparse.Namespace, runner: Runner, name: str, checkpoint: Path, made: str, precision: str,
                   fixed: bool) -> None:
    """Build one bundle (kept with --reuse where it is there) and import the synthetic voice into it."""
    kind, size = CHECKPOINTS[name]
    bundle, tag = bundle_of(args, name, precision, fixed)
    if args.reuse and (bundle / "manifest.json").is_file():
        runner.results[f"{tag} build"] = {"command": None, "status": "ok", "note": f"reused {bundle} (--reuse)"}
    else:
        runner.step(f"{tag} build", [*CLI, "build", str(checkpoint), "-o", str(bundle.parents[1]), "--device", args.device,
                                     "--precision", precision, *(["--profile", "fixed"] if fixed else [])],
                    LIMITS[size]["build"], (made,))
    voice = checkpoint / "voices" / "synthetic.pt" if kind == "realtime" else bundle.parents[2] / "voice.wav"
    if kind != "realtime" and not runner.dry:
        voice_sample(voice)
    runner.step(f"{tag} voice", [*CLI, "voices", "import", str(bundle), str(voice), "--name", "synthetic", "--force"],
                LIMITS[size]["voice"], (f"{tag} build",))


def measure(args: argparse.Namespace, runner: Runner, item: Item, cuda_graphs: bool) -> None:
    """verify, then bench at each stream count (and with --cuda-graphs for a fixed bundle)."""
    limits = LIMITS[CHECKPOINTS[item.checkpoint][1]]
    bundle, tag = bundle_of(args, item.checkpoint, item.precision, item.fixed)
    ready = (f"{tag} build", f"{tag} voice")
    measured(runner, f"{tag} verify", [*CLI, "verify", str(bundle), "--json"], limits["verify"], ready, parse_verify)
    for streams in item.streams or args.streams:
        bench = [*CLI, "bench", str(bundle), "--frames", str(args.frames), "--json"]
        bench += ["--streams", str(streams)] if streams > 1 else []
        measured(runner, f"{tag} bench x{streams}", bench, limits["bench"], ready, parse_bench)
        if not item.fixed:
            continue
        name = f"{tag} bench x{streams} --cuda-graphs"
        if args.device != "cuda":
            runner.step(name, None, 0, note="not run: CUDA graphs are for CUDA bundles")
        elif not cuda_graphs:
            runner.step(name, None, 0, note="not available in this version")
        else:
            measured(runner, name, [*bench, "--cuda-graphs"], limits["bench"], ready, parse_bench)


def summary(results: dict) -> str:
    """The steps as one markdown table (the JSON beside it has every command and gate)."""
    columns = ("status", "seconds", "gpu_peak_mib", "passed", "worst_cosine", "rtf", "rtf_max", "first_audio_ms",
               "late_frames", "throughput", "throughput_vs_one")
    lines = ["| step | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for name, record in results.items():
        cells = ["" if v is None else f"{v:.6g}" if c == "worst_cosine" else f"{v:.4g}" if isinstance(v, float)
                 else str(v) for c, v in ((c, record.get(c)) for c in columns)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: a smoke run of the plan on the CPU provider (tiny checkpoints, fp32)")
    parser.add_argument("--workdir", type=Path, default=Path("bench-out/gpu"))
    parser.add_argument("--frames", type=int, help="latents a bench stream generates (default 200; cpu 16)")
    parser.add_argument("--streams", default="1,8,32,64", help="the stream counts bench times (default 1,8,32,64)")
    parser.add_argument("--only", help="comma-separated plan items: realtime-tiny, 1.5b-tiny, realtime-full, "
                                       "realtime-full-fixed (cpu: realtime-tiny-fixed)")
    parser.add_argument("--checkpoint", action="append", default=[], metavar="NAME=DIR",
                        help="use this checkpoint for realtime-tiny, 1.5b-tiny or realtime-full (not made)")
    parser.add_argument("--reuse", action="store_true", help="keep the bundles already in WORKDIR (a rerun after a "
                        "step ran out of time; checkpoints there are always kept)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (each step's command and time limit) "
                        "as JSON and stop; needs no GPU")
    parser.add_argument("--deadline", type=float, default=450.0, help="seconds for the whole plan (default 450)")
    parser.add_argument("--out", type=Path, help="the JSON (default benchmarks/results/DATE-gpu-GPUNAME.json; "
                                                 "cpu: WORKDIR/DATE-gpu-cpu.json)")
    args = parser.parse_args()
    args.streams = [int(s) for s in args.streams.split(",")]
    args.only = set(args.only.split(",")) if args.only else set()
    args.frames = args.frames or (200 if args.device == "cuda" else 16)
    pairs = [entry.partition("=") for entry in args.checkpoint]
    if any(not sep or name not in CHECKPOINTS for name, sep, _ in pairs):
        parser.error(f"--checkpoint takes NAME=DIR, NAME one of {', '.join(CHECKPOINTS)}")
    args.checkpoint = {name: Path(path).resolve() for name, _, path in pairs}
    names = {item.name for item in plan(args.device, 1)}
    if args.only - names:
        parser.error(f"--only: {', '.join(sorted(args.only - names))} is not in the {args.device} plan "
                     f"({', '.join(sorted(names))})")
    return args


def main() -> int:
    args = parse_arguments()
    started = time.monotonic()
    if args.dry_run:  # the plan's commands and limits as JSON; nothing is run or written
        runner = Runner(started + args.deadline, args.workdir.resolve(), False, dry=True)
        run_plan(args, runner, has_cuda_graphs())
        print(json.dumps(runner.results, indent=2))
        return 0
    if args.device == "cuda" and (why := cuda_missing()):
        print(f"benchmarks/gpu.py needs an NVIDIA GPU and onnxruntime-gpu, and {why}: install onnxruntime-gpu in place "
              f"of onnxruntime (`{SWAP}`) on a machine with nvidia-smi, or pass --device cpu for a smoke run of the "
              "plan on the CPU.", file=sys.stderr)
        return 2
    import onnxruntime

    args.workdir.mkdir(parents=True, exist_ok=True)
    args.workdir = args.workdir.resolve()
    gpu = gpu_description()  # on the CPU too, where there is one: a smoke run polls it all the same
    cuda_graphs = has_cuda_graphs()
    runner = Runner(started + args.deadline, args.workdir, gpu is not None)
    run_plan(args, runner, cuda_graphs)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True).stdout.strip())
    record = {**header(), "commit": commit + (" (with uncommitted changes)" if dirty else ""), "gpu": gpu,
              "device": args.device, "onnxruntime": onnxruntime.__version__,
              "providers": onnxruntime.get_available_providers(), "python": sys.version.split()[0],
              "frames": args.frames, "streams": args.streams, "deadline_seconds": args.deadline,
              "bench_cuda_graphs": "available" if cuda_graphs else "not available in this version",
              "total_seconds": round(time.monotonic() - started, 1), **runner.results}
    name = re.sub(r"[^a-z0-9]+", "-", gpu.split(",")[0].lower()).strip("-") if args.device == "cuda" else "cpu"
    out = args.out or ((args.workdir if args.device == "cpu" else REPO / "benchmarks" / "results")
                       / f"{datetime.date.today().isoformat()}-gpu-{name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    table = summary(runner.results)
    out.with_suffix(".md").write_text(f"{gpu or args.device}, commit {commit[:12]}, {args.frames} latents a stream\n\n"
                                      f"{table}\n")
    print(f"\n{table}\n\nresults: {out} (commands and gates there), table: {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    run(main)
