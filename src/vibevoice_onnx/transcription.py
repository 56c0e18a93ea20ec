"""VibeVoice-ASR's prompt (facts 5.3) and what its generated text becomes (5.5): segments, and the formats
`transcribe` writes. Torch-free. ASR-BitNet (docs/bitnet.md) has the same prompt with a plain-text request and
answers in prose: `build_text_prompt`, `parse_prose`; a kind's record names them (`prompt_builder`,
`transcript_parser`).

The prompt is upstream's processor's: its own chat template (no default system turn, no assistant prefix:
the model writes `<|im_start|>assistant\\n` itself), the system turn and the user turn encoded separately and
joined, one `<|box_start|>` placeholder per 3200 samples (rounded up) between the audio start and end
tokens, and the duration of the normalised, unpadded audio with two decimals.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass

from .errors import VibeVoiceError

SYSTEM_PROMPT = "You are a helpful assistant that transcribes audio input into text output in JSON format."
AUDIO_START, AUDIO_END, AUDIO_PAD = "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>"
AUDIO_TOKEN_IDS = {AUDIO_START: 151646, AUDIO_END: 151647, AUDIO_PAD: 151648}  # Qwen2.5's ids (facts 5.3)
STOP_TOKENS = ("<|endoftext|>", "<|im_end|>")
KEYS = "Start time, End time, Speaker ID, Content"
SAMPLE_RATE, SAMPLES_PER_TOKEN = 24000, 3200
FORMATS = ("json", "srt", "vtt", "txt", "raw")


@dataclass(frozen=True)
class AsrPrompt:
    ids: list[int]
    audio_positions: list[int]  # the placeholder positions, in order: audio token i goes to audio_positions[i]
    seconds: float


def request_text(seconds: float, hotwords: str | None) -> str:
    if hotwords and hotwords.strip():
        return (f"This is a {seconds:.2f} seconds audio, with extra info: {hotwords.strip()}\n\n"
                f"Please transcribe it with these keys: {KEYS}")
    return f"This is a {seconds:.2f} seconds audio, please transcribe it with these keys: {KEYS}"


def audio_tokens(samples: int) -> int:
    return math.ceil(samples / SAMPLES_PER_TOKEN)


def build_asr_prompt(tokenizer, samples: int, hotwords: str | None = None) -> AsrPrompt:
    """The prompt for `samples` normalised 24 kHz samples; `tokenizer` is a `tokenizers.Tokenizer`."""
    return _prompt(tokenizer, samples, request_text, hotwords)


def text_request(seconds: float, hotwords: str | None) -> str:
    """ASR-BitNet's plain-text request (VibeASR.cpp's prompt_builder.h, format "text")."""
    if hotwords and hotwords.strip():
        return f"This is a {seconds:.2f} seconds audio, with extra info: {hotwords.strip()}\n\nPlease transcribe it."
    return f"This is a {seconds:.2f} seconds audio, please transcribe it."


def build_text_prompt(tokenizer, samples: int, hotwords: str | None = None) -> AsrPrompt:
    """ASR-BitNet's prompt: the chat frame and system prompt of build_asr_prompt (JSON named there too), the
    request for plain text. Its released tokenizer lacks the three audio tokens: their ids are inserted as such."""
    return _prompt(tokenizer, samples, text_request, hotwords)


def _prompt(tokenizer, samples: int, request, hotwords: str | None) -> AsrPrompt:
    if samples <= 0:
        raise VibeVoiceError("the audio holds no samples")
    seconds = samples / SAMPLE_RATE
    start, pad, end = (_token_id(tokenizer, name) for name in (AUDIO_START, AUDIO_PAD, AUDIO_END))
    ids = [*_encode(tokenizer, f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n"),
           *_encode(tokenizer, "<|im_start|>user\n"), start, *[pad] * audio_tokens(samples), end,
           *_encode(tokenizer, f"\n{request(seconds, hotwords)}<|im_end|>\n")]
    return AsrPrompt(ids, [i for i, token in enumerate(ids) if token == pad], seconds)


def _token_id(tokenizer, name: str) -> int:
    """The audio token's id in the tokenizer, or its Qwen2.5 id where the tokenizer does not know it."""
    found = tokenizer.token_to_id(name)
    return AUDIO_TOKEN_IDS[name] if found is None else found


def prompt_builder(kind: str):
    """The kind's prompt builder, (tokenizer, samples, hotwords) -> AsrPrompt, as its record names it."""
    from .families import family, load

    return load(family(kind).prompt)


def transcript_parser(kind: str):
    """The kind's transcript parser, (generated text) -> (segments, note), as its record names it."""
    from .families import family, load

    return load(family(kind).transcript)


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


