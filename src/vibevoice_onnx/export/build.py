"""`vibevoice-onnx build`: a checkpoint becomes an ONNX bundle directory, atomically.

Everything is written into a temporary directory next to the destination and renamed into place at the
end, so an interrupted or failed build never leaves a bundle that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path

import onnx
from safetensors.numpy import save_file

from ..checkpoints.configs import model_dims
from ..checkpoints.files import open_checkpoint
from ..errors import VibeVoiceError
from ..outputs import atomic_directory
from ..runtime.bundle import FORMAT_VERSION, HOST_TENSORS, MANIFEST
from .graphs import OPSET, export_graph

PRECISIONS = ("fp32",)
DEVICES = ("cpu",)
_ONNX_TYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.INT64: "int64", onnx.TensorProto.FLOAT16: "float16"}


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


def checkpoint_hash(root: Path, files) -> str:
    digest = hashlib.sha256()
    for name in ("config.json", *files.shards):
        with open(root / name, "rb") as f:
            while block := f.read(16 * 2**20):
                digest.update(block)
    return "sha256:" + digest.hexdigest()


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


def tool_versions() -> dict:
    versions = {}
    for package in ("vibevoice-onnx", "torch", "transformers", "onnx", "onnxscript", "onnxruntime", "numpy"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def carry_over_voices(old_bundle: Path, new_bundle: Path) -> None:
    """A rebuild keeps the voices imported into the bundle it replaces, when they still fit the model."""
    from ..runtime.bundle import Bundle

    if not (old_bundle / "voices").is_dir():
        return
    bundle = Bundle(new_bundle)
    for voice in sorted((old_bundle / "voices").glob("*.safetensors")):
        try:
            bundle.check_voice_file(voice)
        except VibeVoiceError as e:
            log(f"  not keeping voice {voice.stem}: {e}")
            continue
        shutil.copyfile(voice, new_bundle / "voices" / voice.name)
        log(f"  kept voice {voice.stem} from the previous bundle")


def _exporter(kind: str):
    """The module that knows a kind's graphs: load_model(checkpoint), graph_specs(model), host_tensors(...)."""
    from . import realtime, tts15b

    exporters = {"realtime": realtime, "1.5b": tts15b}
    if kind not in exporters:
        raise VibeVoiceError(f"building {kind} checkpoints is not supported yet (supported: {', '.join(exporters)})")
    return exporters[kind]


def build_bundle(checkpoint: Path, out_root: Path = Path("onnx"), precision: str = "fp32", device: str = "cpu",
                 tokenizer: Path | None = None) -> Path:
    if precision not in PRECISIONS:
        raise VibeVoiceError(f"precision '{precision}' is not supported yet (available: {', '.join(PRECISIONS)})")
    if device not in DEVICES:
        raise VibeVoiceError(f"device '{device}' is not supported yet (available: {', '.join(DEVICES)})")
    checkpoint = Path(checkpoint)
    files = open_checkpoint(checkpoint)
    dims = model_dims(files.config, str(checkpoint / "config.json"))
    exporter = _exporter(dims.kind)
    tokenizer_path = resolve_tokenizer(checkpoint, tokenizer)

    final = Path(out_root) / dims.kind / f"{device}_{precision}"
    started = time.perf_counter()
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    model = exporter.load_model(checkpoint)  # strict: refuses a checkpoint that does not match before any output
    with atomic_directory(final, log, keep=carry_over_voices) as tmp:
        graphs = {}
        for spec in exporter.graph_specs(model):
            graphs[spec.name] = graph_entry(export_graph(spec, tmp, log), spec.extra)
        save_file(exporter.host_tensors(files, model), str(tmp / HOST_TENSORS))
        shutil.copyfile(tokenizer_path, tmp / "tokenizer.json")
        (tmp / "voices").mkdir()
        log("  hashing the source checkpoint")
        manifest = {
            "format_version": FORMAT_VERSION,
            "model_kind": dims.kind,
            "precision": precision,
            "device": device,
            "opset": OPSET,
            "source": {"path": str(checkpoint.resolve()), "hash": checkpoint_hash(checkpoint, files)},
            "config": files.config,
            "tokenizer": {"file": "tokenizer.json", "from": str(tokenizer_path.resolve())},
            "host_tensors": HOST_TENSORS,
            "graphs": graphs,
            "tools": tool_versions(),
            "build_seconds": round(time.perf_counter() - started, 1),
            "parity": None,  # filled by `vibevoice-onnx verify`
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"built {final} in {time.perf_counter() - started:.1f} s")
    return final
