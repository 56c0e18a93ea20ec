"""Texts longer than the model's context: cut at sentence ends into segments that each fit, spoken one after
the other (realtime: each from the voice prompt; 1.5B: the script carried on with the same voices), the audio
streamed on without a seam and the memory bounded by the context, whatever the length."""

import numpy as np
import pytest

from vibevoice_onnx.cli import main
from vibevoice_onnx.runtime.lm import KvCache
from vibevoice_onnx.text import split_text

SENTENCES = [f"Sentence number {i} is here, with a few more words to say." for i in range(12)]
LONG_TEXT = " ".join(SENTENCES)


def words(text: str) -> int:
    return len(text.split())


def test_split_text_cuts_at_sentence_ends_and_packs_greedily():
    pieces = split_text(LONG_TEXT, words, 25)
    assert " ".join(pieces) == LONG_TEXT and all(words(p) <= 25 for p in pieces)
    assert all(p.endswith(".") for p in pieces)  # whole sentences: 12 words each, two to a piece
    assert len(pieces) == 6
    long_sentence = " ".join(["word"] * 30) + "."
    assert [words(p) for p in split_text(long_sentence, words, 12)] == [12, 12, 6]  # no sentence end: at words


@pytest.fixture
def caches(monkeypatch):
    """Every KV cache made while the test runs, with the largest position each reached."""
    made: list[KvCache] = []
    original = KvCache.__init__

    def recording(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self)
    monkeypatch.setattr(KvCache, "__init__", recording)
    return made


def test_realtime_speaks_a_long_text_in_segments_without_a_seam(tiny_bundle, caches):
    from vibevoice_onnx.runtime.realtime import TAIL_FRAMES, RealtimeTTS

    tts = RealtimeTTS(tiny_bundle)
    prompt_length = tts.bundle.voice("synthetic").tts_lm[0][0].shape[2]
    tts.backend.max_positions = prompt_length + TAIL_FRAMES + 60  # room for ~27 text tokens a segment
    speech = tts.stream(LONG_TEXT, "synthetic", seed=5, max_frames=400)
    speech.result.keep_audio = False
    audio = np.concatenate([chunk.samples for chunk in speech])
    result = speech.result
    assert speech.segments > 2 and result.segments[0] == 0 and result.segments == sorted(set(result.segments))
    assert len(result.segments) == speech.segments or result.stop_reason == "max_frames"
    assert result.chunks == [] and result.samples == len(audio) == 3200 * result.frames  # streamed, not held
    # no seam: the decoder's state ran on across segments, so the stream is the whole latents' one decode
    whole, _ = tts.decode(np.asarray(result.latents))
    np.testing.assert_allclose(audio, whole, atol=2e-5)
    # bounded: no cache ever held more than the context (each segment starts from the voice prompt)
    assert caches and max(int(c.lengths.max()) for c in caches) <= tts.backend.max_positions
    # the first segment is what that piece alone would give with the same noise
    first = tts.segments(LONG_TEXT, "synthetic")[0]
    alone = tts._speech(first, "synthetic", 1.5, 5, 5, None, result.segments[1], 3)
    np.testing.assert_allclose(np.concatenate([c.samples for c in alone]), audio[: len(alone.result.chunks) * 3200],
                               atol=1e-5)


def test_speak_says_it_speaks_in_segments(tiny_bundle, tmp_path, monkeypatch, capsys):
    import vibevoice_onnx.runtime.realtime as realtime
    from vibevoice_onnx.runtime.bundle import Bundle

    prompt_length = Bundle(tiny_bundle).voice("synthetic").tts_lm[0][0].shape[2]
    monkeypatch.setattr(realtime, "TAIL_FRAMES", 8192 - prompt_length - 70)  # leaves a tiny model 30 tokens
    assert main(["speak", str(tiny_bundle), LONG_TEXT, "--seed", "1", "--max-frames", "40", "-o", str(tmp_path / "a.wav")]) == 0
    err = capsys.readouterr().err
    assert "longer than the model's context: spoken in" in err and "segment 1/" in err


def test_a_long_script_is_carried_on_in_parts_with_the_same_voices(tiny_15b_bundle, caches):
    """The tiny LM never ends a turn: each part runs to upstream's cap of twice its prompt, then the next."""
    from vibevoice_onnx.runtime.tts15b import LongFormTTS
    from vibevoice_onnx.script import parse_script

    tts = LongFormTTS(tiny_15b_bundle)
    script = "\n".join(f"Speaker {1 + i % 2}: {sentence}" for i, sentence in enumerate(SENTENCES))
    whole = tts.stream(script, {1: "alice", 2: "alice"}, voice_latents="mean", seed=2)
    tts.backend.max_positions = 3 * (whole.prompt_tokens * 2 // 3)  # two thirds of the script a part, at most
    speech = tts.stream(script, {1: "alice", 2: "alice"}, voice_latents="mean", seed=2)
    for _ in speech:
        pass
    parts = tts.segments(parse_script(script), [v.frames for v in speech.voices])
    assert speech.segments == len(parts) == len(speech.result.segments) >= 2
    assert [line for part in parts for line in part.lines] == list(parse_script(script).lines)  # all, in order
    assert speech.result.segments[0] == 0 and speech.result.segments[1] > 0 and speech.result.stop_reason == "max_steps"
    assert max(int(c.lengths.max()) for c in caches) <= tts.backend.max_positions
