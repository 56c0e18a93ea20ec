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


@pytest.mark.parametrize("text, settled", [("", 0), ("word", 0), ("word  ", 0), ("  b", 0), ("a b", 1),
                                           ("ab    cd", 2), ("one two three ", 7), ("a\n\n b", 1),
                                           ("  b ", 0)])
def test_a_streamed_text_is_settled_up_to_its_last_whitespace_run_with_text_after_it(text, settled):
    """Where TextFeed may hand out tokens: before the whitespace run that precedes the last (unfinished) word."""
    from vibevoice_onnx.text import _settled_length

    assert _settled_length(text) == settled


def test_text_is_encoded_without_the_tokenizers_special_tokens_whole_or_streamed():
    """A tokenizer whose template adds a token (a BOS) still encodes a TTS text as its words alone, the whole text
    and a streamed one alike: the model's prompt places its special tokens itself."""
    from tokenizers.processors import TemplateProcessing

    from vibevoice_onnx.checkpoints.tokenizer import build_tokenizer
    from vibevoice_onnx.text import TextFeed, encode_tts_text

    plain, templated = build_tokenizer("tiny")[0], build_tokenizer("tiny")[0]
    bos = templated.token_to_id("<|endoftext|>")
    templated.post_processor = TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)])
    text = "Hello there, my friend. How are you today?"
    assert templated.encode(text).ids[0] == bos  # the template adds it where asked to
    words = encode_tts_text(plain, text)
    assert encode_tts_text(templated, text) == words and bos not in words
    feed = TextFeed(templated)
    for piece in text.split(" "):
        feed.feed(piece + " ")
    feed.finish()
    assert [i for window in feed for i in window] == words


def test_a_tokenizer_without_the_special_tokens_is_named_with_what_it_lacks():
    from vibevoice_onnx.checkpoints.tokenizer import build_tokenizer
    from vibevoice_onnx.text import special_ids

    tokenizer = build_tokenizer("tiny")[0]
    assert special_ids(tokenizer, ("<|endoftext|>",)) == [tokenizer.token_to_id("<|endoftext|>")]
    with pytest.raises(VibeVoiceError) as refused:
        special_ids(tokenizer, ("<|endoftext|>", "<|nope|>"))
    assert str(refused.value) == "the tokenizer has no <|nope|> token, so it is not a Qwen2.5 tokenizer"
    with pytest.raises(VibeVoiceError, match=r"^the tokenizer has no <\|a\|>, <\|b\|>, for the test$"):
        special_ids(tokenizer, ("<|a|>", "<|b|>"), why="for the test")
