"""Long recordings: the encoders and the prompt's prefill in calls of a bounded size (the same numbers as one
call), and a recording the model's context cannot hold refused with one sentence before any encoding."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vibevoice_onnx.errors import VibeVoiceError
from vibevoice_onnx.generation.asr import prefill
from vibevoice_onnx.runtime.asr import PIECE_FRAMES, OnnxAsrBackend, Transcriber
from vibevoice_onnx.runtime.lm import KvCache, StreamingConv
from vibevoice_onnx.runtime.bundle import Bundle

from conftest import copy_bundle


def test_a_prefill_in_calls_of_512_tokens_equals_one_call(tiny_asr_bundle):
    backend = OnnxAsrBackend(Bundle(tiny_asr_bundle))
    embeds = np.random.default_rng(0).standard_normal((1, 1300, backend.bundle.dims.lm.hidden)).astype(np.float32)
    whole, chunked = (prefill(backend.lm_stream(), embeds, chunk) for chunk in (1300, 512))
    np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-6)


def test_the_encoders_take_a_segment_in_pieces_with_the_means_of_one_call(tiny_asr_bundle, monkeypatch):
    backend = OnnxAsrBackend(Bundle(tiny_asr_bundle))
    piece = PIECE_FRAMES * backend.bundle.dims.acoustic_encoder.hop
    audio = (np.random.default_rng(1).standard_normal((1, 1, 2 * piece + 4321)) * 0.1).astype(np.float32)
    whole = [encoder.whole(audio) for encoder in backend.encoders]  # one call: every sample at once
    calls = []
    run = StreamingConv.run
    monkeypatch.setattr(StreamingConv, "run", lambda self, chunk, state: calls.append(chunk.shape[-1]) or run(self, chunk, state))
    pieces = backend.encode(audio)
    assert calls == [piece, piece, piece, piece, 4321, 4321]  # each encoder: two whole pieces, then the rest
    for ours, theirs in zip(pieces, whole):
        assert ours.shape == theirs.shape == (1, 2 * PIECE_FRAMES + 2, ours.shape[-1])
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_a_long_prompt_is_prefilled_into_a_cache_made_for_it(tiny_asr_bundle, monkeypatch):
    grown = []
    reserve = KvCache.reserve
    monkeypatch.setattr(KvCache, "reserve", lambda self, n: (grown.append(n) if n > self.capacity else None) or reserve(self, n))
    tone = np.sin(np.arange(50 * 24000) / 9.0).astype(np.float32) * 0.3  # 375 audio positions: past a new cache's 256
    result = Transcriber(tiny_asr_bundle).transcribe(tone, sample_rate=24000, max_new_tokens=4, mean_latents=True)
    assert len(result.tokens) == 4 and grown == []  # no copy of the cache on the way


def with_context(bundle_dir, tmp_path, positions: int):
    """A copy of the bundle whose LM's context is `positions` long (its config says so; the graphs don't care)."""
    copy = copy_bundle(bundle_dir, tmp_path / "bundle")
    manifest = json.loads((copy / "manifest.json").read_text())

    def shorten(node):
        if isinstance(node, dict):
            for key, value in node.items():
                node[key] = positions if key == "max_position_embeddings" else shorten(value)
        return node

    manifest["config"] = shorten(manifest["config"])
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def test_a_recording_longer_than_the_context_is_refused_before_any_encoding(tiny_asr_bundle, tmp_path, monkeypatch):
    transcriber = Transcriber(with_context(tiny_asr_bundle, tmp_path, 300))
    monkeypatch.setattr(OnnxAsrBackend, "encode", lambda *a: pytest.fail("encoded a recording it then refused"))
    monkeypatch.setattr(OnnxAsrBackend, "encoder_stream", lambda *a: pytest.fail("encoded a recording it then refused"))
    tone = np.sin(np.arange(60 * 24000) / 9.0).astype(np.float32) * 0.3
    with pytest.raises(VibeVoiceError, match=r"1\.0 minutes of audio take \d+ of the model's 300 positions, which "
                                             r"leaves none for the transcript: transcribe at most 0\.\d minutes"):
        transcriber.transcribe(tone, sample_rate=24000)


def test_a_transcript_that_reaches_the_end_of_the_context_says_so(tiny_asr_bundle, tmp_path):
    from vibevoice_onnx.transcription import build_asr_prompt

    tone = np.sin(np.arange(4 * 24000) / 9.0).astype(np.float32) * 0.3
    prompt_tokens = len(build_asr_prompt(Bundle(tiny_asr_bundle).tokenizer, len(tone)).ids)
    plain = Transcriber(tiny_asr_bundle).transcribe(tone, sample_rate=24000, max_new_tokens=6, mean_latents=True)
    assert len(plain.tokens) == 6 and "context" not in plain.note  # no stop token: it ran to its own limit
    short = Transcriber(with_context(tiny_asr_bundle, tmp_path, prompt_tokens + 3))
    capped = short.transcribe(tone, sample_rate=24000, max_new_tokens=6, mean_latents=True)
    assert capped.tokens == plain.tokens[:3]
    assert f"stopped at the end of the model's context ({prompt_tokens + 3} positions" in capped.note
