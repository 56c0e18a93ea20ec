"""Text input for TTS, as upstream's realtime demo and processor prepare it (torch-free)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from .errors import VibeVoiceError

TEXT_WINDOW = 5  # text tokens fed per window
SPEECH_WINDOW = 6  # speech frames generated after each text window

# The demo replaces these typographic quotes (U+2019, U+201C, U+201D) before tokenising; U+2018 is left alone.
_QUOTES = {"\u2019": "'", "\u201c": '"', "\u201d": '"'}
# Control characters (Unicode's Cc) other than newline and tab: nothing a voice can say, removed from every text.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
NOTHING_TO_SPEAK = "has nothing to speak (it is empty, or only whitespace and control characters)"


def speakable(text: str) -> str:
    """The text rule every input goes through: control characters other than newline and tab removed (each
    character on its own, so a text fed in pieces is cleaned as the whole would be)."""
    return _CONTROLS.sub("", text)


def normalise_tts_text(text: str) -> str:
    """Control characters removed (`speakable`), then as upstream: strip, replace the demo's quotes, then
    `text.strip() + "\\n"` as the processor does."""
    text = speakable(text).strip()
    for old, new in _QUOTES.items():
        text = text.replace(old, new)
    text = text.strip()
    if not text:
        raise VibeVoiceError(f"the text {NOTHING_TO_SPEAK}")
    return text + "\n"


def load_tokenizer(path: Path):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
        raise VibeVoiceError(f"{path}: not a valid tokenizer.json ({e})") from None


def special_ids(tokenizer, names: tuple[str, ...], why: str = "so it is not a Qwen2.5 tokenizer") -> list[int]:
    """The ids of these special tokens, in order; a sentence naming those the tokenizer lacks, and `why` it matters."""
    ids = [tokenizer.token_to_id(name) for name in names]
    missing = [name for name, i in zip(names, ids) if i is None]
    if missing:
        raise VibeVoiceError(f"the tokenizer has no {', '.join(missing)}{' token' * (len(missing) == 1)}, {why}")
    return ids


def encode_tts_text(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(normalise_tts_text(text), add_special_tokens=False).ids


_SENTENCE_END = re.compile(r"(?<=[.!?\u2026;:])\s+|\n+")


def split_text(text: str, cost: Callable[[str], int], budget: int) -> list[str]:
    """`text` in pieces of at most `budget` by `cost` (tokens), cut at sentence ends where it can, else at
    word boundaries (a sentence longer than the budget), packed greedily so the pieces are as few as the
    budget allows. A piece's cost is summed from its parts (a joined part counted with its leading space),
    which a BPE tokenizer keeps within a token or two of the whole's."""
    pieces: list[str] = []
    used = 0
    for sentence in (s.strip() for s in _SENTENCE_END.split(text.strip())):
        if not sentence:
            continue
        for unit in [sentence] if cost(sentence) <= budget else sentence.split():
            joined = used + cost(" " + unit)
            if pieces and joined <= budget:
                pieces[-1], used = f"{pieces[-1]} {unit}", joined
            else:
                pieces.append(unit)
                used = cost(unit)
    return pieces


def text_windows(ids: list[int]) -> list[list[int]]:
    return [ids[i : i + TEXT_WINDOW] for i in range(0, len(ids), TEXT_WINDOW)]


class TextCancelled(VibeVoiceError):
    """A streamed text was closed before it was finished (the client went away)."""


class TextFeed:
    """Text that arrives in pieces (an LLM's tokens), handed out as the 5-token windows the loop runs.

    Any split of a text into pieces gives exactly the ids of the whole text (`encode_tts_text`): a token is
    handed out only when it ends before the start of the last whitespace run that has text after it. Up to
    there the text's split into pre-tokens (Qwen's regex: words carry their leading space, punctuation its
    trailing newlines, a whitespace run gives its last space to the word after it) is settled whatever comes
    next, and byte-level BPE never merges across pre-tokens. The rest (the last, perhaps unfinished word)
    waits for more text or `finish()`, which strips and ends the text as `normalise_tts_text` does.

    `feed`, `finish` and `close` may be called from one thread while another iterates over the windows."""

    def __init__(self, tokenizer, max_chars: int | None = None):
        import threading

        self.tokenizer, self.max_chars = tokenizer, max_chars
        self._ready = threading.Condition()
        self._text, self._settled_at, self._ids, self._handed = "", 0, [], 0
        self.finished = self.closed = False

    @property
    def text(self) -> str:
        return self._text

    def feed(self, piece: str) -> None:
        if not isinstance(piece, str):
            raise VibeVoiceError(f"text pieces must be strings, got {type(piece).__name__}")
        with self._ready:
            if self.finished or self.closed:
                raise VibeVoiceError("this text is already finished: no more pieces can be added")
            if self.max_chars is not None and len(self._text) + len(piece) > self.max_chars:
                raise VibeVoiceError(f"the text is longer than the limit of {self.max_chars} characters")
            self._text += speakable(piece)
            self._settle()
            self._ready.notify_all()

    def finish(self) -> None:
        with self._ready:
            if self.finished:
                return
            whole = encode_tts_text(self.tokenizer, self._text)  # raises on an empty text
            self._extend(whole)
            self.finished = True
            self._ready.notify_all()

    def close(self) -> None:
        """Give up: a loop waiting for text raises TextCancelled."""
        with self._ready:
            self.closed = True
            self._ready.notify_all()

    def _settle(self) -> None:
        text = _prepared(self._text)
        cut = _settled_length(text)
        if cut <= self._settled_at:
            return
        self._settled_at = cut
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        self._extend([i for i, (_, end) in zip(encoding.ids, encoding.offsets) if end <= cut])

    def _extend(self, ids: list[int]) -> None:
        if ids[: len(self._ids)] != self._ids:  # the argument above guarantees it; a tokenizer that broke it is caught
            raise VibeVoiceError("streamed text tokenised differently from the whole text (a tokenizer this "
                                 "streaming rule does not cover)")
        self._ids = list(ids)

    def __iter__(self):
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self.closed or self.finished or len(self._ids) - self._handed >= TEXT_WINDOW)
                if self.closed:
                    raise TextCancelled("the streamed text was closed before it was finished")
                window = self._ids[self._handed : self._handed + TEXT_WINDOW]
                self._handed += len(window)
            if not window:
                return
            yield window


def _prepared(text: str) -> str:
    """The streamed text as normalise_tts_text prepares the whole one, but for its (unknown) end."""
    for old, new in _QUOTES.items():
        text = text.replace(old, new)
    return text.lstrip()


def _settled_length(text: str) -> int:
    """Where the last whitespace run that has text after it starts (0 if there is none)."""
    end = len(text.rstrip())
    last_space = max((i for i in range(end) if text[i].isspace()), default=-1)
    if last_space < 0:
        return 0
    start = last_space
    while start > 0 and text[start - 1].isspace():
        start -= 1
    return start
