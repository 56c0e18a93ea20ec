"""`POST /v1/audio/speech` and its websocket twin: the request checked whole before the first byte, then
the generation run in a worker thread, its audio encoded there into one stream per response."""

from __future__ import annotations

import base64
import threading
from dataclasses import dataclass, field

from ..errors import VibeVoiceError
from ..runtime.speech import Speech
from ..script import has_labels, parse_script
from ..checkpoints.configs import LONG_FORM_KINDS
from .codec import FORMATS, StreamEncoder
from .fields import option, served_model, take
from .http import ApiError, sse_event
from .models import Models, ServedModel

# What the speech routes take beyond OpenAI's fields (the runtime's own options).
OPTIONS = ("seed", "cfg_scale", "steps", "max_frames")
STREAM_FORMATS = ("audio", "sse")
MAX_INSTRUCTIONS = 4096


@dataclass
class SpeechRequest:
    model: ServedModel
    text: str
    voices: list[str]  # in speaker order for a script; one voice for plain text
    response_format: str = "mp3"
    stream_format: str = "audio"
    options: dict = field(default_factory=dict)
    turn_gap: float = 0.0

    @property
    def media_type(self) -> str:
        return "text/event-stream" if self.stream_format == "sse" else FORMATS[self.response_format]


def parse_speech(body, models: Models, max_chars: int, max_frames: int | None = None,
                 text_required: bool = True) -> SpeechRequest:
    """Every field of a speech request checked, as OpenAI's contract has them, plus OPTIONS; `max_frames`
    (the server's --max-frames) caps what a request may ask for and applies when it asks for nothing."""
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_json")
    model = served_model(models, take(body, "model", str, required=True), "tts")
    text = take(body, "input", str, required=text_required, max_length=max_chars, default="")
    if text_required and not text.strip():
        raise ApiError(400, "'input' is empty: give some text to speak", param="input", code="empty_input")
    speed = take(body, "speed", float, default=1.0)
    if not 0.25 <= speed <= 4.0:
        raise ApiError(400, f"'speed' must be from 0.25 to 4.0, got {speed:g}", param="speed", code="invalid_value")
    if speed != 1.0:
        raise ApiError(400, "'speed' other than 1.0 is not supported: VibeVoice sets its own pace, and a time-stretch "
                       "after the fact would change the voice; send 1.0 or leave it out", param="speed",
                       code="unsupported_value")
    take(body, "instructions", str, max_length=MAX_INSTRUCTIONS)  # accepted; these models take no instructions
    request = SpeechRequest(
        model, text, _voices(body, model, text),
        take(body, "response_format", str, default="mp3", choices=tuple(FORMATS)),
        take(body, "stream_format", str, default="audio", choices=STREAM_FORMATS),
        {name: value for name in OPTIONS if (value := option(body, name)) is not None},
        option(body, "turn_gap", 0.0),
    )
    if max_frames is not None:
        request.options["max_frames"] = min(request.options.get("max_frames", max_frames), max_frames)
    return request


def _voices(body: dict, model: ServedModel, text: str) -> list[str]:
    """The `voice` field: a name, `{"id": name}`, or a comma list in speaker order for a script."""
    value = body.get("voice")
    if isinstance(value, dict):
        value = value.get("id")
        if not isinstance(value, str):
            raise ApiError(422, "'voice' as an object must have a string 'id'", param="voice", code="invalid_type")
    elif value is not None and not isinstance(value, str):
        raise ApiError(422, f"'voice' must be a string or an object with an 'id', got {type(value).__name__}",
                       param="voice", code="invalid_type")
    names = [v.strip() for v in (value or "").split(",") if v.strip()]
    if not names:
        if not model.voices():
            raise ApiError(400, f"model '{model.id}' has no voices; import one with `vibevoice-onnx voices import`",
                           param="voice", code="no_voices")
        names = [model.voices()[0]]
    try:
        return [model.resolve_voice(name) for name in names]
    except VibeVoiceError as e:
        raise ApiError(400, str(e), param="voice", code="voice_not_found") from None


def start(request: SpeechRequest) -> Speech:
    """The generation for a request, every input checked (VibeVoiceError: a 400) before any audio."""
    model, options = request.model, request.options
    script = model.kind in LONG_FORM_KINDS or has_labels(request.text)
    if not script:
        if len(request.voices) > 1:
            raise ApiError(400, "several voices are given, but the input has no 'Speaker N:' lines", param="voice")
        return model.runner.stream(request.text, request.voices[0], **options, **model.batched)
    speakers = parse_script(request.text).speakers
    if len(request.voices) not in (1, len(speakers)) or len(request.voices) == 1 and len(speakers) > 1:
        raise ApiError(400, f"the script has {len(speakers)} speakers ({', '.join(map(str, speakers))}) but "
                       f"{len(request.voices)} voices are given: give one per speaker, in order, comma-separated",
                       param="voice")
    given = dict(zip(speakers, request.voices))
    if model.kind in LONG_FORM_KINDS:
        return model.runner.stream(request.text, given, **options, **model.batched)
    return model.runner.dialogue(request.text, given, turn_gap=request.turn_gap, **options, **model.batched)


def usage(model: ServedModel, text: str, frames: int) -> dict:
    tokens = len(model.bundle.tokenizer.encode(text, add_special_tokens=False).ids)
    return {"input_tokens": tokens, "output_tokens": frames, "total_tokens": tokens + frames}


def encode_job(speech: Speech, response_format: str, sse: bool, stopping: threading.Event):
    """The worker's job: each decoded chunk encoded into the response's one stream as it comes. When the
    server is stopping, the stream ends at the next frame with its encoder flushed (a whole file, cut short)."""

    def job(emit):
        encoder = StreamEncoder(response_format)
        for chunk in speech:
            if stopping.is_set():
                break
            data = encoder.encode(chunk.samples)
            if data:
                emit(sse_event("speech.audio.delta", audio=base64.b64encode(data).decode()) if sse else data)
        tail = encoder.finish()
        if tail:
            emit(sse_event("speech.audio.delta", audio=base64.b64encode(tail).decode()) if sse else tail)
        return speech

    return job