@dataclass(frozen=True)
class Segment:
    start: float | None
    end: float | None
    speaker: int | str | None
    text: str


# Upstream's key names (long, as its prompt asks for them) and the short ones its training targets use.
_KEYS = {"Start time": "start", "Start": "start", "End time": "end", "End": "end",
         "Speaker ID": "speaker", "Speaker": "speaker", "Content": "text"}


def parse_transcript(text: str) -> tuple[list[Segment], str | None]:
    """The segments in the model's output, and a note when something was off (None when it parsed whole).

    The first JSON array (or object) in the text counts, as upstream's post-processing has it; a truncated
    array (generation stopped by the token limit) keeps its complete segments. Text that holds no JSON
    transcript raises VibeVoiceError."""
    body = text.strip()
    if body.startswith("assistant"):
        body = body[len("assistant"):]
    fenced = re.search(r"```json(.*?)(```|$)", body, re.DOTALL)
    if fenced:
        body = fenced.group(1)
    starts = [i for i in (body.find("["), body.find("{")) if i >= 0]
    if not starts:
        raise VibeVoiceError("the model's output holds no JSON transcript")
    body, note = body[min(starts):], None
    try:
        value, _ = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError:
        value = _complete_elements(body)
        if not value:
            raise VibeVoiceError("the model's output is not a JSON transcript (not even one complete segment)") from None
        note = f"the output was cut off; kept its {len(value)} complete segment(s)"
    items = value if isinstance(value, list) else [value]
    segments = [_segment(item) for item in items if isinstance(item, dict) and _KEYS.keys() & item.keys()]
    if len(segments) < len(items):
        note = (note + "; " if note else "") + f"skipped {len(items) - len(segments)} item(s) that are not segments"
    return segments, note


def parse_prose(text: str) -> tuple[list[Segment], str | None]:
    """A plain-text transcript (ASR-BitNet): one segment of the whole text, without times or speaker."""
    body = text.strip()
    if body.startswith("assistant\n"):
        body = body[len("assistant\n"):].strip()
    return ([Segment(None, None, None, body)], None) if body else ([], "the model's output is empty")


def _complete_elements(body: str) -> list:
    """The complete elements of a JSON array that lacks its end."""
    if not body.startswith("["):
        return []
    decoder, elements, position = json.JSONDecoder(), [], 1
    separator = re.compile(r"[\s,]*")
    position = separator.match(body, position).end()
    while position < len(body):
        try:
            element, position = decoder.raw_decode(body, position)
        except json.JSONDecodeError:
            break
        elements.append(element)
        position = separator.match(body, position).end()
    return elements


def _segment(item: dict) -> Segment:
    fields = {field: item[key] for key, field in _KEYS.items() if key in item}
    return Segment(_seconds(fields.get("start")), _seconds(fields.get("end")), fields.get("speaker"),
                   str(fields.get("text", "")).strip())


def _seconds(value) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def render(fmt: str, segments: list[Segment], text: str, raw: str, repetition: dict | None = None) -> str:
    """`segments` as `fmt`: json (segments and the text, and `repetition`, the repetition guard's report, where
    given), srt, vtt (speaker labels), txt, raw (the generated text with its special tokens, exactly as decoded)."""
    if fmt == "json":
        body = {"segments": [asdict(s) for s in segments], "text": text}
        if repetition is not None:
            body["repetition"] = repetition
        return json.dumps(body, ensure_ascii=False, indent=2) + "\n"
    if fmt == "raw":
        return raw
    if fmt == "txt":
        return "".join(f"{_label(s)}{s.text}\n" for s in segments)
    if fmt in ("srt", "vtt"):
        blocks = []
        for index, s in enumerate(segments, start=1):
            start, end = s.start or 0.0, s.end if s.end is not None else (s.start or 0.0)
            stamp = f"{_timestamp(start, fmt)} --> {_timestamp(end, fmt)}"
            blocks.append(f"{index}\n{stamp}\n{_label(s)}{s.text}\n" if fmt == "srt" else
                          f"{stamp}\n{'<v ' + _speaker(s) + '>' if s.speaker is not None else ''}{s.text}\n")
        return ("WEBVTT\n\n" if fmt == "vtt" else "") + "\n".join(blocks)
    raise VibeVoiceError(f"unknown format '{fmt}' (available: {', '.join(FORMATS)})")


def _speaker(segment: Segment) -> str:
    return f"Speaker {segment.speaker}"


def _label(segment: Segment) -> str:
    return f"{_speaker(segment)}: " if segment.speaker is not None else ""


def _timestamp(seconds: float, fmt: str) -> str:
    millis = round(max(seconds, 0.0) * 1000)
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{',' if fmt == 'srt' else '.'}{millis:03d}"
