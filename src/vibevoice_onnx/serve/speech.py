"""`POST /v1/audio/speech` and its websocket twin: the request checked whole before the first byte, then
the generation run in a worker thread, its audio encoded there into one stream per response."""

from __future__ import annotations

import base64
import threading
from dataclasses import dataclass

from ..requests import RequestError, SpeechRequest, is_script, spoken_text, start_speech
from ..runtime.speech import Speech
from ..script import parse_script
from .codec import FORMATS, StreamEncoder
from .fields import api_error, served_model, take
from .http import ApiError, sse_event
from .models import Models, ServedModel

# What the speech routes take beyond OpenAI's fields (the runtime's own options).
OPTIONS = ("seed", "cfg_scale", "steps", "max_frames")
STREAM_FORMATS = ("audio", "sse")
MAX_INSTRUCTIONS = 4096


@dataclass
class SpeechCall:
    """A speech request as the server takes it: the model, the request layer's request, and the response."""

    model: ServedModel
    request: SpeechRequest
    response_format: str = "mp3"
    stream_format: str = "audio"

    @property
    def text(self) -> str:
        return self.request.text or ""

    @property
    def media_type(self) -> str:
        return "text/event-stream" if self.stream_format == "sse" else FORMATS[self.response_format]


def parse_speech(body, models: Models, max_chars: int, max_frames: int | None = None,
                 text_required: bool = True) -> SpeechCall:
    """Every field of a speech request taken, as OpenAI's contract has them, plus OPTIONS; `max_frames` (the
    server's --max-frames) caps what a request may ask for and applies when it asks for nothing. Ranges and
    voices are the request layer's to check (`start`); `text_required` False: the text streams in after."""
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_json")
    model = served_model(models, take(body, "model", str, required=True), "tts")
    text = take(body, "input", str, required=text_required, max_length=max_chars, default="")
    if text_required:  # before the voices are matched to the script's speakers
        try:
            text = spoken_text(text)
        except RequestError as e:
            raise api_error(e) from None
    speed = take(body, "speed", float, default=1.0)
    if not 0.25 <= speed <= 4.0:
        raise ApiError(400, f"'speed' must be from 0.25 to 4.0, got {speed:g}", param="speed", code="invalid_value")
    if speed != 1.0:
        raise ApiError(400, "'speed' other than 1.0 is not supported: VibeVoice sets its own pace, and a time-stretch "
                       "after the fact would change the voice; send 1.0 or leave it out", param="speed",
                       code="unsupported_value")
    take(body, "instructions", str, max_length=MAX_INSTRUCTIONS)  # accepted; these models take no instructions
    options = {name: take(body, name, float) for name in (*OPTIONS, "turn_gap")}
    if max_frames is not None:
        options["max_frames"] = max_frames if options["max_frames"] is None else min(options["max_frames"], max_frames)
    request = SpeechRequest(text, **_voices(body, model, text, text_required), **options, max_chars=max_chars,
                            text_stream=not text_required, voice_files=False, extra=model.batched)
    return SpeechCall(model, request, take(body, "response_format", str, default="mp3", choices=tuple(FORMATS)),
                      take(body, "stream_format", str, default="audio", choices=STREAM_FORMATS))


def _voices(body: dict, model: ServedModel, text: str, whole_text: bool) -> dict:
    """The `voice` field: a name, `{"id": name}`, or a comma list in speaker order for a script; OpenAI's voice
    names taken to the model's (its aliases). As the request's `voice`, or for a script its `speakers`."""
    value = body.get("voice")
    if isinstance(value, dict):
        value = value.get("id")
        if not isinstance(value, str):
            raise ApiError(422, "'voice' as an object must have a string 'id'", param="voice", code="invalid_type")
    elif value is not None and not isinstance(value, str):
        raise ApiError(422, f"'voice' must be a string or an object with an 'id', got {type(value).__name__}",
                       param="voice", code="invalid_type")
    names = [model.alias(v.strip()) for v in (value or "").split(",") if v.strip()]
    if not names:
        if not model.voices():
            raise ApiError(400, f"model '{model.id}' has no voices; import one with `vibevoice-onnx voices import`",
                           param="voice", code="no_voices")
        names = [model.voices()[0]]
    if not whole_text:
        if len(names) > 1:
            raise ApiError(400, "a streamed text takes one voice", param="voice")
        return {"voice": names[0]}
    if not is_script(model.kind, text):
        if len(names) > 1:
            raise ApiError(400, "several voices are given, but the input has no 'Speaker N:' lines", param="voice")
        return {"voice": names[0]}
    speakers = parse_script(text).speakers
    if len(names) > len(speakers) or len(names) == 1 and len(speakers) > 1:
        raise ApiError(400, f"the script has {len(speakers)} speakers ({', '.join(map(str, speakers))}) but "
                       f"{len(names)} voices are given: give one per speaker, in order, comma-separated",
                       param="voice")
    return {"speakers": dict(zip(speakers, names))}


def start(call: SpeechCall) -> Speech:
    """The generation for a request, every input checked (a 400 naming the field) before any audio."""
    try:
        return start_speech(call.model.runner, call.request).speech
    except RequestError as e:
        raise api_error(e) from None



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
