"""One request layer for every front-end (the command line, the HTTP server, a batch job's items): what a speech
or transcription request may ask, its defaults and its limits, decided here once. A front-end only translates its
own format into a SpeechRequest or TranscriptionRequest and renders a RequestError in its own spelling of the
field (`--voice`, `voice`, `"voice"`), so the same bad request reads the same everywhere.

Torch-free: nothing here imports more than the runtime does."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .errors import VibeVoiceError
from .families import family
from .options import LIMITS, check
from .script import has_labels, parse_script
from .text import NOTHING_TO_SPEAK, speakable


@dataclass(frozen=True)
class Spelling:
    """How a front-end writes a request's fields: `name(field)`, and `entry` the way it gives one speaker's voice
    ({n}: the speaker's number)."""

    name: Callable[[str], str] = str
    entry: str = "speakers {n}=VOICE"


class RequestError(VibeVoiceError):
    """A request field that is wrong. `sentence` names fields as `{field}` (this error's), `{voice}`, `{seed}` ...
    and one speaker's voice as `{entry}`; each front-end renders it with its Spelling (`spelled`). Every other
    brace is literal (no doubling)."""

    def __init__(self, field_name: str, sentence: str, speaker="N", code: str = "invalid_value"):
        self.field, self.sentence, self.speaker, self.code = field_name, sentence, speaker, code
        super().__init__(self.spelled(Spelling()))

    def spelled(self, spelling: Spelling) -> str:
        """The sentence with its fields in `spelling`. Not str.format: the sentence quotes what the client sent,
        and a client's "{" or "{0}" must read as itself, never break the rendering."""

        def name(match: re.Match) -> str:
            key = match.group(1)
            if key == "field":
                return spelling.name(self.field)
            if key == "entry":
                return spelling.entry.format(n=self.speaker)
            return spelling.name(key)

        return re.sub(r"\{([a-z_]+)\}", name, self.sentence)


def checked(name: str, value):
    """An option in its range (options.LIMITS), or a RequestError naming it."""
    if value is None:
        return None
    try:
        return check(name, value)
    except VibeVoiceError:
        raise RequestError(name, f"{{field}} must be {LIMITS[name].describe()}, got {value!r}") from None


@dataclass
class SpeechRequest:
    """Text (or a `Speaker N:` script) to speak and how. `voice`: the one voice of plain text; `speakers`:
    {number as written: voice} for a script (None keys a script's lone speaker). Options left None take the
    kind's defaults (its families record) or the runtime's."""

    text: str | None
    voice: str | None = None
    speakers: dict | None = None
    cfg_scale: float | None = None
    steps: int | None = None
    seed: int | None = None
    max_frames: int | None = None
    turn_gap: float | None = None
    voice_latents: str | None = None  # long-form: sample (upstream) or mean
    decode_group: int | None = None  # realtime
    noise: Path | None = None  # a .npy file of noise rows (speak --noise), opened for the model when it applies
    text_stream: bool = False  # realtime: the text is fed to the generation as it arrives
    max_chars: int | None = None  # a front-end's limit on the text (a server's), also on a streamed text
    voice_files: bool = True  # a voice may be a file or URL (not over HTTP: a server reads no client's paths)
    extra: dict = field(default_factory=dict)  # runtime options of the front-end's own (a server's batch)

    def check(self) -> None:
        """Every field on its own (ranges, types, lengths), before the model is looked at."""
        for name in ("cfg_scale", "steps", "seed", "max_frames", "turn_gap", "decode_group"):
            setattr(self, name, checked(name, getattr(self, name)))
        if self.text is not None and self.max_chars is not None and len(self.text) > self.max_chars:
            raise RequestError("text", f"{{field}} is {len(self.text)} characters long, over the limit of "
                                       f"{self.max_chars}")
        if self.text is not None:  # a streamed text may start empty: its pieces are cleaned as they come
            self.text = speakable(self.text) if self.text_stream else spoken_text(self.text)
        if self.voice is not None and (not isinstance(self.voice, str) or not self.voice.strip()):
            raise RequestError("voice", f"{{field}} must name a voice, got {self.voice!r}")
        if self.voice_latents not in (None, "sample", "mean"):
            raise RequestError("voice_latents", f"{{field}} must be sample or mean, got {self.voice_latents!r}")
        if self.speakers is not None:
            for number, voice in self.speakers.items():
                if number is not None and (not isinstance(number, int) or isinstance(number, bool)) \
                        or not isinstance(voice, str) or not voice.strip():
                    raise RequestError("speakers", "{field} maps each speaker's number to a voice: "
                                                   "{\"1\": \"alice\", \"2\": \"bob\"}")


def spoken_text(text: str) -> str:
    """The one text rule of every front-end (the command line, HTTP, the websockets, batch items; the Python API's
    runtime applies the same `speakable`): control characters other than newline and tab are removed, and a text
    with nothing left to speak is refused, naming the field."""
    cleaned = speakable(text)
    if not cleaned.strip():
        raise RequestError("text", "{field} " + NOTHING_TO_SPEAK, code="empty_input")
    return cleaned


@dataclass
class Started:
    """A request's generation, begun: the Speech to iterate, and what it does in words (for a log)."""

    speech: object
    described: str
    preparing: str | None = None


def start_speech(tts, request: SpeechRequest) -> Started:
    """Begin the generation `request` asks of the open TTS model `tts`, every field checked against the model
    (its kind, its voices) first: a RequestError before any audio."""
    request.check()
    facts = family(tts.kind)
    common = dict(cfg_scale=facts.defaults.cfg_scale if request.cfg_scale is None else request.cfg_scale,
                  steps=facts.defaults.steps if request.steps is None else request.steps,
                  seed=request.seed, max_frames=request.max_frames, **request.extra)
    if facts.capabilities.long_form:
        return _start_long_form(tts, request, common)
    return _start_realtime(tts, request, common)


def _refuse(kind: str, names: dict[str, object]) -> None:
    for name, value in names.items():
        if value is not None and value is not False:
            raise RequestError(name, f"{{field}} does not apply to a {kind} bundle" + {
                "voice": "; give each speaker a voice with {entry}",
                "voice_latents": " (its voices are cached prompts, not audio samples)",
                "decode_group": " (each latent's audio feeds the next step, so it is decoded at once)",
            }.get(name, ""))


def _start_long_form(tts, request: SpeechRequest, common: dict) -> Started:
    _refuse(tts.kind, {"voice": request.voice, "decode_group": request.decode_group,
                       "text_stream": request.text_stream, "turn_gap": request.turn_gap})
    voice_latents = request.voice_latents or "sample"
    if request.seed is not None and request.noise is not None and voice_latents == "mean":
        raise RequestError("seed", "give either {seed} or {noise} with {voice_latents} mean: nothing else is random")
    if not request.speakers:
        raise RequestError("speakers", "give each speaker of the script a voice: {entry} (a bundle voice or an "
                                       "audio file)")
    given = _script_voices(tts, request)
    speech = tts.stream(request.text, given, noise=_noise(tts, request), voice_latents=voice_latents, **common)
    seconds = sum(voice.seconds for voice in speech.voices)
    preparing = (f"encoding {len(speech.voices)} voice sample{'s' * (len(speech.voices) > 1)} ({seconds:.1f} s of "
                 f"audio) and a {speech.prompt_tokens}-token prompt before the first audio")
    return Started(speech, f"speakers {_named(given)}, voice latents {voice_latents}", preparing)


def _start_realtime(tts, request: SpeechRequest, common: dict) -> Started:
    """Plain text, a text streamed in as it arrives, or a dialogue (a script, one preset per speaker)."""
    _refuse(tts.kind, {"voice_latents": request.voice_latents})
    if request.decode_group is not None:
        common["decode_group"] = request.decode_group
    if request.speakers:
        for name, value in (("voice", request.voice), ("noise", request.noise), ("text_stream", request.text_stream)):
            if value:
                raise RequestError(name, "{field} does not apply to a dialogue ({speakers}): each turn uses its "
                                         "speaker's voice and the noise of seed + turn")
        given = _script_voices(tts, request)
        speech = tts.dialogue(request.text, given, turn_gap=request.turn_gap or 0.0, **common)
        return Started(speech, f"dialogue, one turn per line, speakers {_named(given)} (turn k: seed + k)")
    if request.turn_gap is not None:
        raise RequestError("turn_gap", "{field} applies to a dialogue only: a script spoken with {entry}")
    if request.seed is not None and request.noise is not None:
        raise RequestError("seed", "give either {seed} or {noise}, not both")
    voice = request.voice or (tts.voices[0] if tts.voices else None)
    if voice is None:
        raise RequestError("voice", "the model has no voices; import one with `vibevoice-onnx voices import`")
    check_voice(tts, "voice", voice, request.voice_files)
    if request.text_stream:
        limit = {} if request.max_chars is None else {"max_chars": request.max_chars}
        speech = tts.text_stream(voice, noise=_noise(tts, request), **limit, **common)
        return Started(speech, f"voice {voice}, text from standard input as it arrives")
    return Started(tts.stream(request.text, voice, noise=_noise(tts, request), **common), f"voice {voice}")


def _noise(tts, request: SpeechRequest):
    if request.noise is None:
        return None
    from .sampling import NoiseSource

    noise = NoiseSource.from_file(request.noise, tts.latent_size)
    if request.max_frames is not None and request.max_frames > noise.frames:
        raise RequestError("noise", f"{request.noise}: has {noise.frames} rows, fewer than {{max_frames}} "
                                    f"{request.max_frames}")
    return noise


def check_voice(tts, name: str, voice: str, files: bool) -> None:
    """A voice of the model, or (where `files`) a voice file or http(s) URL; else a RequestError naming field
    `name`. A file's contents are checked when the runtime reads it."""
    if voice in tts.voices:
        return
    if files:
        from .hub.home import is_url

        if is_url(voice) or Path(voice).is_file():
            return
    available = ", ".join(tts.voices) or "none; import one with `vibevoice-onnx voices import`"
    raise RequestError(name, f"{{field}}: the model has no voice '{voice}' (available: {available})"
                       + (", and it is no voice file or http(s) URL" if files else ""), code="voice_not_found")


def _script_voices(tts, request: SpeechRequest) -> dict:
    """The script's speakers each with a checked voice (the runtime's own check then never fires)."""
    speakers = parse_script(request.text or "").speakers
    given = request.speakers
    if None in given:
        if len(given) > 1 or len(speakers) > 1:
            raise RequestError("speakers", f"the script has speakers {', '.join(map(str, speakers))}: give each its "
                                           "voice as {entry}")
    else:
        unused = sorted(set(given) - set(speakers))
        if unused:
            raise RequestError("speakers", f"a voice is given for Speaker {unused[0]}, who does not speak in the "
                                           f"script (speakers: {', '.join(map(str, speakers))})", unused[0])
        without = [n for n in speakers if n not in given]
        if without:
            raise RequestError("speakers", f"Speaker {without[0]} speaks in the script but has no voice: add {{entry}}",
                               without[0])
    for voice in given.values():
        check_voice(tts, "speakers", voice, request.voice_files)
    return given


def _named(given: dict) -> str:
    return ", ".join(f"{n}={v}" if n is not None else str(v) for n, v in given.items())


def is_script(kind: str, text: str) -> bool:
    """Whether a text is spoken as a script: always by a long-form kind, by realtime when it has labels."""
    return family(kind).capabilities.long_form or has_labels(text)


@dataclass
class TranscriptionRequest:
    """Audio to transcribe and how: `hotwords` (names, terms) to steer the text, `seed` for the acoustic noise
    (None: random), `max_new_tokens` (None: the runtime's cap), `mean_latents` (no noise at all),
    `repetition_guard` (a decoding loop cut back and recovered from: generation.repetition)."""

    hotwords: str | None = None
    seed: int | None = None
    max_new_tokens: int | None = None
    mean_latents: bool = False
    repetition_guard: bool = True

    def check(self) -> "TranscriptionRequest":
        if self.hotwords is not None and not isinstance(self.hotwords, str):
            raise RequestError("hotwords", f"{{field}} must be text, got {type(self.hotwords).__name__}")
        for name in ("mean_latents", "repetition_guard"):
            if not isinstance(getattr(self, name), bool):
                raise RequestError(name, f"{{field}} must be true or false, got {getattr(self, name)!r}")
        self.seed, self.max_new_tokens = checked("seed", self.seed), checked("max_new_tokens", self.max_new_tokens)
        return self

    def options(self) -> dict:
        """The runtime's keyword arguments (Transcriber.transcribe), the request checked."""
        self.check()
        cap = {} if self.max_new_tokens is None else {"max_new_tokens": self.max_new_tokens}
        return {"hotwords": self.hotwords, "seed": self.seed, "mean_latents": self.mean_latents,
                "repetition_guard": self.repetition_guard, **cap}


def transcribe(transcriber, audio, request: TranscriptionRequest, **hooks):
    """Transcribe `audio` (a path, or samples with `sample_rate` in `hooks`) on an open Transcriber as `request`
    asks; `hooks`: the runtime's callbacks (progress, on_segment, on_token) and batch."""
    return transcriber.transcribe(audio, **request.options(), **hooks)
