"""What a batch job's workers run: each opens its bundle once and then makes item after item, writing each
item's output and manifest row (cluster.items) before it hands the row back. Plain classes: Ray Data runs them
as an actor pool (cluster.jobs), and they run the same without Ray."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict
from pathlib import Path

from ..errors import StorageFull, VibeVoiceError
from ..families import family
from ..outputs import file_error, storage_full, writer_os_error
from ..requests import RequestError, SpeechRequest, Spelling, TranscriptionRequest, transcribe
from .items import STOPPED, JobFolder, Row

SYNTHESIS_FIELDS = frozenset({"id", "text", "script", "voice", "speakers", "seed", "cfg_scale", "steps", "max_frames",
                              "wav_format", "turn_gap", "voice_latents", "response_format"})
TRANSCRIPTION_FIELDS = frozenset({"id", "audio", "hotwords", "seed", "max_new_tokens", "mean_latents",
                                  "repetition_guard"})
# How an item names a request's fields in its row's error: as its JSON key.
ITEM_SPELLING = Spelling(lambda name: f'"{name}"', '"speakers": {{"{n}": VOICE}}')


class Worker:
    """Rows in, rows out: `__call__` takes a batch of {"item": JSON} rows and returns their manifest rows."""

    task = ""
    fields: frozenset[str] = frozenset()  # the keys an item may have

    def __init__(self, bundle: str, out: str, threads: int | None = None, force: bool = False):
        from ..runtime.pretrained import open_model

        self.model = open_model(Path(bundle), threads=threads, force=force)  # the bundle's kind's runtime object
        self.folder = JobFolder(Path(out), self.task)
        self.name = worker_name()
        self.full: str | None = None  # the write that found no room, once one has: its sentence

    def __call__(self, batch: dict) -> dict:
        rows = [self.run(json.loads(str(text))) for text in batch["item"]]
        return {name: [getattr(row, name) for row in rows] for name in asdict(rows[0])}

    def run(self, item: dict) -> Row:
        """The item made and its row written; a bad item becomes a row with its error, never an exception.

        A file system without room is no item's fault: the row handed back says STOPPED (the driver stops the
        job), nothing of the item is left on disk, not even its row, so the next run makes it; and this worker
        makes nothing more."""
        start = time.perf_counter()
        if self.full is not None:
            return self._stopped(item, start, self.full)
        try:
            _check_fields(item, self.fields)
            row = self.make(item, start)
        except (VibeVoiceError, ValueError, TypeError, OSError) as e:
            if storage_full(e):
                return self._stopped(item, start, e)
            message = e.spelled(ITEM_SPELLING) if isinstance(e, RequestError) else str(e)
            row = Row(item["id"], "error", None, None, None, round(time.perf_counter() - start, 3), message)
        row.worker = self.name
        try:
            self.folder.write_row(row)
        except StorageFull as e:
            return self._stopped(item, start, e)
        return row

    def _stopped(self, item: dict, start: float, error: Exception | str) -> Row:
        """The item handed back undone; the first write that found no room is what every later item reports."""
        if self.full is None:
            self.full = str(error) if isinstance(error, VibeVoiceError) else str(
                file_error(writer_os_error(error), "writing", self.folder.output(item["id"])))
        return Row(item["id"], STOPPED, None, None, None, round(time.perf_counter() - start, 3), self.full, self.name)

    def make(self, item: dict, start: float) -> Row:
        raise NotImplementedError


def worker_name() -> str:
    """NODE/PID: the Ray node's id (its first 12 digits) inside a Ray worker, else the host name."""
    try:
        import ray

        if ray.is_initialized():
            return f"{ray.get_runtime_context().get_node_id()[:12]}/{os.getpid()}"
    except ImportError:
        pass
    return f"{socket.gethostname()}/{os.getpid()}"


def _check_fields(item: dict, allowed: frozenset[str]) -> None:
    unknown = sorted(set(item) - allowed)
    if unknown:
        raise VibeVoiceError(f"unknown field{'s' * (len(unknown) > 1)} {', '.join(unknown)} (known: "
                             f"{', '.join(sorted(allowed))})")


