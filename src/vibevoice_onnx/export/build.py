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
from safetensors import safe_open
from safetensors.numpy import save_file

from ..checkpoints.configs import model_dims
from ..checkpoints.files import open_checkpoint
from ..errors import VibeVoiceError
from ..outputs import atomic_directory
from ..runtime.bundle import FORMAT_VERSION, HOST_TENSORS, MANIFEST
from .graphs import OPSET, export_graph, realtime_graph_specs

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


def write_host_tensors(files, out: Path, model) -> None:
    """Tensors the host uses directly: the text embedding (in its stored dtype), type rows, scale and bias."""
    stored = files.tensors["model.language_model.embed_tokens.weight"]
    with safe_open(str(files.root / stored.file), framework="numpy") as f:
        embed = f.get_tensor(stored.name)
    save_file(
        {
            "embed_tokens": embed,
            "tts_input_types": model.tts_input_types.weight.detach().numpy(),
            "speech_scaling_factor": model.speech_scaling_factor.numpy(),
            "speech_bias_factor": model.speech_bias_factor.numpy(),
        },
        str(out / HOST_TENSORS),
    )


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
    from ..runtime.bundle import Bundle, voice_path
    from ..voices import check_voice_fits, load_voice

    if not (old_bundle / "voices").is_dir():
        return
    expected = Bundle(new_bundle).expected_voice_shapes()
    for voice in sorted((old_bundle / "voices").glob("*.safetensors")):
        try:
            check_voice_fits(load_voice(voice), expected, str(voice))
        except VibeVoiceError as e:
            log(f"  not keeping voice {voice.stem}: {e}")
            continue
        shutil.copyfile(voice, voice_path(new_bundle, voice.stem))
        log(f"  kept voice {voice.stem} from the previous bundle")


def build_bundle(checkpoint: Path, out_root: Path = Path("onnx"), precision: str = "fp32", device: str = "cpu",
                 tokenizer: Path | None = None) -> Path:
    if precision not in PRECISIONS:
        raise VibeVoiceError(f"precision '{precision}' is not supported yet (available: {', '.join(PRECISIONS)})")
    if device not in DEVICES:
        raise VibeVoiceError(f"device '{device}' is not supported yet (available: {', '.join(DEVICES)})")
    checkpoint = Path(checkpoint)
    files = open_checkpoint(checkpoint)
    dims = model_dims(files.config, str(checkpoint / "config.json"))
    if dims.kind != "realtime":
        raise VibeVoiceError(f"{checkpoint}: building {dims.kind} checkpoints is not supported yet (realtime only)")
    tokenizer_path = resolve_tokenizer(checkpoint, tokenizer)

    final = Path(out_root) / dims.kind / f"{device}_{precision}"
    started = time.perf_counter()
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    from ..reference.loading import load_realtime

    model = load_realtime(checkpoint)  # strict: refuses a checkpoint that does not match before any output
    with atomic_directory(final, log, keep=carry_over_voices) as tmp:
        graphs = {}
        for spec in realtime_graph_specs(model):
            graphs[spec.name] = graph_entry(export_graph(spec, tmp, log), spec.extra)
        write_host_tensors(files, tmp, model)
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
