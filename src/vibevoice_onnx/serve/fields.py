"""Request fields, checked before the first byte: a missing or out-of-range field is a 400, a value of the
wrong type a 422, each with OpenAI's error body naming the field."""

from __future__ import annotations

from ..errors import VibeVoiceError
from ..options import check
from ..requests import RequestError, Spelling
from .http import ApiError

# How the HTTP API names a request's fields: as its JSON body or form does.
HTTP_NAMES = {"text": "input", "speakers": "voice", "text_stream": "input", "hotwords": "prompt"}
HTTP_SPELLING = Spelling(lambda name: HTTP_NAMES.get(name, name),
                         "a voice for Speaker {n} to 'voice' (comma-separated, in speaker order)")

_NAMES = {str: "a string", int: "a whole number", float: "a number", bool: "true or false", dict: "an object"}


def _type_name(value) -> str:
    return {str: "a string", int: "a number", float: "a number", bool: "a boolean", list: "an array",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def take(body: dict, name: str, kind: type, default=None, required: bool = False, choices=None, max_length=None):
    """`body[name]` as `kind` (an int counts as a float; a form's strings are parsed), or `default`."""
    value = body.get(name)
    if value is None or value == "" and kind is not str:
        if required:
            raise ApiError(400, f"'{name}' is required", param=name, code="missing_field")
        return default
    value = _coerce(name, value, kind)
    if choices is not None and value not in choices:
        raise ApiError(400, f"'{name}' must be one of {', '.join(map(str, choices))}, got {value!r}", param=name,
                       code="invalid_value")
    if max_length is not None and len(value) > max_length:
        raise ApiError(400, f"'{name}' is {len(value)} characters long, over the limit of {max_length}", param=name,
                       code="too_long")
    return value


def _coerce(name: str, value, kind: type):
    if isinstance(value, str) and kind is not str:  # a multipart form sends everything as text
        parsed = {"true": True, "false": False}.get(value.lower()) if kind is bool else _number(value, kind)
        if parsed is not None:
            return parsed
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        raise ApiError(422, f"'{name}' must be {_NAMES[kind]}, got {_type_name(value)}", param=name, code="invalid_type")
    return value


def _number(text: str, kind: type):
    try:
        return int(text) if kind is int else float(text) if kind is float else None
    except ValueError:
        return None


def option(body: dict, name: str, default=None):
    """An extension option (seed, cfg_scale, steps, max_frames, ...) in the runtime's own range."""
    value = take(body, name, float)
    if value is None:
        return default
    try:
        return check(name, value)
    except VibeVoiceError as e:
        raise ApiError(400, str(e), param=name, code="invalid_value") from None


def served_model(models, name: str, task: str):
    """The model a request names (an id, or one of OpenAI's names for `task`), or a 404 naming what is served."""
    try:
        return models.get(name, task)
    except VibeVoiceError as e:
        raise ApiError(404, str(e), param="model", code="model_not_found") from None


def api_error(error: RequestError) -> ApiError:
    """A request layer's error as OpenAI's error body, its field as the body names it."""
    return ApiError(400, error.spelled(HTTP_SPELLING), param=HTTP_NAMES.get(error.field, error.field),
                    code=error.code)
