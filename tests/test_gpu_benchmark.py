"""benchmarks/gpu.py, the prepared GPU run, as far as a machine without a GPU can take it: it refuses without a CUDA
provider (one sentence naming onnxruntime-gpu and the swap, exit 2), and its --device cpu smoke runs one plan
item end to end offline into a JSON whose every measured step carries its command and numbers."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import copy_bundle

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu.py"


def run_script(*args: str, timeout: float, path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path or os.environ["PATH"], "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1"}  # nothing may be fetched
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout)


def test_refuses_without_cuda_provider(tmp_path):
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers() and shutil.which("nvidia-smi"):
        pytest.skip("this machine has a CUDA provider and nvidia-smi: the script would run")
    proc = run_script("--workdir", str(tmp_path / "work"), timeout=60)
    assert proc.returncode == 2, proc.stderr
    message = proc.stderr.strip()
    assert message.count("\n") == 0 and message.endswith("."), message
    assert "onnxruntime-gpu" in message and "pip uninstall -y onnxruntime && pip install onnxruntime-gpu" in message
    assert "--device cpu" in message
    assert not (tmp_path / "work").exists()  # refused before any work


def test_gpu_plan_is_commands_the_cli_takes(tmp_path):
    """The GPU plan (--dry-run: printed, nothing run or written) in its order, each command one the CLI parses."""
    from vibevoice_onnx.cli import build_parser

    proc = run_script("--dry-run", "--workdir", str(tmp_path / "work"), timeout=60)
    assert proc.returncode == 0, proc.stderr
    steps = json.loads(proc.stdout)
    assert not (tmp_path / "work").exists()
    for name, step in steps.items():
        if step["command"] is None:  # only the CUDA-graphs run, where bench has no --cuda-graphs yet
            assert name.endswith("--cuda-graphs") and step["status"] == "not available in this version", name
            continue
        assert step["status"] == "planned" and 0 < step["limit_seconds"] <= 240, (name, step)
        argv = shlex.split(step["command"])
        assert argv[:3] == [sys.executable, "-m", "vibevoice_onnx.cli"], argv
        try:
            build_parser().parse_args(argv[3:])
        except SystemExit as error:
            pytest.fail(f"{name}: the CLI refuses {step['command']} ({error})")
    names = list(steps)
    full = [n for n in names if n.startswith("realtime-full cuda_fp16 bench")]
    assert full == [f"realtime-full cuda_fp16 bench x{k}" for k in (1, 8, 32, 64)]
    assert names.index("realtime-full cuda_fp32 build") < names.index("realtime-full cuda_fp16 build")  # fp16 from fp32
    assert steps["realtime-full cuda_fp16_fixed build"]["command"].endswith("--device cuda --precision fp16 --profile fixed")
    assert "realtime-full cuda_fp16_fixed bench x1 --cuda-graphs" in steps
    for item in ("realtime-tiny", "1.5b-tiny", "realtime-full"):
        for precision in ("fp16", "fp32"):
            assert f"{item} cuda_{precision} verify" in steps
    assert names[-1] == "realtime-full cuda_fp32 bench x64"  # the deadline cuts the fp32 baseline first


def test_cpu_smoke_runs_one_item_offline(tiny_checkpoints, tiny_preset, tiny_bundle, tmp_path):
    """The tiny realtime item on the CPU provider: the session's bundle (a copy: bench records into it) is kept with
    --reuse, so the run is voice import, verify and two benches (about 35 s on 2 cores). A stand-in nvidia-smi on
    PATH answers the GPU queries, so the description and the memory polling run too."""
    checkpoint = tmp_path / "checkpoint"  # the session's tiny checkpoint with the preset make-checkpoint would add
    checkpoint.mkdir()
    for path in tiny_checkpoints["realtime"].iterdir():
        (checkpoint / path.name).symlink_to(path)
    (checkpoint / "voices").mkdir()
    shutil.copyfile(tiny_preset, checkpoint / "voices" / "synthetic.pt")
    work = tmp_path / "work"
    copy_bundle(tiny_bundle, work / "realtime-tiny" / "onnx" / "realtime" / "cpu_fp32")
    out = tmp_path / "gpu.json"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\ncase "$*" in\n  *name,driver*) echo "NVIDIA Stand-In 80GB, 550.54, 81559 MiB" ;;\n'
                   '  *) echo 1234 ;;\nesac\n')
    smi.chmod(0o755)
    proc = run_script("--device", "cpu", "--only", "realtime-tiny", "--frames", "8", "--streams", "1,2", "--reuse",
                      "--checkpoint", f"realtime-tiny={checkpoint}", "--workdir", str(work), "--out", str(out),
                      timeout=240, path=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads(out.read_text())
    for key in ("date", "cpu", "commit", "command", "onnxruntime", "providers", "bench_cuda_graphs"):
        assert record[key], key
    assert record["device"] == "cpu" and len(record["commit"].split()[0]) == 40
    assert record["gpu"] == "NVIDIA Stand-In 80GB, driver 550.54, 81559 MiB"
    steps = {key: value for key, value in record.items() if isinstance(value, dict) and "status" in value}
    assert list(steps) == ["realtime-tiny make-checkpoint", "realtime-tiny cpu_fp32 build", "realtime-tiny cpu_fp32 voice",
                           "realtime-tiny cpu_fp32 verify", "realtime-tiny cpu_fp32 bench x1",
                           "realtime-tiny cpu_fp32 bench x2"]
    assert all(step["status"] == "ok" for step in steps.values()), steps
    verify = steps["realtime-tiny cpu_fp32 verify"]
    assert verify["command"].endswith("verify " + str(work / "realtime-tiny/onnx/realtime/cpu_fp32") + " --json")
    assert verify["passed"] is True and verify["gates_failed"] == [] and verify["gates"] and verify["worst_cosine"] > 0.99
    for streams in (1, 2):
        bench = steps[f"realtime-tiny cpu_fp32 bench x{streams}"]
        assert " bench " in bench["command"] and "--frames 8" in bench["command"]
        assert ("--streams 2" in bench["command"]) == (streams == 2)
        assert bench["rtf"] > 0 and bench["first_audio_ms"] > 0 and bench["throughput"] > 0
        assert bench["late_frames"] >= 0 and bench["gates"] == "passed" and bench["seconds"] > 0
        assert bench["gpu_peak_mib"] == 1234 and bench["gpu_memory_before_mib"] == 1234  # polled during the step
    assert "throughput_vs_one" in steps["realtime-tiny cpu_fp32 bench x2"]
    table = out.with_suffix(".md").read_text()
    assert "| realtime-tiny cpu_fp32 bench x2 | ok |" in table and table.strip().splitlines()[-1] in proc.stdout

    sys.path.insert(0, str(REPO))
    try:  # the docs site renders benchmarks/results/*.json with this hook: a results file of this script must render
        from docs_hooks.benchmarks import render
    finally:
        sys.path.remove(str(REPO))
    assert "realtime-tiny cpu_fp32 bench x2" in render(out.name, record)


def test_thread_scaling_runs_each_count_it_can_and_skips_the_rest(tiny_bundle, tmp_path):
    """benchmarks/threads.py (the thread counts of the performance issue, beside the GPU run): the tiny bundle at
    1 and 2 threads, one round; a count above this machine's cores is skipped and named, not run."""
    bundle = copy_bundle(tiny_bundle, tmp_path / "bundle")  # bench records into the bundle's manifest
    out = tmp_path / "threads.json"
    cores = len(os.sched_getaffinity(0))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "threads.py"), str(bundle), "--threads",
                           f"1,2,{cores + 1}", "--frames", "4", "--rounds", "1", "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["skipped_thread_counts"] == [cores + 1] and record["cores"] == cores
    runnable = [n for n in (1, 2) if n <= cores]
    assert list(record["threads"]) == [str(n) for n in runnable]
    for n in runnable:
        measured = record["threads"][str(n)]
        assert measured["real_time_factor"]["median"] > 0 and len(measured["real_time_factor"]["rounds"]) == 1
        assert measured["peak_memory_bytes"]["median"] > 1e7 and "upper_lm" in measured["graphs_ms_per_frame"]