class SynthesisWorker(Worker):
    """`speak` for each item: {"id", "text" | "script", "voice" | "speakers": {N: VOICE}, and speak's options}."""

    task, fields = "synthesize", SYNTHESIS_FIELDS

    def make(self, item: dict, start: float) -> Row:
        from ..commands.speak import WAV_SUBTYPES, SpeakOptions, speak_with

        if item.get("response_format", "wav") != "wav":
            raise RequestError("response_format", f"{{field}} '{item['response_format']}': batch jobs write WAV files")
        wav_format = item.get("wav_format", "pcm16")
        if wav_format not in WAV_SUBTYPES:
            raise RequestError("wav_format", f"{{field}} must be one of {', '.join(WAV_SUBTYPES)}, got {wav_format!r}")
        output = self.folder.output(item["id"])
        summary = speak_with(self.model, item_request(item, self.model.kind),
                             SpeakOptions(output=output, wav_format=wav_format))
        return Row(item["id"], "ok", str(output), summary["audio_seconds"], None, round(time.perf_counter() - start, 3))


def item_request(item: dict, kind: str) -> SpeechRequest:
    """A synthesis item as the request layer's request: {"text" | "script", "voice" | "speakers": {N: VOICE}, and
    speak's options}; a long-form bundle's "voice" is its script's one speaker."""
    text = item.get("text", item.get("script"))
    if not isinstance(text, str):
        raise RequestError("text", "the item has no text: give {text} (or {script}) as a string")
    speakers, voice = item.get("speakers"), item.get("voice")
    long_form = family(kind).capabilities.long_form
    if speakers is not None:
        speakers = _speaker_numbers(speakers)
    elif long_form and voice is not None:
        speakers, voice = {None: voice}, None
    elif long_form:
        raise RequestError("speakers", f"a {kind} bundle needs a voice sample: give {{voice}} (one speaker) or "
                                       "{entry}", 1)
    options = {name: item.get(name) for name in ("seed", "cfg_scale", "steps", "max_frames", "turn_gap",
                                                 "voice_latents")}
    return SpeechRequest(text, voice=voice, speakers=speakers, **options)


def _speaker_numbers(speakers) -> dict:
    """{"1": VOICE, ...} with its keys as the script's speaker numbers (JSON keys are strings)."""
    if not isinstance(speakers, dict) or not all(isinstance(k, str) and k.isdigit() for k in speakers):
        raise RequestError("speakers", "{field} maps each speaker number to a voice: {\"1\": \"alice\", \"2\": \"bob\"}")
    return {int(number): voice for number, voice in speakers.items()}


class TranscriptionWorker(Worker):
    """`transcribe --format json` for each item: {"id", "audio": PATH, "hotwords", "seed", "max_new_tokens",
    "mean_latents", "repetition_guard"}."""

    task, fields = "transcribe", TRANSCRIPTION_FIELDS

    def make(self, item: dict, start: float) -> Row:
        from ..outputs import atomic_file
        from ..transcription import render

        if not isinstance(item.get("audio"), str):
            raise RequestError("audio", "the item has no {audio}: give the recording's path")
        request = TranscriptionRequest(item.get("hotwords"), item.get("seed"), item.get("max_new_tokens"),
                                       bool(item.get("mean_latents", False)), item.get("repetition_guard", True))
        result = transcribe(self.model, Path(item["audio"]), request)
        output = self.folder.output(item["id"])
        with atomic_file(output, "writing the transcript") as partial:
            partial.write_text(render("json", result.segments, result.text, result.raw, result.repetition.as_dict()),
                               encoding="utf-8")
        return Row(item["id"], "ok", str(output), round(result.audio_seconds, 3), len(result.tokens),
                   round(time.perf_counter() - start, 3))


WORKERS = {"synthesize": SynthesisWorker, "transcribe": TranscriptionWorker}
