"""The commands of `vibevoice-onnx` that are not library: writing a command's outputs, its progress lines, its
reports. Each front-end of the request layer (vibevoice_onnx.requests) translates its own format; this is the
command line's, and CLI_SPELLING is how it names a request's fields in an error."""

from __future__ import annotations

from ..requests import Spelling

_FLAGS = {"speakers": "--speaker", "text_stream": "--stream-input", "text": "the text"}

CLI_SPELLING = Spelling(lambda name: _FLAGS.get(name, "--" + name.replace("_", "-")), "--speaker {n}=VOICE")
