"""The bundles a server serves: each opened once per process under a stable id, OpenAI's model and voice
names mapped onto them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import VibeVoiceError
from ..families import family, kinds_that, load
from ..runtime.bundle import Bundle

if TYPE_CHECKING:
    from ..runtime.asr import Transcriber
    from ..runtime.asr_streaming import StreamingModel
    from ..runtime.speech import TtsModel

# OpenAI's model names go to the first bundle that does what they do, so unmodified clients work.
OPENAI_MODELS = {"tts-1": "tts", "tts-1-hd": "tts", "gpt-4o-mini-tts": "tts",
                 "whisper-1": "asr", "gpt-4o-transcribe": "asr", "gpt-4o-mini-transcribe": "asr"}
# OpenAI's voice names, onto upstream's realtime presets (by the voice's register in OpenAI's own samples);
# a name whose preset the bundle lacks goes to the bundle's first voice. `--voice-alias NAME=VOICE` overrides.
OPENAI_VOICES = {
    "alloy": "en-Emma_woman", "ash": "en-Davis_man", "ballad": "en-Frank_man", "coral": "en-Grace_woman",
    "echo": "en-Mike_man", "fable": "en-Carter_man", "onyx": "en-Frank_man", "nova": "en-Emma_woman",
    "sage": "en-Grace_woman", "shimmer": "en-Emma_woman", "verse": "en-Carter_man", "marin": "en-Grace_woman",
    "cedar": "en-Davis_man",
}


@dataclass
class ServedModel:
    id: str
    bundle: Bundle
    runner: TtsModel | Transcriber | StreamingModel  # sessions loaded once; onnxruntime runs them from several threads at once
    aliases: dict[str, str] = field(default_factory=dict)
    batch: object | None = None  # the runner's StreamBatch (runtime.batch): concurrent requests share its model calls

    @property
    def batched(self) -> dict:
        """The runner's options that put a generation in the model's batch (none where it has none)."""
        return {"batch": self.batch} if self.batch is not None else {}

    @property
    def kind(self) -> str:
        return self.bundle.kind

    @property
    def task(self) -> str:
        return "tts" if family(self.kind).capabilities.speaks else "asr"

    def voices(self) -> list[str]:
        return self.bundle.voices() if self.task == "tts" else []

    def alias(self, name: str) -> str:
        """The bundle voice an OpenAI voice name or an alias stands for; any other name as it is (the request
        layer checks it is a voice of the bundle: here a voice is never a path, which 1.5B's API would read)."""
        voices = self.voices()
        if name in voices or name not in self.aliases and name not in OPENAI_VOICES:
            return name
        target = self.aliases.get(name) or OPENAI_VOICES[name]
        if target in voices:
            return target
        return voices[0] if name not in self.aliases and voices else name

    @property
    def gates(self) -> str:
        """What `verify` found: "passed", "failed" (served only under --force) or "not run"."""
        parity = self.bundle.info.parity
        return "not run" if not parity else "passed" if parity.get("passed") else "failed"

    def describe(self) -> dict:
        return {"id": self.id, "object": "model", "created": int(self.bundle.path.stat().st_mtime),
                "owned_by": "vibevoice-onnx", "kind": self.kind, "precision": self.bundle.info.precision,
                "device": self.bundle.info.device, "task": "speech" if self.task == "tts" else "transcription",
                "gates": self.gates,
                **({"batching": self.batch.describe()} if self.batch is not None else {})}


class Models:
    """Every served model by id, and OpenAI's names resolved to the first model of their task."""

    def __init__(self, models: list[ServedModel]):
        if not models:
            raise VibeVoiceError("give at least one bundle to serve")
        self.by_id = {m.id: m for m in models}

    @staticmethod
    def check(paths: list[Path], threads: int | None = None, force: bool = False,
              aliases: dict[str, str] | None = None) -> list[Bundle]:
        """Every bundle found, of a servable kind and usable (unless `force`), and every alias's voice in one of
        them; no session is loaded, so a launcher (serve --ray) can refuse at once what every replica would."""
        bundles = [Bundle(Path(path), threads=threads) for path in paths]
        for bundle in bundles:
            if bundle.kind not in kinds_that(speaks=True) + kinds_that(transcribes=True):
                raise VibeVoiceError(f"{bundle.path}: a bundle of kind '{bundle.kind}' cannot be served")
            if not force:
                bundle.require_usable()
        for name, voice in (aliases or {}).items():
            if not any(voice in bundle.voices() for bundle in bundles if family(bundle.kind).capabilities.speaks):
                raise VibeVoiceError(f"--voice-alias {name}={voice}: no served bundle has a voice '{voice}'")
        return bundles

    @classmethod
    def open(cls, paths: list[Path], threads: int | None = None, force: bool = False,
             aliases: dict[str, str] | None = None, max_batch: int = 1) -> "Models":
        """`max_batch` > 1: each bundle batches that many concurrent generations (transcriptions: their greedy
        decoding) step by step."""
        models, ids = [], set()
        for bundle in cls.check(paths, threads, force, aliases):
            runner = load(family(bundle.kind).runtime)(bundle, force=force)
            model_id = unique(f"vibevoice-{bundle.kind}-{bundle.path.name.replace('_', '-')}", ids)
            ids.add(model_id)
            batch = runner.batch(max_batch) if max_batch > 1 else None
            models.append(ServedModel(model_id, runner.bundle, runner, dict(aliases or {}), batch))
        return cls(models)

    def doing(self, task: str) -> list[ServedModel]:
        """The served models of `task` ("tts" or "asr"), in the order they were given."""
        return [m for m in self.by_id.values() if m.task == task]

    def names(self, task: str) -> list[str]:
        """Every name a request may give for `task`: the served ids, then OpenAI's names when one is served."""
        ids = [m.id for m in self.doing(task)]
        return ids + [k for k, v in OPENAI_MODELS.items() if v == task] * bool(ids)

    def get(self, name: str, task: str) -> ServedModel:
        model = self.by_id.get(name)
        if model is None and OPENAI_MODELS.get(name) == task:
            model = next(iter(self.doing(task)), None)
        if model is None:
            served = ", ".join(m.id for m in self.doing(task)) or "none"
            what = "speech" if task == "tts" else "transcription"
            raise VibeVoiceError(f"no {what} model '{name}' here (served: {served}; OpenAI's names "
                                 f"{', '.join(k for k, v in OPENAI_MODELS.items() if v == task)} go to the first)")
        if model.task != task:
            raise VibeVoiceError(f"model '{name}' is a {model.kind} model: it does not do "
                                 f"{'speech' if task == 'tts' else 'transcription'}")
        return model


def unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 2
    while candidate in taken:
        candidate, n = f"{name}-{n}", n + 1
    return candidate


def parse_aliases(values: list[str]) -> dict[str, str]:
    aliases = {}
    for value in values:
        name, sep, voice = value.partition("=")
        if not sep or not name.strip() or not voice.strip():
            raise VibeVoiceError(f"--voice-alias {value}: give it as NAME=VOICE (alloy=en-Davis_man)")
        aliases[name.strip()] = voice.strip()
    return aliases
