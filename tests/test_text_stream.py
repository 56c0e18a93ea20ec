"""Text streamed in while audio streams out, and realtime dialogue: both must give exactly what the whole
text (or each turn alone) gives."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from vibevoice_onnx.checkpoints.tokenizer import build_tokenizer
from vibevoice_onnx.errors import VibeVoiceError
from vibevoice_onnx.text import TextCancelled, TextFeed, encode_tts_text, text_windows

TEXTS = [
    "Hello there, how are you today?",
    "  \u201cIt\u2019s fine,\u201d she said.  Then: 42 apples\u2014no, 43!\n\nNew paragraph...\tTabbed  double  spaces ",
    "e-mail me at bob@example.com or call 555-0199; it's 3.14159, isn't it?",
    "Caf\u00e9 na\u0131\u0308ve r\u00e9sum\u00e9 \u00fcber \u65e5\u672c\u8a9e \U0001f600 ok",
    "Line one.\nLine two,\r\nline three;\n  indented (parenthesised) [bracketed] {braced}.",
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer("tiny")[0]


def pieces(text: str, how: str, seed: int = 0) -> list[str]:
    if how == "whole":
        return [text]
    if how == "chars":
        return list(text)
    if how == "spaces":  # words with the space before them, as LLM tokens come
        out, word = [], ""
        for ch in text:
            if ch.isspace() and word and not word.isspace():
                out.append(word)
                word = ""
            word += ch
        return out + [word]
    rng = random.Random(seed)  # random cuts, inside words too
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, len(text) // 3)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def streamed_windows(tokenizer, parts: list[str]) -> list[list[int]]:
    feed = TextFeed(tokenizer)
    for part in parts:
        feed.feed(part)
    feed.finish()
    return list(feed)


@pytest.mark.parametrize("how", ["whole", "chars", "spaces", "random"])
@pytest.mark.parametrize("text", TEXTS)
def test_any_split_gives_the_whole_texts_windows(tokenizer, text, how):
    expected = text_windows(encode_tts_text(tokenizer, text))
    for seed in range(3 if how == "random" else 1):
        assert streamed_windows(tokenizer, pieces(text, how, seed)) == expected


def test_windows_come_out_as_soon_as_they_are_settled(tokenizer):
    """Five settled tokens make a window before finish(); the last, unfinished word is held back."""
    feed = TextFeed(tokenizer)
    windows = iter(feed)
    feed.feed("one two three four five six seven eight nine te")
    first = next(windows)
    whole = encode_tts_text(tokenizer, "one two three four five six seven eight nine ten")
    assert first == whole[:5]
    held = threading.Event()

    def take():
        next(windows)
        held.set()

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    if len(whole) >= 10 and feed._ids[5:10] != whole[5:10]:  # fewer than 5 settled ids left: it must wait
        assert not held.wait(0.2)
    feed.feed("n")
    feed.finish()
    assert held.wait(5)
    taker.join(5)


def test_closing_a_waiting_stream_raises_in_the_reader(tokenizer):
    feed = TextFeed(tokenizer)
    errors = []

    def read():
        try:
            list(feed)
        except TextCancelled as e:
            errors.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    feed.feed("a few words and")
    time.sleep(0.1)
    feed.close()
    reader.join(5)
    assert not reader.is_alive() and len(errors) == 1
    assert str(errors[0]) == "the streamed text was closed before it was finished"


def test_bad_pieces_are_refused(tokenizer):
    feed = TextFeed(tokenizer, max_chars=10)
    with pytest.raises(VibeVoiceError, match="^text pieces must be strings, got bytes$"):
        feed.feed(b"bytes")
    with pytest.raises(VibeVoiceError, match="^the text is longer than the limit of 10 characters$"):
        feed.feed("x" * 11)
    at_the_limit = TextFeed(tokenizer, max_chars=10)
    at_the_limit.feed("x" * 4)
    at_the_limit.feed("y" * 6)  # ten characters in all: kept
    assert at_the_limit.text == "xxxxyyyyyy"
    feed.feed("  ")
    with pytest.raises(VibeVoiceError, match="empty"):
        feed.finish()
    done = TextFeed(tokenizer)
    done.feed("hi")
    done.finish()
    with pytest.raises(VibeVoiceError, match="already finished"):
        done.feed("more")


@pytest.fixture(scope="module")
def tts(tiny_bundle):
    from vibevoice_onnx.runtime.realtime import RealtimeTTS

    return RealtimeTTS(tiny_bundle)


TEXT = "Streaming text, one piece at a time: it should sound exactly like the whole text said at once."


@pytest.mark.parametrize("how", ["chars", "spaces", "random"])
def test_streamed_text_gives_the_whole_texts_audio(tts, how):
    """An LLM's thread feeds while the player's thread iterates; audio equals stream(whole), sample for sample."""
    whole = tts.stream(TEXT, "synthetic", seed=11, max_frames=40)
    expected = np.concatenate([c.samples for c in whole])
    speech = tts.text_stream(voice="synthetic", seed=11, max_frames=40)

    def produce():
        for part in pieces(TEXT, how, seed=5):
            speech.feed(part)
            time.sleep(0.0005)
        speech.finish()

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    got = np.concatenate([c.samples for c in speech])
    producer.join(10)
    assert speech.result.frames == whole.result.frames
    assert np.array_equal(got, expected)


def test_the_decoder_flushes_each_speech_window(tts):
    """While the loop waits for the next text window, the frames of the last window are already out."""
    speech = tts.text_stream(voice="synthetic", seed=3, max_frames=30)
    speech.feed("one two three four five six seven")  # one window settled; 'seven' held back
    chunks = iter(speech)
    got = [next(chunks) for _ in range(6)]  # the first window's six frames, without more text
    assert [c.frame for c in got] == list(range(6))
    speech.finish()
    rest = list(chunks)
    assert len(rest) == 24


def test_dialogue_turns_equal_each_turn_spoken_alone(tts):
    script = "Speaker 1: Hello there, how are you?\nSpeaker 2: Fine, thanks.\nSpeaker 1: Good to hear."
    dialogue = tts.dialogue(script, {1: "synthetic", 2: "synthetic"}, seed=20, max_frames=9, turn_gap=0.25)
    audio = np.concatenate([c.samples for c in dialogue])
    parts, gap = [], np.zeros(6000, np.float32)
    for k, text in enumerate(["Hello there, how are you?", "Fine, thanks.", "Good to hear."]):
        alone, _ = tts.create(text, "synthetic", seed=20 + k, max_frames=9)
        parts += [gap] * (k > 0) + [alone]
    assert [turn[2] for turn in dialogue.turns] == [20, 21, 22]
    assert np.array_equal(audio, np.concatenate(parts))
    assert dialogue.result.frames == 27


def test_dialogue_refuses_missing_voices(tts):
    with pytest.raises(VibeVoiceError, match="Speaker 2 speaks"):
        tts.dialogue("Speaker 1: Hi.\nSpeaker 2: Hey.", {1: "synthetic"}, seed=1)
    with pytest.raises(VibeVoiceError, match="no voice 'nobody'"):
        tts.dialogue("Speaker 1: Hi.", {1: "nobody"}, seed=1)


def test_speak_stream_input_reads_stdin_as_it_arrives_and_gives_the_whole_texts_audio(tiny_bundle):
    """`llm ... | vibevoice-onnx speak B --stream-input --raw`: standard input arriving in pieces (cut inside
    words and inside a multi-byte character) gives the bytes `speak TEXT --raw` gives."""
    import subprocess
    import sys

    text = "Caf\u00e9 \u00fcber alles: " + TEXT  # within the frames spoken
    common = [sys.executable, "-m", "vibevoice_onnx.cli", "speak", str(tiny_bundle), "--raw", "--seed", "11",
              "--max-frames", "40", "--threads", "1"]
    whole = subprocess.run([*common[:5], text, *common[5:]], capture_output=True, timeout=120)
    assert whole.returncode == 0, whole.stderr.decode()
    process = subprocess.Popen([*common, "--stream-input"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    started = process.stderr.readline().decode()  # the bundle is loaded and standard input is being read
    assert "text from standard input as it arrives" in started
    data = text.encode()
    inside = [data.index(ch.encode()) + 1 for ch in "\u00e9\u00fc"]  # between the two bytes of each
    cuts = sorted({*range(0, len(data), 4), *inside, len(data)})
    for start, end in zip(cuts, cuts[1:]):
        process.stdin.write(data[start:end])
        process.stdin.flush()
        time.sleep(0.02)  # each piece read on its own
    out, err = process.communicate(timeout=120)  # closes standard input: the end of the text
    assert process.returncode == 0, err.decode()
    assert len(out) > 0 and out == whole.stdout


def test_a_window_is_handed_out_as_soon_as_its_five_tokens_are_settled(tokenizer):
    """Whole words of five tokens followed by the start of another: the five are settled (the last one ends right
    where the whitespace before the unfinished word starts), so the first window goes to the loop at once, before
    any more text or the end of it. The wait only catches a reader that is never given the window."""
    words = "Hello there"
    settled = tokenizer.encode(words, add_special_tokens=False).ids
    assert len(settled) == 5  # in this tokenizer: Hel lo Ġthe r e
    feed = TextFeed(tokenizer)
    windows, handed = [], threading.Event()

    def read():
        for window in feed:
            windows.append(window)
            handed.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    feed.feed(words + " si")
    assert handed.wait(30), "the settled window was held back"
    assert windows == [settled]
    feed.feed("x")
    feed.finish()
    reader.join(30)
    assert [i for window in windows for i in window] == encode_tts_text(tokenizer, words + " six")
