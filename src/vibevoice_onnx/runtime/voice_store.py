"""`vibevoice-onnx voices`: import voices into a bundle (realtime presets, 1.5B audio samples), list them (torch-free)."""

from __future__ import annotations

import hashlib
import sys
from functools import partial
from pathlib import Path

from ..errors import VibeVoiceError
from ..outputs import atomic_file, file_error, remove_stale_partials
from ..audio import VoiceSample, save_voice_sample
from ..voices import save_voice
from ..families import family
from .bundle import Bundle, file_record, voice_path, write_manifest


def import_voice(bundle_dir: Path, source: Path | str, name: str | None = None, force: bool = False) -> tuple[str, dict]:
    """Add a voice to a bundle: an upstream preset (.pt) for realtime, an audio sample for 1.5B and Large; from a
    file, or an http(s) URL downloaded once into the cache."""
    from ..hub.home import local_file

    bundle = Bundle(bundle_dir)
    voices = family(bundle.kind).voices
    if voices is None:
        raise VibeVoiceError(f"{bundle.path}: a bundle of kind '{bundle.kind}' has no voices")
    source = local_file(source)
    if not source.is_file():
        raise VibeVoiceError(f"{source}: no such {voices} file")
    name = name or source.stem
    target = voice_path(bundle.path, name)
    if target.exists() and not force:
        raise VibeVoiceError(f"{bundle.path}: already has a voice '{name}' (choose another --name, or --force)")
    voice = bundle.read_voice_source(source)
    if voices == "preset":
        write = partial(save_voice, voice, metadata={"source": source.name, "sha256": hashlib.sha256(source.read_bytes()).hexdigest()})
        summary = voice.shape_summary()
    else:
        write = partial(save_voice_sample, voice)
        summary = voice_summary(voice)
    try:
        target.parent.mkdir(exist_ok=True)
    except OSError as e:
        raise file_error(e, "creating the voices folder") from None
    remove_stale_partials(target.parent, log=lambda m: print(m, file=sys.stderr))
    # The manifest recording the voice is written while the voice is still partial, then the voice renamed in:
    # a write that fails (a full disk) leaves the previous voice and manifest both as they were.
    relative = target.relative_to(bundle.path).as_posix()
    with atomic_file(target, "writing the voice") as temporary:
        write(temporary)
        manifest = Bundle(bundle.path).info
        files = {**(manifest.files or {}), relative: file_record(temporary)}
        write_manifest(bundle.path, {**manifest.to_dict(), "files": dict(sorted(files.items()))},
                       "recording the voice in the manifest")
    return name, summary


def voice_summary(voice: VoiceSample) -> dict:
    return {"seconds": round(voice.seconds, 3), "frames": voice.frames,
            **{k: voice.metadata[k] for k in ("source", "sample_rate", "channels") if k in voice.metadata}}


def list_voices(bundle_dir: Path) -> list[dict]:
    bundle = Bundle(bundle_dir)
    out = []
    for name in bundle.voices():
        voice = bundle.voice(name)
        if family(bundle.kind).voices == "preset":
            out.append({"name": name, **{k: v for k, v in voice.shape_summary().items() if k.endswith("_length")}})
        else:
            out.append({"name": name, **voice_summary(voice)})
    return out
