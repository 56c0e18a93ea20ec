"""`vibevoice-onnx bench`: how fast a realtime bundle speaks here, and why.

Exactly N frames are generated (the EOS decision is computed but not acted on, so a random checkpoint that
would stop early still gives a full run), with a fixed text and noise. Reported: real-time factor, time to
first audio, milliseconds per frame of each graph, the weight bytes each frame reads and the floor that this
machine's memory bandwidth (measured here) puts under it, and peak memory. With a checkpoint, the PyTorch
reference runs the same loop on the same weights, text, voice and noise in a child process, in the same run.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ..errors import VibeVoiceError
from ..generation.realtime import GenerationResult, realtime_frames
from ..sampling import NoiseSource
from ..text import encode_tts_text
from .bundle import Bundle, cpu_session_options, shared_pool_threads
from .realtime import DECODE_GROUP, OnnxRealtimeBackend

BENCH_TEXT = (
    "VibeVoice turns text into speech one frame at a time. This benchmark measures how fast the ONNX runtime "
    "speaks compared with the PyTorch reference, on the same weights, with the same voice and the same noise."
)
NOISE_SEED = 42
FRAME_SECONDS = 3200 / 24000


def memory_bandwidth(threads: int | None, megabytes: int = 512, repeats: int = 10) -> float:
    """Bytes per second onnxruntime reads here with these threads: the best of `repeats` row sums over a weight
    of `megabytes` (graph optimisations off, so the sums are not folded away at load). Rows, because a sum
    down to one number runs on one thread: on 2 cores it read 15 GB/s where row sums (and an fp32 GEMV as the
    LMs run it) read 26-29."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rows = 256
    weight = numpy_helper.from_array(np.ones((rows, megabytes * 2**20 // 4 // rows), np.float32), "weight")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    graph = helper.make_graph([helper.make_node("ReduceSum", ["weight", "axes"], ["sums"], keepdims=0)], "bandwidth", [],
                              [helper.make_tensor_value_info("sums", TensorProto.FLOAT, [rows])], [weight, axes])
    options = cpu_session_options(threads)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString(),
                                   options, providers=["CPUExecutionProvider"])
    best = min(_timed(lambda: session.run(None, {})) for _ in range(repeats))
    return megabytes * 2**20 / best


def _timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def peak_memory_bytes(children: bool = False) -> int:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF)
    return usage.ru_maxrss * 1024  # kilobytes on Linux


def run_runtime(bundle_dir: Path, frames: int, voice: str | None, threads: int | None, decode_group: int) -> dict:
    bundle = Bundle(Path(bundle_dir), threads=threads)
    bundle.require_kind("realtime")
    timings = bundle.time_calls()
    backend = OnnxRealtimeBackend(bundle)
    voices = bundle.voices()
    voice = voice or (voices[0] if voices else None)
    if voice is None:
        raise VibeVoiceError(f"{bundle.path}: has no voices; import one with `vibevoice-onnx voices import`")
    prompt, ids = bundle.voice(voice), encode_tts_text(bundle.tokenizer, BENCH_TEXT)
    noise = NoiseSource.from_seed(NOISE_SEED)
    for values in timings.values():
        values.clear()  # session creation is not part of the run
    result, frame_times = GenerationResult(), []
    start = time.perf_counter()
    for _ in realtime_frames(backend, prompt, ids, noise, 1.5, 5, frames, result, stop_on_eos=False,
                             decode_group=decode_group):
        frame_times.append(time.perf_counter() - start)
    wall = time.perf_counter() - start
    per_graph = {name: {"calls": len(values), "ms_per_frame": 1000 * sum(values) / frames}
                 for name, values in sorted(timings.items())}
    # The run above is the first after loading: its first audio pays each session's one-time setup. A service
    # that stays loaded answers later requests warm; the same start, once more, says how fast that is.
    start, warm = time.perf_counter(), realtime_frames(backend, prompt, ids, noise, 1.5, 5, 1, GenerationResult())
    next(warm)
    warm_first_audio = time.perf_counter() - start
    read = sum(bundle.weight_bytes(name) * stats["calls"] for name, stats in per_graph.items()) / frames
    return {
        "bundle": str(bundle.path), "precision": bundle.manifest["precision"], "gates": gate_status(bundle),
        "voice": voice, "frames": result.frames,
        "decode_group": decode_group, "shared_pool_threads": shared_pool_threads(), "wall_seconds": wall, "real_time_factor": wall / (result.frames * FRAME_SECONDS),
        "first_audio_seconds": frame_times[0], "warm_first_audio_seconds": warm_first_audio, "chunk_times": frame_times,
        "graphs": per_graph,
        "weight_bytes_per_frame": read, "peak_memory_bytes": peak_memory_bytes(),
        "weight_bytes": sum(bundle.weight_bytes(name) for name in bundle.manifest["graphs"]),
        # The token-embedding table and the small tensors: memory-mapped, so only the rows a text looks up count.
        "host_tensor_bytes": (bundle.path / bundle.manifest["host_tensors"]).stat().st_size,
    }


