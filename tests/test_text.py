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


def test_every_control_character_inside_a_text_is_dropped_and_nothing_else():
    """The whole C0 and C1 ranges (and DEL) but newline and tab, inside a text where strip() cannot reach them: a
    C1 control (say U+0091, which some Windows pastes carry) is never spoken, while a character just past the range
    (U+00A0, a no-break space) is left to the tokenizer."""
    from vibevoice_onnx.text import speakable

    controls = [c for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if chr(c) not in "\n\t"]
    for c in controls:
        assert speakable(f"a{chr(c)}b") == "ab", hex(c)
        assert normalise_tts_text(f"one{chr(c)} two") == "one two\n", hex(c)
    for kept in ("\n", "\t", "\u00a0", "\u00ff", "\u2028"):
        assert speakable(f"a{kept}b") == f"a{kept}b", hex(ord(kept))
