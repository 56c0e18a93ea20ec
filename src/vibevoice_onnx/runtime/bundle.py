"""An ONNX bundle on disk: its manifest, its onnxruntime sessions, host tensors, tokenizer and voices."""

from __future__ import annotations

import json
import re
from functools import cached_property
from pathlib import Path

import numpy as np

from ..checkpoints.configs import ModelDims, model_dims
from ..errors import BundleError, VibeVoiceError
from ..voices import VoicePrompt, load_voice

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
HOST_TENSORS = "host.safetensors"
VOICES = "voices"
_VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def voice_path(bundle_dir: Path, name: str) -> Path:
    """Where voice NAME lives; names are plain (no separators), so a path never leaves voices/."""
    if not _VOICE_NAME.fullmatch(name):
        raise VibeVoiceError(f"'{name}' is not a usable voice name (letters, digits, '.', '_', '-'; at most 64)")
    return Path(bundle_dir) / VOICES / f"{name}.safetensors"


class Bundle:
    """Opens a bundle directory. Sessions are created on first use, with the given providers/options."""

    def __init__(self, path: Path, providers: list | None = None, session_options=None, threads: int | None = None):
        self.path = Path(path)
        manifest_path = self.path / MANIFEST
        if not manifest_path.is_file():
            raise BundleError(f"{self.path}: no {MANIFEST}, so this is not a complete vibevoice-onnx bundle")
        try:
            self.manifest = json.loads(manifest_path.read_text())
        except json.JSONDecodeError as e:
            raise BundleError(f"{manifest_path}: not valid JSON ({e})") from None
        version = self.manifest.get("format_version")
        if version != FORMAT_VERSION:
            raise BundleError(f"{manifest_path}: bundle format {version} is not supported (expected {FORMAT_VERSION})")
        for name, graph in self.manifest["graphs"].items():
            for file in (graph["file"], graph.get("external_data")):
                if file and not (self.path / file).is_file():
                    raise BundleError(f"{self.path / file}: graph file of '{name}' is missing")
        self.providers = providers or ["CPUExecutionProvider"]
        self.session_options = session_options
        self.threads = threads
        self._sessions: dict = {}

    @property
    def kind(self) -> str:
        return self.manifest["model_kind"]

    @cached_property
    def dims(self) -> ModelDims:
        return model_dims(self.manifest["config"], str(self.path / MANIFEST))

    def require_kind(self, kind: str) -> None:
        if self.kind != kind:
            raise BundleError(f"{self.path}: is a bundle of kind '{self.kind}'; this needs kind '{kind}'")

    def session(self, name: str):
        if name not in self._sessions:
            import onnxruntime as ort

            if name not in self.manifest["graphs"]:
                raise BundleError(f"{self.path}: the bundle has no '{name}' graph")
            options = self.session_options or ort.SessionOptions()
            if self.session_options is None:
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                if self.threads:
                    options.intra_op_num_threads = self.threads
                # The loop runs seven sessions in turn: threads that spin after one session's call steal the
                # cores from the next (measured: 35% slower generation on 2 cores with spinning on).
                options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            path = self.path / self.manifest["graphs"][name]["file"]
            self._sessions[name] = ort.InferenceSession(str(path), options, providers=self.providers)
        return self._sessions[name]

    def graph(self, name: str) -> dict:
        return self.manifest["graphs"][name]

    @cached_property
    def host(self) -> dict[str, np.ndarray]:
        from safetensors.numpy import load_file

        return load_file(str(self.path / HOST_TENSORS))

    @cached_property
    def tokenizer(self):
        from ..text import load_tokenizer

        return load_tokenizer(self.path / self.manifest["tokenizer"]["file"])

    # -- voices -----------------------------------------------------------------------------------------
    def voices(self) -> list[str]:
        folder = self.path / VOICES
        return sorted(p.name[: -len(".safetensors")] for p in folder.glob("*.safetensors")) if folder.is_dir() else []

    def voice(self, name: str) -> VoicePrompt:
        path = voice_path(self.path, name)
        if not path.is_file():
            available = ", ".join(self.voices()) or "none; import one with `vibevoice-onnx voices import`"
            raise VibeVoiceError(f"{self.path}: has no voice '{name}' (available: {available})")
        return load_voice(path)

    def expected_voice_shapes(self) -> dict:
        lm, tts = self.dims.lm, self.dims.tts_lm
        return {"hidden": lm.hidden, "kv_heads": lm.kv_heads, "head_dim": lm.head_dim,
                "lm_layers": lm.layers, "tts_lm_layers": tts.layers}
