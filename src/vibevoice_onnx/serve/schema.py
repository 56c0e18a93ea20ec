"""The served OpenAPI document (`GET /openapi.json`): what each route takes and answers. The routes read
their bodies themselves, to answer every fault in OpenAI's error shape, so their request bodies and
responses are written down here, once, for clients and for the schema-driven fuzzing in the tests."""

from __future__ import annotations

from ..options import LIMITS
from .codec import FORMATS
from .http import ERROR_TYPES

ERROR = {
    "type": "object", "required": ["error"], "additionalProperties": False,
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"], "additionalProperties": False,
        "properties": {"message": {"type": "string", "minLength": 1},
                       "type": {"enum": sorted(set(ERROR_TYPES.values()))},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}
_REASONS = {400: "a field or the body is invalid", 401: "no valid API key", 404: "no such model or voice",
            408: "the body did not arrive in time", 413: "the body is over the limit",
            422: "a field has the wrong type", 429: "the server is busy (Retry-After)",
            507: "the server's disk is full"}


def _events(*kinds: str, done: bool = False) -> dict:
    """An SSE stream, each event's schema (OpenAPI 3.1): `data` is a JSON object whose `type` is one of
    `kinds` (or "error", in OpenAI's error shape), or the closing `[DONE]`."""
    types = "|".join(k.replace(".", r"\.") for k in (*kinds, "error"))
    pattern = f'^(\\[DONE\\]|\\{{"type": "({types})")' if done else f'^\\{{"type": "({types})"'
    return {"schema": {"type": "object", "required": ["data"],
                       "properties": {"data": {"type": "string", "pattern": pattern}, "event": {"type": "string"}}}}


def _errors(*statuses: int) -> dict:
    return {status: {"description": _REASONS[status], "content": {"application/json": {"schema": ERROR}}}
            for status in (*statuses, 401)}


def _json(schema: dict, description: str = "success") -> dict:
    return {200: {"description": description, "content": {"application/json": {"schema": schema}}}}


def _option(name: str, **extra) -> dict:
    limit = LIMITS[name]
    bounds = {"minimum": limit.low, **({"maximum": limit.high} if limit.high is not None else {})}
    return {"type": "integer" if limit.whole else "number", **bounds, **extra}


def _names(names: list[str]) -> dict:
    """A name field: any string is taken (and an unknown one answered with a 404), these are served here."""
    return {"type": "string", "enum": names} if names else {"type": "string"}


def _body(media_type: str, properties: dict, required: list[str]) -> dict:
    return {"requestBody": {"required": True, "content": {media_type: {"schema": {
        "type": "object", "properties": properties, "required": required}}}}}


MODEL = {"type": "object", "required": ["id", "object", "kind", "precision", "task", "gates"],
         "properties": {"id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
                        "owned_by": {"type": "string"}, "kind": {"type": "string"}, "precision": {"type": "string"},
                        "device": {"type": "string"}, "task": {"enum": ["speech", "transcription"]},
                        "gates": {"enum": ["passed", "failed", "not run"]},
                        "batching": {"type": "object"}}}
VOICE = {"type": "object", "required": ["id", "name", "model"],
         "properties": {"id": {"type": "string"}, "name": {"type": "string"}, "model": {"type": "string"}}}


def health() -> dict:
    return {"responses": _json({"type": "object", "required": ["status", "models"],
                                "properties": {"status": {"enum": ["ok", "stopping"]},
                                               "models": {"type": "array", "items": {"type": "string"}}}})}


def models_list() -> dict:
    return {"responses": {**_json({"type": "object", "required": ["object", "data"], "properties": {
        "object": {"const": "list"}, "data": {"type": "array", "items": MODEL}}}), **_errors()}}


def model() -> dict:
    return {"responses": {**_json(MODEL), **_errors(404)}}


def voices_list() -> dict:
    return {"responses": {**_json({"type": "object", "required": ["voices"], "properties": {
        "voices": {"type": "array", "items": VOICE}}}), **_errors(404, 422)}}


def speech(settings, names: list[str], voices: list[str]) -> dict:
    audio = {media: {"schema": {"type": "string", "format": "binary"}} for media in sorted(set(FORMATS.values()))}
    properties = {
        "model": _names(names),
        "input": {"type": "string", "maxLength": settings.max_input_chars},
        "voice": {"anyOf": [_names(voices), {"type": "object", "required": ["id"], "properties": {"id": _names(voices)}}]},
        "response_format": {"enum": list(FORMATS)}, "stream_format": {"enum": ["audio", "sse"]},
        "speed": {"type": "number", "minimum": 0.25, "maximum": 4.0}, "instructions": {"type": "string"},
        "seed": _option("seed"), "cfg_scale": _option("cfg_scale"), "steps": _option("steps"),
        "max_frames": _option("max_frames", description="at most the server's --max-frames, which applies when it "
                              "is left out"),
        "turn_gap": _option("turn_gap"),
    }
    return {"openapi_extra": _body("application/json", properties, ["model", "input"]),
            "responses": {200: {"description": "the audio, streamed as it is decoded (or SSE events)",
                                "content": {**audio, "text/event-stream": _events("speech.audio.delta",
                                                                                  "speech.audio.done")}},
                          **_errors(400, 404, 408, 413, 422, 429)}}


def transcription(names: list[str]) -> dict:
    properties = {
        "file": {"type": "string", "format": "binary"}, "model": _names(names),
        "response_format": {"enum": ["json", "text", "srt", "vtt", "verbose_json"]}, "prompt": {"type": "string"},
        "language": {"type": "string"}, "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "stream": {"type": "boolean"}, "seed": _option("seed"), "mean_latents": {"type": "boolean"},
        "max_new_tokens": _option("max_new_tokens"),
        "repetition_guard": {"type": "boolean", "default": True,
                             "description": "cut a decoding loop back to its first occurrence and decode on"},
        "timestamp_granularities[]": {"type": "array", "items": {"enum": ["segment"]}},
    }
    text = {"schema": {"type": "string"}}
    loop = {"type": "object", "required": ["at_token", "period", "repeats", "tokens_cut"],
            "properties": {"chunk": {"type": "integer"}, "at_token": {"type": "integer"}, "period": {"type": "integer"},
                           "repeats": {"type": "number"}, "tokens_cut": {"type": "integer"}}}
    repetition = {"type": "object", "required": ["guard", "detected", "recovered", "loops"],
                  "description": "what the repetition guard found: each loop cut (at_token: the tokens kept) and "
                                 "whether decoding then ended on its own",
                  "properties": {"guard": {"type": "boolean"}, "detected": {"type": "boolean"},
                                 "recovered": {"type": "boolean"}, "loops": {"type": "array", "items": loop}}}
    return {"openapi_extra": _body("multipart/form-data", properties, ["file", "model"]),
            "responses": {200: {"description": "the transcript in the asked format, or SSE events",
                                "content": {"application/json": {"schema": {
                                    "type": "object", "required": ["text"],
                                    "properties": {"text": {"type": "string"}, "repetition": repetition}}},
                                            "text/plain": text, "text/vtt": text,
                                            "text/event-stream": _events("transcript.text.segment",
                                                                         "transcript.text.delta",
                                                                         "transcript.text.done", done=True)}},
                          **_errors(400, 404, 408, 413, 422, 429)}}


def voice_upload(names: list[str]) -> dict:
    properties = {"name": {"type": "string"}, "audio_sample": {"type": "string", "format": "binary"},
                  "model": _names(names), "consent": {"type": "string"}}
    return {"openapi_extra": _body("multipart/form-data", properties, ["name", "audio_sample"]),
            "responses": {**_json({"type": "object", "required": ["id", "name", "object", "model", "seconds"],
                                   "properties": {"object": {"const": "audio.voice"}}}),
                          **_errors(400, 404, 408, 413, 422, 507)}}
