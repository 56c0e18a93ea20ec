"""The reference generation loop: reproducibility and upstream's stop rules (EOS, max length)."""

import numpy as np
import pytest

from vibevoice_onnx.reference.realtime import generate
from vibevoice_onnx.reference.loading import load_realtime
from vibevoice_onnx.reference.presets import prompt_from_text, save_upstream_preset
from vibevoice_onnx.sampling import NoiseSource
from vibevoice_onnx.text import encode_tts_text, load_tokenizer
from vibevoice_onnx.voices import read_upstream_preset

from helpers import copy_checkpoint, set_config, set_tensor

TEXT = "Hello world, this is a test of the streaming voice."


@pytest.fixture(scope="module")
def setup(tiny_checkpoints, realtime_reference, tmp_path_factory):
    tokenizer = load_tokenizer(tiny_checkpoints["realtime"] / "tokenizer.json")
    path = tmp_path_factory.mktemp("voice") / "voice.pt"
    save_upstream_preset(prompt_from_text(realtime_reference, tokenizer, "A voice.\n"), path)
    return tokenizer, read_upstream_preset(path)


def test_same_noise_same_output_different_noise_different(realtime_reference, setup):
    tokenizer, voice = setup
    ids = encode_tts_text(tokenizer, TEXT)
    a = generate(realtime_reference, voice, ids, NoiseSource.from_seed(1), max_frames=14)
    b = generate(realtime_reference, voice, ids, NoiseSource.from_seed(1), max_frames=14)
    c = generate(realtime_reference, voice, ids, NoiseSource.from_seed(2), max_frames=14)
    assert a.frames == b.frames == 14 and a.stop_reason == "max_frames"
    assert np.array_equal(a.audio, b.audio) and np.array_equal(np.stack(a.latents), np.stack(b.latents))
    assert not np.allclose(a.audio, c.audio)
    assert a.audio.shape == (14 * 3200,)


def test_noise_rows_feed_frames_in_order(realtime_reference, setup, tmp_path):
    tokenizer, voice = setup
    ids = encode_tts_text(tokenizer, TEXT)
    rows = np.stack([NoiseSource.from_seed(9)(i) for i in range(8)])
    np.save(tmp_path / "noise.npy", rows)
    from_file = generate(realtime_reference, voice, ids, NoiseSource.from_file(tmp_path / "noise.npy"), max_frames=8)
    from_seed = generate(realtime_reference, voice, ids, NoiseSource.from_seed(9), max_frames=8)
    assert np.array_equal(from_file.audio, from_seed.audio)


def test_text_changes_the_output(realtime_reference, setup):
    tokenizer, voice = setup
    a = generate(realtime_reference, voice, encode_tts_text(tokenizer, TEXT), NoiseSource.from_seed(1), max_frames=7)
    b = generate(realtime_reference, voice, encode_tts_text(tokenizer, "Something else entirely."), NoiseSource.from_seed(1), max_frames=7)
    # The first frame is sampled from the first text window's hidden state, so it already differs.
    assert not np.allclose(a.latents[0], b.latents[0])


def test_eos_stops_after_the_frame_that_triggered_it(tiny_checkpoints, setup, tmp_path):
    tokenizer, voice = setup
    ckpt = copy_checkpoint(tiny_checkpoints["realtime"], tmp_path / "eos")
    set_tensor(ckpt, "tts_eos_classifier.fc2.bias", np.array([40.0]))  # EOS on the first fed-back frame
    result = generate(load_realtime(ckpt), voice, encode_tts_text(tokenizer, TEXT), NoiseSource.from_seed(1))
    assert result.stop_reason == "eos" and result.frames == 1 and result.eos_frame == 0
    assert result.audio.shape == (3200,)  # the triggering frame's audio is kept


def test_max_length_follows_upstreams_strict_check(tiny_checkpoints, setup, tmp_path):
    tokenizer, voice = setup
    ckpt = copy_checkpoint(tiny_checkpoints["realtime"], tmp_path / "short")
    tts_length = voice.lengths["tts_lm"]
    # Room for one 5-token text window and 3 fed-back frames: the 4th frame is still emitted, then it stops.
    set_config(ckpt, "decoder_config", "max_position_embeddings", tts_length + 5 + 3)
    set_tensor(ckpt, "tts_eos_classifier.fc2.bias", np.array([-40.0]))
    model = load_realtime(ckpt)
    ids = encode_tts_text(tokenizer, TEXT)
    assert len(ids) > 5
    result = generate(model, voice, ids, NoiseSource.from_seed(1))
    assert (result.stop_reason, result.frames) == ("max_length", 4)
    # A text window that does not fit is not run at all: no frame is generated.
    set_config(ckpt, "decoder_config", "max_position_embeddings", tts_length + 4)
    result = generate(load_realtime(ckpt), voice, ids, NoiseSource.from_seed(1))
    assert (result.stop_reason, result.frames) == ("max_length", 0)
