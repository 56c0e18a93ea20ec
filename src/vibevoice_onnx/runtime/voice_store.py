"""`vibevoice-onnx voices`: import upstream presets into a bundle, list a bundle's voices (torch-free)."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from ..errors import VibeVoiceError
from ..outputs import atomic_file, os_error_message, remove_stale_partials
from ..voices import check_voice_fits, load_voice, read_upstream_preset, save_voice
from .bundle import Bundle, voice_path


def import_voice(bundle_dir: Path, preset: Path, name: str | None = None, force: bool = False) -> tuple[str, dict]:
    bundle = Bundle(bundle_dir)
    bundle.require_kind("realtime")
    preset = Path(preset)
    if not preset.is_file():
        raise VibeVoiceError(f"{preset}: no such preset file")
    name = name or preset.stem
    target = voice_path(bundle.path, name)
    if target.exists() and not force:
        raise VibeVoiceError(f"{bundle.path}: already has a voice '{name}' (choose another --name, or --force)")
    prompt = read_upstream_preset(preset)
    check_voice_fits(prompt, bundle.expected_voice_shapes(), str(preset))
    try:
        target.parent.mkdir(exist_ok=True)
    except OSError as e:
        raise VibeVoiceError(os_error_message(e, "creating the voices folder")) from None
    remove_stale_partials(target.parent, log=lambda m: print(m, file=sys.stderr))
    with atomic_file(target, "writing the voice") as partial:
        save_voice(prompt, partial, {"source": preset.name, "sha256": hashlib.sha256(preset.read_bytes()).hexdigest()})
    return name, prompt.shape_summary()


def list_voices(bundle_dir: Path) -> list[dict]:
    bundle = Bundle(bundle_dir)
    out = []
    for name in bundle.voices():
        summary = load_voice(voice_path(bundle.path, name)).shape_summary()
        out.append({"name": name, **{k: v for k, v in summary.items() if k.endswith("_length")}})
    return out

