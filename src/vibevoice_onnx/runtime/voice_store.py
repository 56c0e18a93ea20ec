"""`vibevoice-onnx voices`: import voices into a bundle (realtime presets, 1.5B audio samples), list them (torch-free)."""

from __future__ import annotations

import hashlib
import sys
from functools import partial
from pathlib import Path

from ..errors import VibeVoiceError
from ..outputs import atomic_file, os_error_message, remove_stale_partials
from ..audio import VoiceSample, save_voice_sample, voice_from_file
from ..voices import check_voice_fits, read_upstream_preset, save_voice
from ..checkpoints.configs import LONG_FORM_KINDS
from .bundle import Bundle, voice_path


def import_voice(bundle_dir: Path, source: Path, name: str | None = None, force: bool = False) -> tuple[str, dict]:
    """Add a voice to a bundle: an upstream preset (.pt) for realtime, an audio sample for 1.5B and Large."""
    bundle = Bundle(bundle_dir)
    if bundle.kind not in ("realtime", *LONG_FORM_KINDS):
        raise VibeVoiceError(f"{bundle.path}: a bundle of kind '{bundle.kind}' has no voices")
    source = Path(source)
    if not source.is_file():
        raise VibeVoiceError(f"{source}: no such {'preset' if bundle.kind == 'realtime' else 'audio'} file")
    name = name or source.stem
    target = voice_path(bundle.path, name)
    if target.exists() and not force:
        raise VibeVoiceError(f"{bundle.path}: already has a voice '{name}' (choose another --name, or --force)")
    if bundle.kind == "realtime":
        prompt = read_upstream_preset(source)
        check_voice_fits(prompt, bundle.expected_voice_shapes(), str(source))
        write = partial(save_voice, prompt, metadata={"source": source.name, "sha256": hashlib.sha256(source.read_bytes()).hexdigest()})
        summary = prompt.shape_summary()
    else:
        voice = voice_from_file(source)
        write = partial(save_voice_sample, voice)
        summary = voice_summary(voice)
    try:
        target.parent.mkdir(exist_ok=True)
    except OSError as e:
        raise VibeVoiceError(os_error_message(e, "creating the voices folder")) from None
    remove_stale_partials(target.parent, log=lambda m: print(m, file=sys.stderr))
    with atomic_file(target, "writing the voice") as temporary:
        write(temporary)
    return name, summary


def voice_summary(voice: VoiceSample) -> dict:
    return {"seconds": round(voice.seconds, 3), "frames": voice.frames,
            **{k: voice.metadata[k] for k in ("source", "sample_rate", "channels") if k in voice.metadata}}


def list_voices(bundle_dir: Path) -> list[dict]:
    bundle = Bundle(bundle_dir)
    out = []
    for name in bundle.voices():
        voice = bundle.voice(name)
        if bundle.kind == "realtime":
            out.append({"name": name, **{k: v for k, v in voice.shape_summary().items() if k.endswith("_length")}})
        else:
            out.append({"name": name, **voice_summary(voice)})
    return out
