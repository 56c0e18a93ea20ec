"""Text input for TTS, as upstream's realtime demo and processor prepare it (torch-free)."""

from __future__ import annotations

from pathlib import Path

from .errors import VibeVoiceError

TEXT_WINDOW = 5  # text tokens fed per window
SPEECH_WINDOW = 6  # speech frames generated after each text window

# The demo replaces these typographic quotes (U+2019, U+201C, U+201D) before tokenising; U+2018 is left alone.
_QUOTES = {"\u2019": "'", "\u201c": '"', "\u201d": '"'}


def normalise_tts_text(text: str) -> str:
    """strip, replace the demo's quotes, then `text.strip() + "\\n"` as the processor does."""
    text = text.strip()
    for old, new in _QUOTES.items():
        text = text.replace(old, new)
    text = text.strip()
    if not text:
        raise VibeVoiceError("the text is empty: give some text to speak")
    return text + "\n"


def load_tokenizer(path: Path):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
        raise VibeVoiceError(f"{path}: not a valid tokenizer.json ({e})") from None


def encode_tts_text(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(normalise_tts_text(text), add_special_tokens=False).ids


def text_windows(ids: list[int]) -> list[list[int]]:
    return [ids[i : i + TEXT_WINDOW] for i in range(0, len(ids), TEXT_WINDOW)]
