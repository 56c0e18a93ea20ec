"""`vibevoice-onnx build`: a checkpoint becomes an ONNX bundle directory, atomically.

Everything is written into a temporary directory next to the destination and renamed into place at the
end, so an interrupted or failed build (a full disk included) never leaves a bundle that looks complete, and
the bundle it would have replaced stays as it was.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path

import onnx
from safetensors.numpy import save_file

from ..checkpoints.checkpoint import Checkpoint
from ..errors import VibeVoiceError
from ..families import PRECISIONS, family, load, stage
from ..outputs import atomic_directory
from ..runtime.bundle import FORMAT_VERSION, HOST_TENSORS, MANIFEST, record_files, write_manifest
from ..runtime.manifest import Manifest
from ..writer.graph import OPSET
from .makers import TRACED, WRITTEN, torch_installed

_ONNX_TYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT32: "int32",
               onnx.TensorProto.FLOAT16: "float16"}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def resolve_tokenizer(checkpoint: Path, tokenizer: Path | None) -> Path:
    if (checkpoint / "tokenizer.json").is_file():
        return checkpoint / "tokenizer.json"
    if tokenizer is not None:
        candidate = Path(tokenizer)
        if candidate.is_dir():
            candidate = candidate / "tokenizer.json"
        if candidate.is_file():
            return candidate
        raise VibeVoiceError(f"{tokenizer}: no tokenizer.json there (give a Qwen2.5 tokenizer.json file or its directory)")
    raise VibeVoiceError(
        f"{checkpoint}: the checkpoint has no tokenizer.json (upstream ships none); pass --tokenizer with a "
        "Qwen2.5 tokenizer.json file or a directory holding one (Qwen/Qwen2.5-0.5B for the realtime model)"
    )


def _value_info(values) -> list[dict]:
    out = []
    for v in values:
        t = v.type.tensor_type
        shape = [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim]
        out.append({"name": v.name, "shape": shape, "dtype": _ONNX_TYPES.get(t.elem_type, str(t.elem_type))})
    return out


def graph_entry(path: Path, extra: dict) -> dict:
    model = onnx.load(str(path), load_external_data=False)
    data = path.with_name(path.name + ".data")
    return {
        "file": path.name,
        "external_data": data.name if data.exists() else None,
        "inputs": _value_info(model.graph.input),
        "outputs": _value_info(model.graph.output),
        **extra,
    }


def tool_versions(graphs: str = TRACED) -> dict:
    versions = {}
    for package in ("vibevoice-onnx", "torch", "transformers", "onnx", "onnxscript", "onnxruntime", "numpy"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {**versions, "graphs": graphs}


def graph_maker(kind: str, profile, write: bool | None) -> str:
    """TRACED or WRITTEN: `write` True asks for the writer, False for tracing, None picks the writer where torch
    is not installed (the base install) and tracing where it is (today's proven path)."""
    writes = family(kind).writer is not None and profile is None
    if write is None:
        write = writes and not torch_installed()
    if write and not writes:
        why = "the fixed-shape profile" if profile is not None and family(kind).writer else f"{kind} checkpoints"
        raise VibeVoiceError(f"graphs written without PyTorch are not available for {why} yet; build it with "
                             "PyTorch installed (pip install 'vibevoice-onnx[export]')")
    if not write and not torch_installed():
        raise VibeVoiceError(f"building {kind} bundles needs PyTorch here (pip install 'vibevoice-onnx[export]')"
                             + ("" if writes else f": {kind} graphs are not written without it yet"))
    return WRITTEN if write else TRACED


def carry_over_voices(old_bundle: Path, new_bundle: Path, whence: str = "the previous bundle") -> None:
    """A rebuild keeps the voices imported into the bundle it replaces (and a quantized build those of its fp32
    sibling: a voice fits every precision of its model), when they still fit the model."""
    from ..runtime.bundle import Bundle

    if not (old_bundle / "voices").is_dir():
        return
    bundle, kept = Bundle(new_bundle, providers=["CPUExecutionProvider"]), []  # read, never run: any device's
    for voice in sorted((old_bundle / "voices").glob("*.safetensors")):
        try:
            bundle.check_voice_file(voice)
        except VibeVoiceError as e:
            log(f"  not keeping voice {voice.stem}: {e}")
            continue
        shutil.copyfile(voice, new_bundle / "voices" / voice.name)
        kept.append(f"voices/{voice.name}")
        log(f"  kept voice {voice.stem} from {whence}")
    if kept:
        write_manifest(new_bundle, record_files(new_bundle, bundle.info.to_dict(), kept))


def _exporter(kind: str):
    """The module that knows a kind's graphs: load_model(checkpoint), graph_specs(model), host_tensors(...)."""
    return stage(kind, "exporter", f"building {kind} checkpoints")


VARIANTS = {"cpu": ("fp32", "int8", "int4", "int4-mixed", "int8-decoder"), "cuda": ("fp32", "fp16")}


def check_variant(device: str, precision: str) -> None:
    if device not in VARIANTS:
        raise VibeVoiceError(f"device '{device}' is not supported (available: {', '.join(VARIANTS)})")
    if precision not in PRECISIONS:
        raise VibeVoiceError(f"precision '{precision}' is not supported (available: {', '.join(PRECISIONS)})")
    if precision not in VARIANTS[device]:
        other = next(d for d, precisions in VARIANTS.items() if precision in precisions)
        why = "fp16 is never faster than fp32 on onnxruntime's CPU provider (measured); " if precision == "fp16" else ""
        raise VibeVoiceError(f"{device}_{precision} bundles are not built: {why}build it with --device {other}")


def fp32_sibling(kind_root: Path, source_hash: str, profile=None, traced_alike: bool = False) -> Path | None:
    """A complete fp32 bundle of the same checkpoint and profile beside the target (its voices fit the target).
    `traced_alike`: and traced by the same tools, so its graphs are what a fresh export would give and quantized
    variants start from them instead of exporting again (a written build quantizes as it writes, from none)."""
    compared, wanted = ("torch", "transformers", "onnx", "onnxscript"), tool_versions()
    for candidate in sorted(Path(kind_root).glob(f"*_fp32{profile.suffix if profile else ''}")):
        try:
            manifest = Manifest.read(candidate)
        except VibeVoiceError:
            continue
        same_tools = not traced_alike or manifest.tools.get("graphs", TRACED) == TRACED and \
            {k: manifest.tools.get(k) for k in compared} == {k: wanted[k] for k in compared}
        recorded_profile = manifest.profile or {}
        same_profile = recorded_profile.get("name") is None if profile is None else \
            {k: recorded_profile.get(k) for k in profile.manifest()} == profile.manifest()
        if manifest.source_hash == source_hash and manifest.precision == "fp32" and same_tools and same_profile:
            return candidate
    return None


def _copy_graph(source: Path, graph: dict, tmp: Path) -> dict:
    for name in (graph["file"], graph.get("external_data")):
        if name:
            shutil.copyfile(source / name, tmp / name)
    return graph


def export_graph(spec, out_dir: Path, log, fuse: bool = True) -> Path:
    """A graph traced by torch.onnx (export/graphs.py, imported when a traced build asks for it)."""
    from .graphs import export_graph as traced

    return traced(spec, out_dir, log, fuse=fuse)


def _written_graphs(kind: str, checkpoint: Checkpoint, tmp: Path, schemes: dict) -> dict:
    """Every graph of the kind written from the checkpoint without torch (writer/), quantized tensor by tensor
    as `schemes` says, and its host tensors."""
    from ..checkpoints.inspect import check_layout

    check_layout(checkpoint)  # strict, as the traced path's loading: refuses a checkpoint that does not match
    writer = load(family(kind).writer)
    kept = {"precision": {"scheme": "fp32"}} if schemes else {}  # a quantized bundle's graphs that stay fp32 say so
    graphs = {name: graph_entry(path, {**kept, **extra})
              for name, (path, extra) in writer.graphs(checkpoint, tmp, log, schemes).items()}
    save_file(writer.host_tensors(checkpoint), str(tmp / HOST_TENSORS))
    return graphs


def _fresh_graphs(exporter, model, files, tmp: Path, schemes: dict, sibling: Path | None) -> dict:
    """Every graph of the kind; those whose weights stay in the shards are streamed (and quantized as their
    scheme says) instead of exported from memory. The others, with an fp32 `sibling` bundle of the same
    checkpoint, are copied from it with its host tensors (they stay fp32 in every precision)."""
    from .streaming import export_streamed

    kept = Manifest.read(sibling).graphs if sibling else {}
    graphs = {}
    for spec in exporter.graph_specs(model):
        deferred = exporter.streamed_weights(spec, model) if hasattr(exporter, "streamed_weights") else {}
        if deferred:
            path, details = export_streamed(spec, tmp, deferred, schemes.get(spec.name), log)
            graphs[spec.name] = {**graph_entry(path, spec.extra), **({"precision": details} if details else {})}
        elif spec.name in kept:
            graphs[spec.name] = _copy_graph(sibling, kept[spec.name], tmp)
            log(f"  kept {spec.name} of {sibling}")
        else:
            path = export_graph(spec, tmp, log, fuse=getattr(exporter, "fuse_ops", True))
            packed = exporter.pack(spec.name, path, log) if hasattr(exporter, "pack") else None
            graphs[spec.name] = {**graph_entry(path, spec.extra), **({"precision": packed} if packed else {})}
    if sibling:
        shutil.copyfile(sibling / HOST_TENSORS, tmp / HOST_TENSORS)
    else:
        save_file(exporter.host_tensors(files, model), str(tmp / HOST_TENSORS))
    return graphs


def _copied_graphs(source: Path, tmp: Path) -> dict:
    """The fp32 sibling's graphs and host tensors."""
    manifest = Manifest.read(source)
    for graph in manifest.graphs.values():
        _copy_graph(source, graph, tmp)
    shutil.copyfile(source / manifest.host_tensors, tmp / HOST_TENSORS)
    return manifest.graphs


def _convert_precision(kind: str, profile, precision: str, graphs: dict, tmp: Path) -> None:
    """Quantize (int8, int4) or halve (fp16) the graphs in place, as the kind's (and profile's) policy says; each
    graph's manifest entry records what it became."""
    from .precision import convert_fp16, policy, quantize_graph

    schemes = policy(kind, precision, profile)
    for name, graph in graphs.items():
        path = tmp / graph["file"]
        external = graph.get("external_data") is not None
        if graph.get("precision", {}).get("streamed"):
            continue  # quantized as its weights streamed in
        if precision == "fp16":
            details = convert_fp16(path, external)
        elif name in schemes:
            details = quantize_graph(path, schemes[name], external)
        else:
            graph.setdefault("precision", {"scheme": "fp32"})  # or what its export made it (BitNet's ternary LM)
            continue
        log(f"  {name}: {details['scheme']}, {details['weight_bytes_before'] / 1e6:.1f} -> "
            f"{details['weight_bytes_after'] / 1e6:.1f} MB")
        extra = {k: v for k, v in graph.items() if k not in ("file", "external_data", "inputs", "outputs", "precision")}
        graphs[name] = {**graph_entry(path, extra), "precision": details}


def _preprocessor(checkpoint: Path, kind: str) -> dict:
    """The checkpoint's preprocessor_config.json, where it ships one (ASR-Streaming's window geometry is read from
    it, never assumed), checked as the runtime will read it."""
    from ..checkpoints.configs import PREPROCESSOR_CONFIG, streaming_geometry

    path = checkpoint / PREPROCESSOR_CONFIG
    preprocessor = json.loads(path.read_text()) if path.is_file() else None
    if family(kind).streams_audio:
        streaming_geometry(preprocessor, str(path))
    return {"preprocessor": preprocessor} if preprocessor is not None else {}


def build_cost(kind: str, precision: str, parameters: int, graphs: str = TRACED) -> tuple[float, float]:
    """(minutes, peak GB) of a first build (and, traced, verify) of a checkpoint of `parameters`, scaled from the
    full-size first use measured on 2 cores by the kind's exporter or writer (its BUILD_COST: seconds and peak GB
    per billion parameters, by precision; a precision it did not measure takes its fp32 cost)."""
    cost = (load(family(kind).writer) if graphs == WRITTEN else _exporter(kind)).BUILD_COST
    seconds_per_billion, gb_per_billion = cost.get(precision, cost["fp32"])
    billions = parameters / 1e9
    return seconds_per_billion * billions / 60, max(1.0, gb_per_billion * billions)


def build_bundle(source: Checkpoint | Path, out_root: Path = Path("onnx"), precision: str = "fp32", device: str = "cpu",
                 tokenizer: Path | None = None, profile=None, origin: dict | None = None, write: bool | None = None) -> Path:
    """`profile`: None for the default (dynamic shapes), or export.fixed.FixedProfile. `origin`: what else the
    manifest records of where the checkpoint came from (a Hub repository, its commit, the tokenizer's). `write`:
    the graphs written without torch (True), traced (False), or the writer only where torch is missing (None)."""
    check_variant(device, precision)
    checkpoint = Checkpoint.open(source)
    files, dims = checkpoint.files, checkpoint.dims
    if profile is not None:
        profile.check_kind(dims.kind)
    made_by = graph_maker(dims.kind, profile, write)
    if made_by == WRITTEN:
        exporter = None
    else:
        exporter = _exporter(dims.kind) if profile is None else profile.exporter()
    tokenizer_path = resolve_tokenizer(checkpoint.root, tokenizer)
    preprocessor = _preprocessor(checkpoint.root, dims.kind)
    from .precision import policy

    schemes = policy(dims.kind, precision, profile)  # refuses a kind without one before any work

    final = Path(out_root) / dims.kind / f"{device}_{precision}{profile.suffix if profile else ''}"
    started = time.perf_counter()
    log("  hashing the source checkpoint")
    source_hash = checkpoint.hash
    # A kind that streams its large weights quantizes them as they stream, never from a whole fp32 graph: from
    # an fp32 sibling it takes only the graphs that stay fp32. Written graphs are quantized as they are written.
    reuses = precision != "fp32" and made_by == TRACED
    source = fp32_sibling(final.parent, source_hash, profile, traced_alike=True) if reuses else None
    voices_from = source or (fp32_sibling(final.parent, source_hash, profile) if precision != "fp32" else None)
    fresh = source is None or hasattr(exporter, "streamed_weights")
    if fresh and exporter is not None:
        logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
        model = exporter.load_model(checkpoint)  # strict: refuses a checkpoint that does not match before any output
    if source is not None:
        log(f"  starting from the fp32 graphs of {source} (same checkpoint, same tools)")
    with atomic_directory(final, log, keep=carry_over_voices, action="writing the bundle") as tmp:
        if not fresh:
            graphs = _copied_graphs(source, tmp)
        elif exporter is None:
            graphs = _written_graphs(dims.kind, checkpoint, tmp, {} if precision == "fp16" else schemes)
        else:
            graphs = _fresh_graphs(exporter, model, files, tmp, schemes, source)
        if precision != "fp32" and (exporter is not None or precision == "fp16"):
            _convert_precision(dims.kind, profile, precision, graphs, tmp)
        profile_record = profile.finish(tmp, graphs, log) if profile is not None else None
        shutil.copyfile(tokenizer_path, tmp / "tokenizer.json")
        (tmp / "voices").mkdir(exist_ok=True)
        manifest = {
            "format_version": FORMAT_VERSION,
            "model_kind": dims.kind,
            "precision": precision,
            "device": device,
            "opset": OPSET,
            "source": {"path": str(checkpoint.root.resolve()), "hash": source_hash, **(origin or {})},
            "config": files.config,
            **preprocessor,
            "tokenizer": {"file": "tokenizer.json", "from": str(tokenizer_path.resolve())},
            "host_tensors": HOST_TENSORS,
            "graphs": graphs,
            "tools": tool_versions(made_by),
            "build_seconds": round(time.perf_counter() - started, 1),
            "parity": None,  # filled by `vibevoice-onnx verify`
            **({"profile": profile_record} if profile_record else {}),
        }
        (tmp / MANIFEST).write_text(json.dumps(record_files(tmp, manifest), indent=2) + "\n")
        if voices_from is not None:
            carry_over_voices(voices_from, tmp, f"the fp32 bundle beside it ({voices_from.name})")
    log(f"built {final} in {time.perf_counter() - started:.1f} s")
    return final
