"""TTS text preparation as upstream's realtime demo and processor do it."""

import pytest

from vibevoice_onnx.errors import VibeVoiceError
from vibevoice_onnx.text import normalise_tts_text, text_windows


def test_strip_quotes_and_newline():
    assert normalise_tts_text("  \u201cIt\u2019s fine,\u201d she said.\n\n") == "\"It's fine,\" she said.\n"
    assert normalise_tts_text("\u2018single\u2019") == "\u2018single'\n"  # U+2018 is left as upstream leaves it


def test_empty_text_is_an_error():
    with pytest.raises(VibeVoiceError, match="empty"):
        normalise_tts_text(" \n\t ")


def test_windows_of_five():
    assert text_windows(list(range(12))) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]
    assert text_windows([]) == []
