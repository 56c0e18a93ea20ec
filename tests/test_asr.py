"""VibeVoice-ASR: the shared transcription loop on the PyTorch reference, against transformers' own generate,
in both hub layouts."""

import numpy as np
import pytest
import torch

from vibevoice_onnx.checkpoints.tokenizer import build_tokenizer
from vibevoice_onnx.errors import VibeVoiceError
from vibevoice_onnx.generation.asr import run_transcription, stop_ids
from vibevoice_onnx.reference.asr import load_asr
from vibevoice_onnx.transcription import build_asr_prompt


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer("tiny")[0]


@pytest.fixture(scope="module", params=["asr", "asr-hf"])
def reference(request, tiny_checkpoints):
    return load_asr(tiny_checkpoints[request.param])


def speech_like(samples: int, seed: int = 0) -> np.ndarray:
    t = np.arange(samples) / 24000
    rng = np.random.default_rng(seed)
    return (0.2 * np.sin(2 * np.pi * 180 * t + 3 * np.sin(2 * np.pi * 3 * t)) + 0.02 * rng.standard_normal(samples)).astype(np.float32)


@torch.no_grad()
def test_greedy_loop_matches_transformers_generate(reference, tokenizer):
    """On whole frames of audio (where upstream's padding and transformers' agree), with the encoder means."""
    samples = speech_like(3200 * 7)
    prompt = build_asr_prompt(tokenizer, len(samples))
    ours = run_transcription(reference, prompt, samples, stop_ids(tokenizer), 24, rng=None)
    reference.model.config.audio_token_id = tokenizer.token_to_id("<|box_start|>")
    generated = reference.model.generate(
        input_ids=torch.tensor([prompt.ids]), input_values=torch.from_numpy(samples)[None, None], sample=False,
        max_new_tokens=24, do_sample=False, eos_token_id=sorted(stop_ids(tokenizer)), pad_token_id=0)
    assert ours.tokens == generated[0, len(prompt.ids):].tolist()
    assert len(ours.margins) == len(ours.tokens) and ours.stop_reason in ("eos", "max_new_tokens")


@torch.no_grad()
def test_the_same_weights_in_either_layout_transcribe_alike(tiny_checkpoints, tokenizer, tmp_path):
    """The codes-layout checkpoint, saved by transformers' own save_pretrained (the -HF layout), loads strictly
    and transcribes token for token alike, with sampled acoustic noise."""
    codes = load_asr(tiny_checkpoints["asr"])
    codes.model.save_pretrained(tmp_path / "hf")
    resaved = load_asr(tmp_path / "hf")
    assert resaved.dims.kind == "asr-hf"
    samples = speech_like(3200 * 3 + 777, seed=1)
    prompt = build_asr_prompt(tokenizer, len(samples))
    assert len(prompt.audio_positions) == 4  # upstream rounds the frame count up
    runs = [run_transcription(model, prompt, samples, stop_ids(tokenizer), 12, rng=np.random.default_rng(5),
                              keep_logits=True) for model in (codes, resaved)]
    assert runs[0].tokens == runs[1].tokens
    np.testing.assert_allclose(np.stack(runs[0].logits), np.stack(runs[1].logits), atol=1e-5)


def test_audio_over_60_seconds_is_refused_for_now(reference, tokenizer):
    samples = np.zeros(24000 * 61, np.float32)
    with pytest.raises(VibeVoiceError, match="over 60 s"):
        run_transcription(reference, build_asr_prompt(tokenizer, len(samples)), samples, stop_ids(tokenizer), 4, None)
