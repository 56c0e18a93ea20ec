"""Multi-speaker scripts for VibeVoice-1.5B, and the prompt upstream's processor builds from them (facts 3.3).

A script is lines `Speaker N: text`. Lines without a label continue the line above (upstream's demo joins
them with a space); a text without any label is spoken by one speaker, each non-empty line as its own line
(upstream's processor for plain .txt files). Speaker numbers that all start at 1 are shifted to 0-based, as
upstream does; the prompt gives voice i to "Speaker i", so numbers must run without gaps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import VibeVoiceError
from .text import NOTHING_TO_SPEAK, speakable, special_ids

SYSTEM_PROMPT = (
    " Transform the text provided by various speakers into speech output, utilizing the distinct voice of each "
    "respective speaker.\n"
)
SPEECH_START, SPEECH_END, SPEECH_PAD = "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>"
_LABEL = re.compile(r"^Speaker\s+(\d+)\s*:\s*(.*)$", re.IGNORECASE)


@dataclass(frozen=True)
class Script:
    lines: tuple[tuple[int, str], ...]  # (speaker number as written, text) per line
    offset: int  # subtracted from the written numbers to get upstream's 0-based speaker ids

    @property
    def speakers(self) -> list[int]:
        """The speaker numbers as written, in prompt order (0-based id i is speakers[i])."""
        return sorted({number for number, _ in self.lines})

    def prompt_lines(self) -> list[tuple[int, str]]:
        """(0-based speaker id, text with upstream's leading space) per line."""
        return [(number - self.offset, " " + text) for number, text in self.lines]


def has_labels(text: str) -> bool:
    """Whether a text is a script of `Speaker N:` lines (rather than plain text)."""
    return any(_LABEL.match(line.strip()) for line in text.splitlines())


def parse_script(text: str) -> Script:
    text = speakable(text)
    raw_lines = text.splitlines()
    plain = not has_labels(text)
    lines: list[list] = []
    for index, raw in enumerate(raw_lines, start=1):
        line = raw.strip()
        if not line:
            continue
        match = _LABEL.match(line)
        if match:
            lines.append([int(match.group(1)), match.group(2).strip()])
        elif plain:
            lines.append([1, line])  # plain text: one speaker, each line its own
        elif lines:
            lines[-1][1] = (lines[-1][1] + " " + line).strip()  # a continuation of the line above
        else:
            raise VibeVoiceError(f"script line {index} has no 'Speaker N:' label and no labelled line before it")
    lines = [(number, words) for number, words in lines if words]
    if not lines:
        raise VibeVoiceError(f"the script {NOTHING_TO_SPEAK}")
    numbers = sorted({number for number, _ in lines})
    offset = 1 if numbers[0] > 0 else 0
    missing = sorted(set(range(numbers[0], numbers[-1] + 1)) - set(numbers))
    if missing or numbers[0] > 1:
        gap = missing[0] if missing else numbers[0] - 1
        raise VibeVoiceError(
            f"the script's speakers are {', '.join(map(str, numbers))}, but Speaker {gap} never speaks: upstream's prompt "
            "gives the voices to speakers numbered without gaps from 1 (or 0), so renumber them"
        )
    return Script(tuple(lines), offset)


def assign_voices(script: Script, given: dict[int | None, str]) -> list[str]:
    """The voice of each speaker in prompt order, from {number as written: voice}; None keys a lone speaker."""
    speakers = script.speakers
    if None in given:
        if len(given) > 1 or len(speakers) > 1:
            raise VibeVoiceError(
                f"the script has speakers {', '.join(map(str, speakers))}: give each its voice as --speaker N=VOICE"
            )
        return [given[None]]
    unused = sorted(set(given) - set(speakers))
    if unused:
        raise VibeVoiceError(f"a voice is given for Speaker {unused[0]}, who does not speak in the script "
                             f"(speakers: {', '.join(map(str, speakers))})")
    without = [n for n in speakers if n not in given]
    if without:
        raise VibeVoiceError(f"Speaker {without[0]} speaks in the script but has no voice: add --speaker {without[0]}=VOICE")
    return [given[n] for n in speakers]


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    voice_positions: list[int]  # indices of the `<|vision_pad|>` slots, voice after voice
    special: dict[str, int]  # speech start / end / pad ids


def build_prompt(tokenizer, script: Script, voice_frames: list[int]) -> Prompt:
    """Upstream's 1.5B prompt: system text, one `<|vision_pad|>` per voice frame, the script, speech start."""
    names = (SPEECH_START, SPEECH_END, SPEECH_PAD)
    special = dict(zip(names, special_ids(tokenizer, names)))

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    ids = encode(SYSTEM_PROMPT) + encode(" Voice input:\n")
    positions = []
    for speaker, frames in enumerate(voice_frames):
        ids += encode(f" Speaker {speaker}:") + [special[SPEECH_START]]
        positions += range(len(ids), len(ids) + frames)
        ids += [special[SPEECH_PAD]] * frames + [special[SPEECH_END]] + encode("\n")
    ids += encode(" Text input:\n")
    for speaker, text in script.prompt_lines():
        ids += encode(f" Speaker {speaker}:{text}\n")
    ids += encode(" Speech output:\n") + [special[SPEECH_START]]
    return Prompt(ids, positions, special)
