"""`vibevoice-onnx bench`: how fast a TTS bundle (realtime or 1.5B) speaks here, how that changes as a long run
goes on, and why.

Exactly N latents are generated whatever the model decides (realtime: EOS computed, not acted on; 1.5B: speech
picked at every step), with a fixed text and noise, so a random checkpoint gives a full run (each kind's
`bench_frames` says what it runs). Reported: real-time factor, time to first audio, milliseconds per latent of
each graph, the weight bytes each latent reads and the floor that this machine's memory bandwidth (measured
here) puts under it, peak memory; and, for long runs, the time per latent over the first and the last tenth of
the run and the memory from latent 500 (a tenth of a shorter run) on. With a checkpoint, the PyTorch reference
runs the same loop on the same weights, text, voice and noise in a child process, in the same run.
"""

from __future__ import annotations

import inspect
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..errors import VibeVoiceError
from .bundle import Bundle, cpu_session_options, shared_pool_threads

FRAME_SECONDS = 3200 / 24000
MEMORY_FROM = 500  # the latent from which a long run's memory must stay flat


def bench_kind(kind: str):
    """(the onnxruntime backend of a bundle, the bench generation, the batch class) of a TTS kind: its runtime
    module's BENCH."""
    from ..families import family, kinds_that, load

    facts = family(kind)
    if not facts.capabilities.speaks:
        raise VibeVoiceError(f"bench times TTS bundles (kinds {', '.join(kinds_that(speaks=True))}) and ASR bundles; "
                             f"this one is '{kind}'" + (" (benchmarks/asr_streaming.py times live transcription)"
                                                        if facts.streams_audio else ""))
    return load(facts.runtime.partition(":")[0] + ":BENCH")


def timed_run(chunks: Iterator[np.ndarray]) -> dict:
    """When each latent's audio was ready (seconds since the start) and the process's memory then."""
    times, memory = [], []
    start = time.perf_counter()
    for _ in chunks:
        times.append(time.perf_counter() - start)
        memory.append(resident_bytes())
    return {"wall_seconds": time.perf_counter() - start, "chunk_times": times, "resident_bytes": memory}


