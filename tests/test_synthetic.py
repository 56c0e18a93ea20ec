"""Synthetic checkpoints: exact layout, non-degenerate weights, reproducible, with a usable tokenizer."""

import json
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from vibevoice_onnx.checkpoints.configs import QWEN_SPECIAL_TOKENS
from vibevoice_onnx.checkpoints.synthetic import make_checkpoint
from vibevoice_onnx.checkpoints.tokenizer import build_tokenizer
from vibevoice_onnx.errors import VibeVoiceError


def test_full_tokenizer_has_qwen_special_tokens_at_real_ids():
    tokenizer, ids = build_tokenizer("full")
    assert ids == QWEN_SPECIAL_TOKENS
    assert tokenizer.token_to_id("<|image_pad|>") == 151655
    encoded = tokenizer.encode("Hello there.\n", add_special_tokens=False)
    assert tokenizer.decode(encoded.ids) == "Hello there.\n"
    assert max(encoded.ids) < 151643 and len(tokenizer.encode("\n", add_special_tokens=False).ids) == 1


def test_tiny_tokenizer_keeps_special_tokens_inside_the_tiny_vocab(tiny_checkpoints):
    config = json.loads((tiny_checkpoints["asr-hf"] / "config.json").read_text())
    _, ids = build_tokenizer("tiny")
    assert max(ids.values()) < config["text_config"]["vocab_size"]
    assert config["audio_token_id"] == ids["<|box_start|>"]


def test_weights_are_not_degenerate(tiny_checkpoints):
    w = {k: v.astype(np.float32) for k, v in load_file(tiny_checkpoints["realtime"] / "model.safetensors").items()}
    gammas = np.concatenate([v for k, v in w.items() if k.endswith("gamma")])
    assert gammas.min() > 0.01  # upstream initialises layer scales to 1e-6
    for name in ("model.prediction_head.layers.0.adaLN_modulation.1.weight", "model.prediction_head.final_layer.linear.weight"):
        assert w[name].std() > 0.01  # zero-initialised upstream
    norms = np.concatenate([v for k, v in w.items() if k.endswith("norm.weight")])
    assert norms.std() > 0.01
    scale, bias = float(w["model.speech_scaling_factor"]), float(w["model.speech_bias_factor"])
    assert np.isfinite([scale, bias]).all() and scale not in (0.0, 1.0) and bias != 0.0


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path):
    make_checkpoint("realtime", tmp_path / "a", seed=5)
    make_checkpoint("realtime", tmp_path / "b", seed=5)
    make_checkpoint("realtime", tmp_path / "c", seed=6)
    a, b, c = ((tmp_path / n / "model.safetensors").read_bytes() for n in "abc")
    assert a == b and a != c


def test_index_covers_every_shard(tiny_checkpoints):
    root = tiny_checkpoints["1.5b"]
    index = json.loads((root / "model.safetensors.index.json").read_text())
    stored = {}
    for shard in set(index["weight_map"].values()):
        stored.update({k: (shard, v.nbytes) for k, v in load_file(root / shard).items()})
    assert {k: s for k, (s, _) in stored.items()} == index["weight_map"]
    assert index["metadata"]["total_size"] == sum(n for _, n in stored.values())


def test_make_checkpoint_names_only_folders_of_the_users(tmp_path):
    """What the demo prints first: the folder it writes, never the partial one beside it that it renames into place
    (the realtime preset is made from the checkpoint while it is being written)."""
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-m", "vibevoice_onnx.cli", "make-checkpoint", "realtime",
                           str(tmp_path / "checkpoint"), "--size", "tiny"], capture_output=True, text=True, timeout=300)
    said = done.stdout + done.stderr
    assert done.returncode == 0 and ".partial" not in said and f"{tmp_path / 'checkpoint'}/voices/synthetic.pt" in said, said


def test_refuses_a_non_empty_output_directory(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(VibeVoiceError, match="not empty"):
        make_checkpoint("realtime", tmp_path)
    assert (tmp_path / "keep.txt").read_text() == "mine"


@pytest.mark.slow
def test_full_size_realtime_checkpoint_is_the_hub_layout(tmp_path):
    make_checkpoint("realtime", tmp_path / "full", size="full")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "vibevoice_onnx.cli", "inspect", str(tmp_path / "full"), "--json"],
                          capture_output=True, text=True, check=True)
    elapsed = time.perf_counter() - start
    report = json.loads(proc.stdout)
    assert (report["tensors"], report["parameters"]) == (605, 1_017_626_724)
    assert report["layers"] == {"language_model": 4, "tts_language_model": 20} and report["configured_layers"] == 24
    assert report["bytes"] == 2_035_332_888  # byte-for-byte the hub file's size
    assert elapsed < 10
