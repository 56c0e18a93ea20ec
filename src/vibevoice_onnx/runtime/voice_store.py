"""`vibevoice-onnx voices`: import upstream presets into a bundle, list a bundle's voices (torch-free)."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

from ..errors import VibeVoiceError
from ..voices import check_voice_fits, load_voice, read_upstream_preset, save_voice
from .bundle import VOICES, Bundle, voice_path

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def import_voice(bundle_dir: Path, preset: Path, name: str | None = None, force: bool = False) -> tuple[str, dict]:
    bundle = Bundle(bundle_dir)
    bundle.require_kind("realtime")
    preset = Path(preset)
    if not preset.is_file():
        raise VibeVoiceError(f"{preset}: no such preset file")
    name = name or preset.stem
    if not _NAME.match(name):
        raise VibeVoiceError(f"'{name}' is not a usable voice name (letters, digits, '.', '_', '-'; at most 64)")
    target = voice_path(bundle.path, name)
    if target.exists() and not force:
        raise VibeVoiceError(f"{bundle.path}: already has a voice '{name}' (choose another --name, or --force)")
    prompt = read_upstream_preset(preset)
    check_voice_fits(prompt, bundle.expected_voice_shapes(), str(preset))
    target.parent.mkdir(exist_ok=True)
    # Write beside the target, then rename: a failure leaves nothing behind.
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=target.parent)
    os.close(fd)
    try:
        save_voice(prompt, Path(tmp), {"source": preset.name, "sha256": hashlib.sha256(preset.read_bytes()).hexdigest()})
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return name, prompt.shape_summary()


def list_voices(bundle_dir: Path) -> list[dict]:
    bundle = Bundle(bundle_dir)
    out = []
    for name in bundle.voices():
        summary = load_voice(voice_path(bundle.path, name)).shape_summary()
        out.append({"name": name, **{k: v for k, v in summary.items() if k.endswith("_length")}})
    return out


__all__ = ["import_voice", "list_voices", "VOICES"]
