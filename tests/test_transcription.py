"""VibeVoice-ASR's prompt and output handling (torch-free): the prompt as facts 5.3 lays it out, the output
parsed as upstream's post-processing and transformers' parser read it, and the formats `transcribe` writes."""

import json
import types

import pytest

from vibevoice_onnx.checkpoints.tokenizer import build_tokenizer
from vibevoice_onnx.errors import VibeVoiceError
from vibevoice_onnx.transcription import Segment, build_asr_prompt, parse_transcript, render


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer("tiny")[0]


def decoded(tokenizer, ids):
    return tokenizer.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("samples, tokens, seconds", [(1, 1, "0.00"), (3200, 1, "0.13"), (3201, 2, "0.13"),
                                                      (181_332, 57, "7.56"), (24000 * 61, 458, "61.00")])
def test_prompt_is_upstreams_layout(tokenizer, samples, tokens, seconds):
    prompt = build_asr_prompt(tokenizer, samples)
    expected = ("<|im_start|>system\nYou are a helpful assistant that transcribes audio input into text output in JSON "
                "format.<|im_end|>\n<|im_start|>user\n<|object_ref_start|>" + "<|box_start|>" * tokens +
                f"<|object_ref_end|>\nThis is a {seconds} seconds audio, please transcribe it with these keys: "
                "Start time, End time, Speaker ID, Content<|im_end|>\n")
    assert decoded(tokenizer, prompt.ids) == expected  # no default system turn, no assistant prefix
    start = tokenizer.token_to_id("<|object_ref_start|>")
    assert prompt.audio_positions == list(range(prompt.ids.index(start) + 1, prompt.ids.index(start) + 1 + tokens))
    assert prompt.ids[prompt.audio_positions[-1] + 1] == tokenizer.token_to_id("<|object_ref_end|>")


def test_hotwords_use_upstreams_variant_and_blank_ones_are_ignored(tokenizer):
    with_context = decoded(tokenizer, build_asr_prompt(tokenizer, 48000, hotwords="  Zorblax, Quentin  ").ids)
    assert ("This is a 2.00 seconds audio, with extra info: Zorblax, Quentin\n\nPlease transcribe it with these keys: "
            "Start time, End time, Speaker ID, Content<|im_end|>\n") in with_context
    assert build_asr_prompt(tokenizer, 48000, hotwords=" \n").ids == build_asr_prompt(tokenizer, 48000).ids


def test_empty_audio_is_refused(tokenizer):
    with pytest.raises(VibeVoiceError, match="holds no samples"):
        build_asr_prompt(tokenizer, 0)


def transformers_parse(text):
    """transformers' own parser of VibeVoice-ASR output (short keys), run on the same text."""
    from transformers.models.vibevoice_asr.processing_vibevoice_asr import VibeVoiceAsrProcessor

    holder = types.SimpleNamespace(_decode_complete_segments=VibeVoiceAsrProcessor._decode_complete_segments)
    return VibeVoiceAsrProcessor.extract_speaker_dict(holder, text)


@pytest.mark.parametrize("text", [
    'assistant\n[{"Start":0.0,"End":7.56,"Speaker":0,"Content":"Hello there."},{"Start":7.56,"End":9,"Speaker":1,"Content":"Hi [laughs]"}]\n',
    'assistant\n[{"Start":0,"End":5.2,"Speaker":0,"Content":"one"},{"Start":5.2,"End":6.1,"Speaker":1,"Content":"two"},{"Start":6.1,"En',
])
def test_output_parses_as_transformers_reads_it(text):
    ours, note = parse_transcript(text)
    theirs = transformers_parse(text)
    assert [(s.start, s.end, s.speaker, s.text) for s in ours] == [
        (seg["Start"], seg["End"], seg["Speaker"], seg["Content"]) for seg in theirs]
    assert (note is None) == text.rstrip().endswith("]")


def test_long_key_names_and_a_single_object_are_read_as_upstream_does():
    segments, note = parse_transcript('[{"Start time": "1.5", "End time": 2.25, "Speaker ID": 3, "Content": " Hi "}]')
    assert segments == [Segment(1.5, 2.25, 3, "Hi")] and note is None
    segments, _ = parse_transcript('Here it is: {"Start": 0, "End": 1, "Speaker": 0, "Content": "solo"} done')
    assert segments == [Segment(0.0, 1.0, 0, "solo")]


@pytest.mark.parametrize("text", ["I could not understand the audio.", '[{"Start": 0, "End"', ""])
def test_output_that_is_not_a_transcript_is_a_clear_error(text):
    with pytest.raises(VibeVoiceError, match="JSON transcript"):
        parse_transcript(text)


def test_formats():
    segments = [Segment(0.0, 7.56, 0, "Hello there."), Segment(3725.5, 3727.004, 1, "Bye.")]
    srt = render("srt", segments, "Hello there. Bye.", "raw")
    assert srt == ("1\n00:00:00,000 --> 00:00:07,560\nSpeaker 0: Hello there.\n\n"
                   "2\n01:02:05,500 --> 01:02:07,004\nSpeaker 1: Bye.\n")
    vtt = render("vtt", segments, "", "raw")
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:07.560\n<v Speaker 0>Hello there.\n")
    assert render("txt", segments, "", "raw") == "Speaker 0: Hello there.\nSpeaker 1: Bye.\n"
    data = json.loads(render("json", segments, "Hello there. Bye.", "raw"))
    assert data["segments"][1] == {"start": 3725.5, "end": 3727.004, "speaker": 1, "text": "Bye."}
    assert data["text"] == "Hello there. Bye."
    assert render("raw", segments, "", "<|im_start|>assistant\n[]<|im_end|>") == "<|im_start|>assistant\n[]<|im_end|>"