def gate_status(bundle: Bundle) -> str:
    parity = bundle.manifest.get("parity")
    return "not verified" if not parity else "passed" if parity["passed"] else "FAILED"


def run_reference(checkpoint: Path, bundle_dir: Path, voice: str, frames: int, threads: int | None) -> dict:
    """The PyTorch reference on the same weights, text, voice and noise, in a child process (its own memory)."""
    command = [sys.executable, "-m", "vibevoice_onnx.reference.timing", str(checkpoint), str(bundle_dir), voice,
               BENCH_TEXT, str(NOISE_SEED), str(frames), str(threads or 0)]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode:
        raise VibeVoiceError(f"the PyTorch reference run failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "peak_memory_bytes": peak_memory_bytes(children=True)}


def bench(bundle_dir: Path, frames: int = 48, voice: str | None = None, reference: Path | None = None,
          threads: int | None = None, decode_group: int = DECODE_GROUP) -> dict:
    if frames < 2:
        raise VibeVoiceError(f"bench needs at least 2 frames, got {frames}")
    runtime = run_runtime(bundle_dir, frames, voice, threads, decode_group)  # first: its peak memory is its own
    bandwidth = memory_bandwidth(threads)
    report = {"runtime": runtime, "bandwidth_bytes_per_second": bandwidth}
    runtime["bandwidth_floor_ms_per_frame"] = 1000 * runtime["weight_bytes_per_frame"] / bandwidth
    if reference is not None:
        report["reference"] = run_reference(reference, bundle_dir, runtime["voice"], frames, threads)
    return report


def format_report(report: dict) -> str:
    runtime = report["runtime"]
    per_frame = 1000 * runtime["wall_seconds"] / runtime["frames"]
    lines = [
        f"bundle        {runtime['bundle']} ({runtime['precision']}, gates {runtime['gates']}), voice {runtime['voice']}, "
        f"{runtime['frames']} frames, decode group {runtime['decode_group']}, "
        f"{'one shared thread pool' if runtime['shared_pool_threads'] else 'a thread pool per session'}",
        f"runtime       real-time factor {runtime['real_time_factor']:.3f}, first audio {1000 * runtime['first_audio_seconds']:.0f} ms "
        f"(warm: {1000 * runtime['warm_first_audio_seconds']:.0f} ms), "
        f"{per_frame:.1f} ms per frame, peak memory {runtime['peak_memory_bytes'] / 1e9:.2f} GB "
        f"({runtime['peak_memory_bytes'] / runtime['weight_bytes']:.2f}x the {runtime['weight_bytes'] / 1e9:.2f} GB of graph weights it loads; "
        f"{runtime['peak_memory_bytes'] / (runtime['weight_bytes'] + runtime['host_tensor_bytes']):.2f}x with the "
        f"{runtime['host_tensor_bytes'] / 1e9:.2f} GB of memory-mapped host tensors)",
        f"memory        {runtime['weight_bytes_per_frame'] / 1e9:.3f} GB of weights read per frame; at the measured "
        f"{report['bandwidth_bytes_per_second'] / 1e9:.1f} GB/s that is a floor of {runtime['bandwidth_floor_ms_per_frame']:.1f} ms "
        f"per frame ({per_frame / runtime['bandwidth_floor_ms_per_frame']:.1f}x above it)",
        "per graph     " + ", ".join(f"{name} {s['ms_per_frame']:.1f} ms ({s['calls']} calls)" for name, s in runtime["graphs"].items()),
    ]
    if "reference" in report:
        ref = report["reference"]
        lines.append(f"reference     real-time factor {ref['real_time_factor']:.3f}, first audio {1000 * ref['first_audio_seconds']:.0f} ms, "
                     f"{1000 * ref['wall_seconds'] / ref['frames']:.1f} ms per frame, peak memory {ref['peak_memory_bytes'] / 1e9:.2f} GB; "
                     f"the runtime is {ref['wall_seconds'] / runtime['wall_seconds']:.2f}x faster")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    """When each frame's audio was ready, against the deadline a listener sets from the first audio on."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise VibeVoiceError("--plot needs matplotlib (pip install matplotlib)") from None
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for label, run in (("runtime", report["runtime"]), ("PyTorch reference", report.get("reference"))):
        if run:
            times = np.asarray(run["chunk_times"])
            frames = np.arange(1, len(times) + 1)
            axes.plot(frames, times, marker=".", label=f"{label}: audio ready")
            axes.plot(frames, times[0] + (frames - 1) * FRAME_SECONDS, linestyle="--", linewidth=1,
                      label=f"{label}: playback deadline")
    axes.set_xlabel("frame (133 ms of audio each)")
    axes.set_ylabel("seconds since the request")
    axes.set_title(f"{Path(report['runtime']['bundle']).name}: per-frame latency")
    axes.legend()
    figure.tight_layout()
    try:
        figure.savefig(path)
    except OSError as e:
        raise VibeVoiceError(f"{path}: cannot write the plot ({e.strerror or e})") from None
    finally:
        plt.close(figure)