def resident_bytes() -> int:
    """This process's resident memory now (Linux /proc; elsewhere its peak so far)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return peak_memory_bytes()


def growth(run: dict) -> dict:
    """How a run's cost moves with the position: mean ms per latent over its first and last tenth (the
    first latent, which carries the prefill, left out) and memory from latent 500 (or a tenth) on."""
    per_latent = np.diff(run["chunk_times"])
    tenth = max(1, len(per_latent) // 10)
    memory = run["resident_bytes"]
    since = MEMORY_FROM if len(memory) >= 2 * MEMORY_FROM else len(memory) // 10
    first, last = per_latent[:tenth].mean() if len(per_latent) else 0.0, per_latent[-tenth:].mean() if len(per_latent) else 0.0
    return {"first_tenth_ms_per_latent": 1000 * float(first), "last_tenth_ms_per_latent": 1000 * float(last),
            "memory_from_latent": since, "resident_bytes_then": memory[since],
            "resident_bytes_max_after": max(memory[since:]), "memory_growth": max(memory[since:]) / memory[since] - 1}


BANDWIDTH_PROBE_MB = 512  # past every cache; its weight, the model's bytes and onnxruntime's copy: ~1.5 GB at once


def memory_bandwidth(threads: int | None, megabytes: int = BANDWIDTH_PROBE_MB, repeats: int = 10) -> float:
    """Bytes per second onnxruntime reads here with these threads: the best of `repeats` row sums over a weight
    of `megabytes` (graph optimisations off, so the sums are not folded away at load). Rows, because a sum
    down to one number runs on one thread: on 2 cores it read 15 GB/s where row sums (and an fp32 GEMV as the
    LMs run it) read 26-29."""
    import onnxruntime as ort

    rows = 256
    options = cpu_session_options(threads)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(row_sums_model(rows, megabytes * 2**20 // 4 // rows), options,
                                   providers=["CPUExecutionProvider"])
    best = min(_timed(lambda: session.run(None, {})) for _ in range(repeats))
    return megabytes * 2**20 / best


def row_sums_model(rows: int, columns: int) -> bytes:
    """An ONNX model whose one node sums each row of a float32 weight of ones [rows, columns] (an initializer)."""
    keepdims = _text(1, "keepdims") + _number(3, 0) + _number(20, 2)  # AttributeProto: INT 0
    return one_node_model("ReduceSum", [("weight", [rows, columns], FLOAT, np.ones((rows, columns), "<f4")),
                                        ("axes", [1], INT64, np.array([1], "<i8"))], ("sums", [rows], FLOAT),
                          "bandwidth", keepdims)


def matmul_model(rows: int, inner: int, columns: int, integer: bool = False) -> bytes:
    """An ONNX model whose one node multiplies two initializers [rows, inner] x [inner, columns]: float32
    (MatMul), or uint8 x int8 into int32 (MatMulInteger, onnxruntime's int8 kernels: VNNI where the cores have it)."""
    rng = np.random.default_rng(0)
    if integer:
        a = rng.integers(0, 255, (rows, inner), dtype=np.uint8)
        b = rng.integers(-127, 127, (inner, columns), dtype=np.int8)
        return one_node_model("MatMulInteger", [("a", [rows, inner], UINT8, a), ("b", [inner, columns], INT8, b)],
                              ("product", [rows, columns], INT32), "compute")
    a = rng.standard_normal((rows, inner), dtype=np.float32)
    b = rng.standard_normal((inner, columns), dtype=np.float32)
    return one_node_model("MatMul", [("a", [rows, inner], FLOAT, a), ("b", [inner, columns], FLOAT, b)],
                          ("product", [rows, columns], FLOAT), "compute")


FLOAT, UINT8, INT8, INT32, INT64 = 1, 2, 3, 6, 7  # TensorProto data types


def one_node_model(op: str, initializers: list[tuple], output: tuple, graph_name: str, attributes: bytes = b"") -> bytes:
    """An ONNX model (opset 18) of one node over `initializers` [(name, dims, data type, array)] into `output`
    (name, dims, data type), serialised here
    field by field: the torch-free install has onnxruntime but not the onnx package, and the only graphs the
    runtime builds are these measurements of the machine (bandwidth, compute)."""

    def tensor(name: str, dims: list[int], data_type: int, array: np.ndarray) -> bytes:  # TensorProto
        return (b"".join(_number(1, d) for d in dims) + _number(2, data_type) + _text(8, name)
                + _nested(9, np.ascontiguousarray(array).tobytes()))

    out_name, out_dims, out_type = output
    node = b"".join(_text(1, name) for name, *_ in initializers) + _text(2, out_name) + _text(4, op)
    node += _nested(5, attributes) if attributes else b""
    dims = b"".join(_nested(1, _number(1, d)) for d in out_dims)
    out = _text(1, out_name) + _nested(2, _nested(1, _number(1, out_type), _nested(2, dims)))  # ValueInfoProto
    graph = _nested(1, node) + _text(2, graph_name)
    graph += b"".join(_nested(5, tensor(*init)) for init in initializers) + _nested(12, out)
    return _number(1, 8) + _nested(7, graph) + _nested(8, _text(1, "") + _number(2, 18))  # ir_version 8, opset 18


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append(value & 0x7F | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _number(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _nested(field: int, *parts: bytes) -> bytes:
    data = b"".join(parts)
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _text(field: int, value: str) -> bytes:
    return _nested(field, value.encode())


def compute_peaks(threads: int | None, repeats: int = 5) -> dict[str, float]:
    """Multiply-accumulates per second onnxruntime reaches here with these threads on a product large enough to
    be compute-bound: float32 (MatMul; what MatMulNBits and the convolutions compute in) and int8
    (MatMulInteger). The best of `repeats`; a graph's compute floor is its MACs at these rates."""
    import onnxruntime as ort

    rows, inner, columns = 256, 2048, 2048
    peaks = {}
    for name, integer in (("float32", False), ("int8", True)):
        options = cpu_session_options(threads)
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(matmul_model(rows, inner, columns, integer), options,
                                       providers=["CPUExecutionProvider"])
        session.run(None, {})
        peaks[name] = rows * inner * columns / min(_timed(lambda: session.run(None, {})) for _ in range(repeats))
    return peaks


def _timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def peak_memory_bytes(children: bool = False) -> int:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF)
    return usage.ru_maxrss * 1024  # kilobytes on Linux


def run_runtime(bundle_dir: Path, frames: int, voice: str | None, threads: int | None, options: dict,
                cuda_graphs: bool = False) -> dict:
    bundle = Bundle(Path(bundle_dir), threads=threads, cuda_graphs=cuda_graphs)
    backend_class, bench_frames, _ = bench_kind(bundle.kind)
    timings = bundle.time_calls()
    backend = backend_class(bundle)
    voice = bench_voices(bundle, voice)[0]
    for values in timings.values():
        values.clear()  # session creation is not part of the run
    options = {**_defaults(bench_frames), **options}  # reported, and given to the reference as they are
    result = result_of(bundle.kind)
    run = timed_run(bench_frames(backend, bundle, voice, frames, result, **options))
    per_graph = graph_costs(timings, frames)
    # The run above is the first after loading: its first audio pays each session's one-time setup. A service
    # that stays loaded answers later requests warm; the same start, once more, says how fast that is.
    start = time.perf_counter()
    next(iter(bench_frames(backend, bundle, voice, 1, result_of(bundle.kind), **options)))
    warm_first_audio = time.perf_counter() - start
    sizes = {name: bundle.weight_bytes(name) for name in bundle.info.graphs}
    read = sum(sizes[name] * stats["calls"] for name, stats in per_graph.items()) / frames
    return {
        "bundle": str(bundle.path), "kind": bundle.kind, "precision": bundle.info.precision,
        "gates": gate_status(bundle), "voice": voice, "frames": result.frames, "options": options,
        "cuda_graphs": cuda_graphs,
        "shared_pool_threads": shared_pool_threads(), **run, "real_time_factor": run["wall_seconds"] / (result.frames * FRAME_SECONDS),
        "first_audio_seconds": run["chunk_times"][0], "warm_first_audio_seconds": warm_first_audio,
        "growth": growth(run), "graphs": per_graph,
        "weight_bytes_per_frame": read, "peak_memory_bytes": peak_memory_bytes(),
        "weight_bytes": sum(sizes.values()), "graph_weight_bytes": sizes,
        # The token-embedding table and the small tensors: memory-mapped, so only the rows a text looks up count.
        "host_tensor_bytes": (bundle.path / bundle.info.host_tensors).stat().st_size,
    }


PROFILE_FRAMES = 48  # the profiled run's latents at most: the profiler records every node call


def profiled_graphs(bundle_dir: Path, threads: int | None, peaks: dict[str, float],
                    run: Callable[[Bundle], int]) -> dict[str, dict]:
    """`run(bundle)` (a generation or transcription, returning the latents or tokens it made) once more with
    onnxruntime's profiler on every session: per graph and per unit made, its MACs and compute floor, and the
    operators and nodes that take its time (runtime.profile). The profiles are read in a temporary folder and
    removed."""
    import tempfile

    from .profile import graph_profile, node_runs

    with tempfile.TemporaryDirectory(prefix="vibevoice-profile-") as folder:
        bundle = Bundle(Path(bundle_dir), threads=threads, profile_dir=Path(folder))
        units = run(bundle)
        return {name: graph_profile(node_runs(path), units, peaks) for name, path in bundle.end_profiling().items()}


def run_profiled(bundle_dir: Path, frames: int, voice: str, threads: int | None, options: dict,
                 peaks: dict[str, float]) -> dict[str, dict]:
    """The same generation once more under the profiler (profiled_graphs), per frame."""

    def generate(bundle: Bundle) -> int:
        backend_class, bench_frames, _ = bench_kind(bundle.kind)
        result = result_of(bundle.kind)
        for _ in bench_frames(backend_class(bundle), bundle, voice, frames, result, **{**_defaults(bench_frames), **options}):
            pass
        return result.frames

    return profiled_graphs(bundle_dir, threads, peaks, generate)


def bench_voices(bundle: Bundle, voice: str | None) -> list[str]:
    """The voice asked for, else the bundle's voices (the first for one stream, in turn for several)."""
    voices = [voice] if voice else bundle.voices()
    if not voices:
        raise VibeVoiceError(f"{bundle.path}: has no voices; import one with `vibevoice-onnx voices import`")
    return voices


def graph_costs(timings: dict[str, list[float]], frames: int) -> dict:
    """Each graph's calls and milliseconds per frame of a run."""
    return {name: {"calls": len(values), "ms_per_frame": 1000 * sum(values) / frames}
            for name, values in sorted(timings.items())}


def _defaults(function) -> dict:
    """The bench generation's options as reported (keyword-only parameters pick a stream, they are no option)."""
    return {name: p.default for name, p in inspect.signature(function).parameters.items()
            if p.default not in (inspect.Parameter.empty, None) and p.kind != p.KEYWORD_ONLY}


def run_streams(bundle_dir: Path, frames: int, streams: int, voice: str | None, threads: int | None,
                options: dict) -> dict:
    """`streams` generations at once, batched (stream k: voice k of the bundle's, cycled, text k, seed 42 + k),
    and stream 0 alone before them, in this one process: throughput, each stream's real-time factor, first
    audio and the frames that missed their playback deadline, per-graph time per batched frame."""
    bundle = Bundle(Path(bundle_dir), threads=threads)
    backend_class, bench_frames, batch_class = bench_kind(bundle.kind)
    timings = bundle.time_calls()
    backend = backend_class(bundle)
    voices = bench_voices(bundle, voice)
    options = {**_defaults(bench_frames), **options}
    next(iter(bench_frames(backend, bundle, voices[0], 1, result_of(bundle.kind), **options)))  # sessions warm
    runs = {}
    for count in (1, streams):
        for values in timings.values():
            values.clear()
        batch = batch_class(backend, count) if count > 1 else None
        generations = [bench_frames(backend, bundle, voices[k % len(voices)], frames, result_of(bundle.kind), **options,
                                    stream=k, batch=batch) for k in range(count)]
        runs[count] = {**timed_streams(generations), "voices": [voices[k % len(voices)] for k in range(count)],
                       "graphs": graph_costs(timings, frames), "batches": batch_sizes(batch)}
    alone, together = runs[1], runs[streams]
    return {"bundle": str(bundle.path), "kind": bundle.kind, "precision": bundle.info.precision,
            "gates": gate_status(bundle), "frames": frames, "options": options, "streams": streams,
            "alone": alone, "together": together, "throughput_ratio": together["throughput"] / alone["throughput"],
            "steady_ratio": together["steady_throughput"] / alone["steady_throughput"],
            "peak_memory_bytes": peak_memory_bytes()}


def item_times(generations: list[Iterator]) -> list[list[float]]:
    """Read every generation in its own thread from one start: when each item was ready, per stream."""
    from ..generation.batching import read_together

    times: list[list[float]] = [[] for _ in generations]
    start = time.perf_counter()
    read_together(generations, timeout=None, on_item=lambda index: times[index].append(time.perf_counter() - start))
    return times


def timed_streams(generations: list[Iterator[np.ndarray]]) -> dict:
    """When each stream's chunks were ready; throughput in seconds of audio per second, real-time factors."""
    times = item_times(generations)
    wall = max(stream[-1] for stream in times)
    audio = sum(len(stream) for stream in times) * FRAME_SECONDS
    per_stream = [{"first_audio_seconds": stream[0], "real_time_factor": stream[-1] / (len(stream) * FRAME_SECONDS),
                   "late_frames": late_frames(stream)} for stream in times]
    return {"wall_seconds": wall, "throughput": audio / wall, "steady_throughput": steady_rate(times, FRAME_SECONDS),
            "per_stream": per_stream, "chunk_times": times}


def steady_rate(times: list[list[float]], per_item: float) -> float:
    """Output per second once every stream has begun (after the latest first item): the rate of the shared
    steps, without the prompts' prefills, which run one stream at a time before it."""
    begun = max(stream[0] for stream in times)
    items = sum(ready > begun for stream in times for ready in stream)
    return items * per_item / max(max(stream[-1] for stream in times) - begun, 1e-9)


def run_transcription_streams(bundle_dir: Path, tokens: int, streams: int, audio: list[Path],
                              threads: int | None) -> dict:
    """`streams` transcriptions at once, their greedy steps batched (stream k: recording k of `audio`, cycled,
    encoder means, exactly `tokens` greedy tokens whatever they are), and stream 0 alone before them, in this
    one process: tokens per second over the whole run and while decoding, each stream's first token."""
    from .asr import AsrBatch, OnnxAsrBackend

    if not audio:
        raise VibeVoiceError("bench of an ASR bundle transcribes recordings: give them with --audio FILE...")
    bundle = Bundle(Path(bundle_dir), threads=threads)
    timings = bundle.time_calls()
    backend = OnnxAsrBackend(bundle)
    transcription = transcriptions(bundle, audio, tokens)
    next(transcription(0, backend))  # sessions warm
    runs = {}
    for count in dict.fromkeys((1, streams)):
        for values in timings.values():
            values.clear()
        batch = AsrBatch(backend, count) if count > 1 else None
        generations = [transcription(k, backend) if batch is None else batch.frames(lambda b, k=k: transcription(k, b))
                       for k in range(count)]
        times = item_times(generations)
        wall = max(stream[-1] for stream in times)
        per_stream = [{"recording": str(audio[k % len(audio)]), "first_token_seconds": stream[0],
                       "decode_tokens_per_second": (len(stream) - 1) / max(stream[-1] - stream[0], 1e-9)}
                      for k, stream in enumerate(times)]
        runs[count] = {"wall_seconds": wall, "tokens_per_second": count * tokens / wall,
                       "decode_tokens_per_second": steady_rate(times, 1.0),
                       "per_stream": per_stream, "token_times": times, "graphs": graph_costs(timings, tokens),
                       "batches": batch_sizes(batch)}
    alone, together = runs[1], runs[streams]
    return {"bundle": str(bundle.path), "kind": bundle.kind, "precision": bundle.info.precision,
            "gates": gate_status(bundle), "tokens": tokens, "streams": streams, "alone": alone, "together": together,
            "decode_ratio": together["decode_tokens_per_second"] / alone["decode_tokens_per_second"],
            "throughput_ratio": together["tokens_per_second"] / alone["tokens_per_second"],
            "peak_memory_bytes": peak_memory_bytes()}


def transcriptions(bundle: Bundle, audio: list[Path], tokens: int):
    """transcription(k, backend): the token ids of recording k of `audio` (cycled), encoder means, exactly
    `tokens` greedy tokens whatever they are, lazily (a stream's time includes its encoders)."""
    from ..audio import db_normalize, read_audio
    from ..generation.asr import TranscriptionResult, audio_embeddings, transcribe_tokens
    from ..transcription import prompt_builder

    clips = [db_normalize(read_audio(Path(path))[0]) for path in audio]

    def transcription(k: int, loop_backend) -> Iterator[int]:
        samples = clips[k % len(clips)]
        prompt = prompt_builder(bundle.kind)(bundle.tokenizer, len(samples))
        embeddings = audio_embeddings(loop_backend, samples, None)
        yield from transcribe_tokens(loop_backend, prompt, embeddings, set(), tokens, TranscriptionResult())

    return transcription


def profile_transcription(bundle_dir: Path, report: dict, audio: list[Path], threads: int | None) -> dict:
    """`run_transcription_streams`'s one-stream run against its floors, per token: the first recording
    transcribed once more under the profiler (profiled_graphs), each graph's weights read a token at the
    measured bandwidth, its MACs at the measured rates."""
    from .asr import OnnxAsrBackend
    from .profile import floors

    tokens, peaks = report["tokens"], compute_peaks(threads)

    def transcribe(bundle: Bundle) -> int:
        for _ in transcriptions(bundle, audio, tokens)(0, OnnxAsrBackend(bundle)):
            pass
        return tokens

    profiled = profiled_graphs(bundle_dir, threads, peaks, transcribe)
    bundle = Bundle(Path(bundle_dir))
    timed = {"frames": tokens, "graphs": report["alone"]["graphs"],
             "graph_weight_bytes": {name: bundle.weight_bytes(name) for name in bundle.info.graphs}}
    return floors(timed, profiled, memory_bandwidth(threads), peaks)


def batch_sizes(batch) -> dict:
    """Per kind of batched call: the calls made, the batches they ran in, the largest batch."""
    return {kind: {"calls": sum(sizes), "batches": len(sizes), "largest": max(sizes)}
            for kind, sizes in (batch.batcher.batches.items() if batch else ())}


def late_frames(times: list[float]) -> int:
    """Frames after the first that were ready after a listener who starts at the first audio plays them."""
    return sum(ready > times[0] + k * FRAME_SECONDS for k, ready in enumerate(times) if k)


def result_of(kind: str):
    """An empty result of the kind's loop that hands its audio out without keeping it (a long run's memory is
    then the model's own)."""
    from ..families import family
    from ..generation.realtime import GenerationResult
    from ..generation.tts15b import LongFormResult

    return (LongFormResult if family(kind).capabilities.long_form else GenerationResult)(keep_audio=False)


def gate_status(bundle: Bundle) -> str:
    parity = bundle.info.parity
    return "not verified" if not parity else "passed" if parity["passed"] else "FAILED"


def run_reference(checkpoint: Path, bundle_dir: Path, voice: str, frames: int, threads: int | None, options: dict) -> dict:
    """The PyTorch reference on the same weights, text, voice and noise, in a child process (its own memory)."""
    command = [sys.executable, "-m", "vibevoice_onnx.commands.reference_timing", str(checkpoint), str(bundle_dir), voice,
               str(frames), str(threads or 0), json.dumps(options)]
    run = child_run(command, "the PyTorch reference run")
    return {**run, "growth": growth(run), "peak_memory_bytes": peak_memory_bytes(children=True)}


def child_run(command: list[str], what: str) -> dict:
    """Run `command` in a child process and return the JSON object its last line of output holds."""
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode:
        raise VibeVoiceError(f"{what} failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_other_bundle(bundle_dir: Path, frames: int, voice: str, threads: int | None, options: dict) -> dict:
    """`run_runtime` of another bundle in a child process (its own memory), for `bench --against`, its sessions
    in one shared thread pool where this process's are (the command line's), so both run the same way."""
    code = ("import json, sys; from vibevoice_onnx.runtime.bench import run_runtime; "
            "from vibevoice_onnx.runtime.bundle import share_threads; "
            "int(sys.argv[6]) and share_threads(int(sys.argv[6])); "
            "print(json.dumps(run_runtime(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]) or None, "
            "json.loads(sys.argv[5]))))")
    return child_run([sys.executable, "-c", code, str(bundle_dir), str(frames), voice, str(threads or 0),
                      json.dumps(options), str(shared_pool_threads() or 0)], f"the run of {bundle_dir}")


def bench(bundle_dir: Path, frames: int = 48, voice: str | None = None, reference: Path | None = None,
          threads: int | None = None, decode_group: int | None = None, streams: int = 1,
          audio: list[Path] | None = None, against: Path | None = None, cuda_graphs: bool = False,
          profile: bool = False) -> dict:
    """`decode_group` (realtime only): frames per decoder call after the first; None: the runtime's. With
    `streams` > 1, the report of `run_streams` (no reference). An ASR bundle: `run_transcription_streams` of
    the recordings `audio`, `frames` greedy tokens each. `against`: another bundle of the same kind (a fixed
    profile's dynamic sibling, another precision) run the same way in the same bench. `cuda_graphs`: a
    fixed-profile CUDA bundle's graphs captured once and replayed (runtime.device.StaticBinding). `profile`: each
    graph against its bandwidth and compute floors, and its costliest operators (runtime.profile)."""
    if frames < 2:
        raise VibeVoiceError(f"bench needs at least 2 frames, got {frames}")
    from .asr import ASR_KINDS

    if profile and (streams > 1 or cuda_graphs):
        raise VibeVoiceError("bench --profile profiles one stream on the CPU; run it without --streams and --cuda-graphs")
    if Bundle(Path(bundle_dir)).kind in ASR_KINDS:
        if reference is not None or decode_group is not None or against is not None or cuda_graphs:
            raise VibeVoiceError("bench of an ASR bundle takes --streams, --frames (tokens), --audio and --profile only")
        report = run_transcription_streams(bundle_dir, frames, streams, list(audio or ()), threads)
        if profile:
            report["profile"] = profile_transcription(bundle_dir, report, list(audio), threads)
        return report
    if audio:
        raise VibeVoiceError("--audio is for ASR bundles; a TTS bundle speaks its own bench text")
    options = {} if decode_group is None else {"decode_group": decode_group}
    if cuda_graphs and (streams > 1 or reference is not None or against is not None):
        raise VibeVoiceError("bench --cuda-graphs times one fixed-profile stream; run it without --streams, "
                             "--reference and --against (a second bench without --cuda-graphs compares)")
    if streams > 1:
        if reference is not None:
            raise VibeVoiceError("bench --streams compares batched streams with one alone; run --reference without it")
        report = run_streams(bundle_dir, frames, streams, voice, threads, options)
        report["bandwidth_bytes_per_second"] = memory_bandwidth(threads)
        return report
    runtime = run_runtime(bundle_dir, frames, voice, threads, options, cuda_graphs)  # first: its peak memory is its own
    bandwidth = memory_bandwidth(threads)
    report = {"runtime": runtime, "bandwidth_bytes_per_second": bandwidth}
    runtime["bandwidth_floor_ms_per_frame"] = 1000 * runtime["weight_bytes_per_frame"] / bandwidth
    if profile:
        from .profile import floors

        peaks = compute_peaks(threads)
        profiled = run_profiled(bundle_dir, min(frames, PROFILE_FRAMES), runtime["voice"], threads, options, peaks)
        report["profile"] = floors(runtime, profiled, bandwidth, peaks)
    if reference is not None:
        report["reference"] = run_reference(reference, bundle_dir, runtime["voice"], frames, threads, options)
    if against is not None:
        report["against"] = run_other_bundle(against, frames, runtime["voice"], threads, options)
    return report


def cpu_description() -> str:
    """This machine's processor and the instruction sets that decide onnxruntime's kernels here."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        import platform

        return platform.processor() or platform.machine()
    flags = next((set(line.split(":")[1].split()) for line in info if line.startswith("flags")), set())
    model = next((line.split(":")[1].strip() for line in info if line.startswith("model name")), "?")
    wanted = ["avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8"]
    return f"{model}; {' '.join(f for f in wanted if f in flags)}"


def summary(report: dict) -> dict:
    """The headline numbers of one bench report, as a bundle records them (a pushed bundle's model card shows them)."""
    if "tokens" in report:
        alone = report["alone"]
        return {"tokens per second, one transcription": round(alone["tokens_per_second"], 2),
                "peak memory": f"{report['peak_memory_bytes'] / 1e9:.2f} GB"}
    if "streams" in report:
        return {f"throughput of {report['streams']} batched streams": f"{report['throughput_ratio']:.2f}x one stream",
                "peak memory": f"{report['peak_memory_bytes'] / 1e9:.2f} GB"}
    runtime = report["runtime"]
    return {"real-time factor": round(runtime["real_time_factor"], 3),
            "first audio": f"{1000 * runtime['first_audio_seconds']:.0f} ms",
            "peak memory": f"{runtime['peak_memory_bytes'] / 1e9:.2f} GB", "latents": runtime["frames"]}


def record_bench(bundle_dir: Path, report: dict, command: str, threads: int | None) -> bool:
    """Keep the report's headline numbers in the bundle's manifest (`bench`), with the command, date and CPU;
    False where the bundle is read-only (a bundle in the Hugging Face cache is never changed)."""
    import datetime

    from .bundle import MANIFEST, write_manifest

    bundle = Bundle(Path(bundle_dir))
    if (bundle.path / MANIFEST).is_symlink() or not os.access(bundle.path, os.W_OK):
        return False
    record = {"date": datetime.date.today().isoformat(), "command": command, "cpu": cpu_description(),
              "threads": threads or len(os.sched_getaffinity(0)), "results": summary(report)}
    write_manifest(bundle.path, dict(bundle.info.to_dict(), bench=record), "recording the bench numbers")
    return True


def format_streams_report(report: dict) -> str:
    alone, together = report["alone"], report["together"]
    lines = [f"bundle        {report['bundle']} ({report['kind']} {report['precision']}, gates {report['gates']}), "
             f"{report['frames']} latents a stream; peak memory {report['peak_memory_bytes'] / 1e9:.2f} GB"]
    for label, run in (("1 stream", alone), (f"{report['streams']} streams", together)):
        streams = run["per_stream"]
        lines.append(f"{label:<13} {run['throughput']:.2f} s of audio per second ({run['steady_throughput']:.2f} once all "
                     f"have begun), {run['wall_seconds']:.1f} s; per stream: "
                     + ", ".join(f"RTF {s['real_time_factor']:.3f} first audio {1000 * s['first_audio_seconds']:.0f} ms "
                                 f"{s['late_frames']} late" for s in streams))
        lines.append("  per graph   " + ", ".join(f"{name} {g['ms_per_frame']:.1f} ms ({g['calls']} calls)"
                                                  for name, g in run["graphs"].items()))
    if together["batches"]:
        lines.append("  batches     " + ", ".join(f"{kind} {b['calls']} calls in {b['batches']} (at most {b['largest']})"
                                                  for kind, b in together["batches"].items()))
    lines.append(f"throughput    {report['throughput_ratio']:.2f}x that of one stream over the run, "
                 f"{report['steady_ratio']:.2f}x once all have begun")
    return "\n".join(lines)


def format_transcription_report(report: dict) -> str:
    lines = [f"bundle        {report['bundle']} ({report['kind']} {report['precision']}, gates {report['gates']}), "
             f"{report['tokens']} greedy tokens a stream; peak memory {report['peak_memory_bytes'] / 1e9:.2f} GB"]
    runs = [("1 stream", report["alone"])] + ([(f"{report['streams']} streams", report["together"])]
                                              if report["streams"] > 1 else [])
    for label, run in runs:
        lines.append(f"{label:<13} {run['tokens_per_second']:.2f} tokens/s over {run['wall_seconds']:.1f} s, "
                     f"{run['decode_tokens_per_second']:.2f} tokens/s once all decode; per stream: "
                     + ", ".join(f"first token {s['first_token_seconds']:.1f} s, {s['decode_tokens_per_second']:.2f} "
                                 "tokens/s" for s in run["per_stream"]))
        lines.append("  per graph   " + ", ".join(f"{name} {g['ms_per_frame']:.1f} ms/token ({g['calls']} calls)"
                                                  for name, g in run["graphs"].items()))
    if report["streams"] > 1:
        lines.append(f"throughput    {report['throughput_ratio']:.2f}x that of one stream over the run, "
                     f"{report['decode_ratio']:.2f}x once all decode")
    if "profile" in report:
        from .profile import format_floors

        lines += format_floors(report["profile"], "token")
    return "\n".join(lines)


def format_report(report: dict) -> str:
    if "tokens" in report:
        return format_transcription_report(report)
    if "streams" in report:
        return format_streams_report(report)
    runtime = report["runtime"]
    per_frame = 1000 * runtime["wall_seconds"] / runtime["frames"]
    options = "".join(f", {name.replace('_', ' ')} {value}" for name, value in runtime["options"].items())
    lines = [
        f"bundle        {runtime['bundle']} ({runtime['kind']} {runtime['precision']}, gates {runtime['gates']}), voice "
        f"{runtime['voice']}, {runtime['frames']} latents{options}, "
        f"{'one shared thread pool' if runtime['shared_pool_threads'] else 'a thread pool per session'}"
        + (", CUDA graphs replayed" if runtime.get("cuda_graphs") else ""),
        f"runtime       real-time factor {runtime['real_time_factor']:.3f}, first audio {1000 * runtime['first_audio_seconds']:.0f} ms "
        f"(warm: {1000 * runtime['warm_first_audio_seconds']:.0f} ms), "
        f"{per_frame:.1f} ms per latent, the run's peak memory {runtime['peak_memory_bytes'] / 1e9:.2f} GB "
        f"({runtime['peak_memory_bytes'] / runtime['weight_bytes']:.2f}x the {runtime['weight_bytes'] / 1e9:.2f} GB of graph weights it loads; "
        f"{runtime['peak_memory_bytes'] / (runtime['weight_bytes'] + runtime['host_tensor_bytes']):.2f}x with the "
        f"{runtime['host_tensor_bytes'] / 1e9:.2f} GB of memory-mapped host tensors)",
        f"memory        {runtime['weight_bytes_per_frame'] / 1e9:.3f} GB of weights read per latent; at the "
        f"{report['bandwidth_bytes_per_second'] / 1e9:.1f} GB/s measured after the run (a probe of {BANDWIDTH_PROBE_MB} MB "
        "whose copies take the process past the run's peak) that is a floor of "
        f"{runtime['bandwidth_floor_ms_per_frame']:.1f} ms per latent ({per_frame / runtime['bandwidth_floor_ms_per_frame']:.1f}x above it)",
        "per graph     " + ", ".join(f"{name} {s['ms_per_frame']:.1f} ms ({s['calls']} calls)" for name, s in runtime["graphs"].items()),
        "over the run  " + _growth_line(runtime),
    ]
    if "reference" in report:
        ref = report["reference"]
        lines.append(f"reference     real-time factor {ref['real_time_factor']:.3f}, first audio {1000 * ref['first_audio_seconds']:.0f} ms, "
                     f"{1000 * ref['wall_seconds'] / ref['frames']:.1f} ms per latent, peak memory {ref['peak_memory_bytes'] / 1e9:.2f} GB; "
                     f"the runtime is {ref['wall_seconds'] / runtime['wall_seconds']:.2f}x faster")
        lines.append("  over the run " + _growth_line(ref))
    if "against" in report:
        other = report["against"]
        lines.append(f"against       {other['bundle']} ({other['precision']}): real-time factor "
                     f"{other['real_time_factor']:.3f}, first audio {1000 * other['first_audio_seconds']:.0f} ms (warm: "
                     f"{1000 * other['warm_first_audio_seconds']:.0f} ms), peak memory {other['peak_memory_bytes'] / 1e9:.2f} GB; "
                     f"this bundle takes {runtime['wall_seconds'] / other['wall_seconds']:.2f}x its time")
    lines.append("graph sizes   " + ", ".join(f"{name} {size / 1e6:.1f} MB"
                                              for name, size in runtime["graph_weight_bytes"].items()))
    if "profile" in report:
        from .profile import format_floors

        lines += format_floors(report["profile"])
    return "\n".join(lines)


GROWTH_FRAMES = 100  # a tenth of fewer latents is a few decoder groups: too coarse to read a trend from


def _growth_line(run: dict) -> str:
    if run["frames"] < GROWTH_FRAMES:
        return f"(with --frames {GROWTH_FRAMES} or more: the cost per latent over the first and last tenth, and memory)"
    growth = run["growth"]
    first, last = growth["first_tenth_ms_per_latent"], growth["last_tenth_ms_per_latent"]
    return (f"{first:.1f} ms per latent over the first tenth, {last:.1f} over the last ({last / first:.2f}x); memory "
            f"{growth['resident_bytes_then'] / 1e9:.2f} GB at latent {growth['memory_from_latent'] + 1}, at most "
            f"{growth['resident_bytes_max_after'] / 1e9:.2f} GB after ({100 * growth['memory_growth']:+.1f}%)")


def _plot_floors(axis, profile: dict) -> None:
    """Each graph's milliseconds a latent beside its floor (bench --profile), slowest on top."""
    graphs = sorted(profile["graphs"].items(), key=lambda item: item[1]["ms_per_frame"])
    rows = np.arange(len(graphs))
    axis.barh(rows + 0.2, [g["ms_per_frame"] for _, g in graphs], height=0.4, label="measured")
    axis.barh(rows - 0.2, [g["floor_ms_per_frame"] for _, g in graphs], height=0.4,
              label="floor (weights at the bandwidth, or MACs at the peak rate)")
    axis.set_yticks(rows, [f"{name} ({g['bound_by']})" for name, g in graphs])
    axis.set_xlabel("ms per latent")
    axis.legend()


def plot(report: dict, path: Path) -> None:
    """When each latent's audio was ready, against the deadline a listener sets from the first audio on; and
    the time each latent took, against its position in the run."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise VibeVoiceError("--plot needs matplotlib (pip install matplotlib)") from None
    profiled = "profile" in report
    figure, axes = plt.subplots(3 if profiled else 2, 1, figsize=(8, 12 if profiled else 8))
    ready, cost = axes[:2]
    if "streams" in report:  # each batched stream against its own deadline
        runs = [(f"stream {k}", times) for k, times in enumerate(report["together"]["chunk_times"])]
    else:
        runs = [("runtime", report["runtime"]["chunk_times"])]
        runs += [("PyTorch reference", report["reference"]["chunk_times"])] if "reference" in report else []
    for label, chunk_times in runs:
        if chunk_times:
            times = np.asarray(chunk_times)
            frames = np.arange(1, len(times) + 1)
            ready.plot(frames, times, marker=".", label=f"{label}: audio ready")
            ready.plot(frames, times[0] + (frames - 1) * FRAME_SECONDS, linestyle="--", linewidth=1,
                       label=f"{label}: playback deadline")
            per_latent = 1000 * np.diff(times)
            # a moving mean over two speech windows at least: decoder groups make single latents jumpy
            window = max(1, min(len(per_latent), max(12, len(per_latent) // 50)))
            smooth = np.convolve(per_latent, np.ones(window) / window, mode="valid")
            cost.plot(np.arange(2, 2 + len(smooth)) + (window - 1) / 2, smooth, label=label)
    ready.set_xlabel("latent (133 ms of audio each)")
    ready.set_ylabel("seconds since the request")
    ready.set_title(f"{Path(report.get('bundle') or report['runtime']['bundle']).name}: per-latent latency")
    ready.legend()
    cost.set_xlabel("latent")
    cost.set_ylabel("ms per latent (moving mean)")
    cost.set_ylim(bottom=0)
    cost.legend()
    if profiled:
        _plot_floors(axes[2], report["profile"])
    figure.tight_layout()
    try:
        figure.savefig(path)
    except OSError as e:
        raise VibeVoiceError(f"{path}: cannot write the plot ({e.strerror or e})") from None
    finally:
        plt.close(figure)
