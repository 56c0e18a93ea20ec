"""1.5B scripts: upstream's line format, its 0-based shift, and the voice assignment rules."""

import pytest

from vibevoice_onnx.errors import VibeVoiceError
from vibevoice_onnx.script import assign_voices, parse_script


def test_labelled_lines_continuations_and_the_one_based_shift():
    script = parse_script("Speaker 1: Hello there.\n  and welcome!\n\nspeaker 2 :Thanks.\nSpeaker 1: Bye.")
    assert script.lines == ((1, "Hello there. and welcome!"), (2, "Thanks."), (1, "Bye."))
    assert script.speakers == [1, 2]
    assert script.prompt_lines() == [(0, " Hello there. and welcome!"), (1, " Thanks."), (0, " Bye.")]


def test_zero_based_scripts_keep_their_numbers():
    assert parse_script("Speaker 0: A.\nSpeaker 1: B.").prompt_lines() == [(0, " A."), (1, " B.")]


def test_plain_text_is_one_speaker_line_by_line():
    script = parse_script("First line.\n\nSecond line.\n")
    assert script.lines == ((1, "First line."), (1, "Second line."))
    assert script.prompt_lines() == [(0, " First line."), (0, " Second line.")]


@pytest.mark.parametrize("text, message", [
    ("", "the script has nothing to speak"),
    ("Speaker 1:   \nSpeaker 2:", "the script has nothing to speak"),
    ("An intro.\nSpeaker 1: Hi.", "script line 1 has no 'Speaker N:' label and no labelled line before it"),
    ("Speaker 1: A.\nSpeaker 3: C.", "Speaker 2 never speaks"),
    ("Speaker 2: B.\nSpeaker 3: C.", "Speaker 1 never speaks"),
])
def test_scripts_upstream_would_misread_are_refused(text, message):
    with pytest.raises(VibeVoiceError, match=message):
        parse_script(text)


def test_voices_are_assigned_in_prompt_order():
    script = parse_script("Speaker 2: B.\nSpeaker 1: A.")
    assert assign_voices(script, {1: "alice", 2: "bob"}) == ["alice", "bob"]
    assert assign_voices(parse_script("Just me."), {None: "alice"}) == ["alice"]
    assert assign_voices(parse_script("Speaker 1: Just me."), {1: "alice"}) == ["alice"]
