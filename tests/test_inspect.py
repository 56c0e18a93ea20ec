"""`inspect` on good and bad checkpoints: kinds, strict comparison, exit statuses and one-sentence errors."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from vibevoice_onnx.cli import main


def run_cli(*args):
    """Run the real console entry point in a subprocess: exit status, stdout, stderr."""
    proc = subprocess.run([sys.executable, "-m", "vibevoice_onnx.cli", *map(str, args)], capture_output=True, text=True)
    return proc.returncode, proc.stdout, proc.stderr


def copy(src, tmp_path):
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("kind", ["realtime", "1.5b", "asr", "asr-hf"])
def test_tiny_checkpoints_inspect_clean(kind, tiny_checkpoints, capsys):
    assert main(["inspect", str(tiny_checkpoints[kind]), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == kind
    assert report["missing"] == report["unexpected"] == report["shape_mismatches"] == []
    assert report["tensors"] == report["expected_tensors"]
    assert report["parameters"] == report["expected_parameters"]
    assert report["dtype"] == "BF16"


def test_realtime_layers_reported_actual_against_configured(tiny_checkpoints, capsys):
    main(["inspect", str(tiny_checkpoints["realtime"]), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["layers"] == {"language_model": 2, "tts_language_model": 4}
    assert report["configured_layers"] == 6
    assert report["layer_notes"] and "config says 6" in report["layer_notes"][0]


def test_sharded_checkpoint_reports_its_index(tiny_checkpoints, capsys):
    main(["inspect", str(tiny_checkpoints["1.5b"]), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["sharded"] and len(report["files"]) == 3


def test_asr_hf_special_tokens_come_from_config(tiny_checkpoints, capsys):
    main(["inspect", str(tiny_checkpoints["asr-hf"]), "--json"])
    report = json.loads(capsys.readouterr().out)
    config = json.loads((tiny_checkpoints["asr-hf"] / "config.json").read_text())
    assert report["special_tokens"]["audio_token_id"] == config["audio_token_id"]


def test_missing_and_unexpected_keys_are_named(tiny_checkpoints, tmp_path, capsys):
    ckpt = copy(tiny_checkpoints["realtime"], tmp_path)
    tensors = load_file(ckpt / "model.safetensors")
    del tensors["tts_eos_classifier.fc1.bias"]
    tensors["model.semantic_tokenizer.encoder.head.conv.conv.bias"] = np.zeros(64, np.float32)
    tensors["model.tts_input_types.weight"] = np.zeros((3, 64), np.float32)
    save_file(tensors, ckpt / "model.safetensors")
    assert main(["inspect", str(ckpt), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["missing"] == ["tts_eos_classifier.fc1.bias"]
    assert report["unexpected"] == ["model.semantic_tokenizer.encoder.head.conv.conv.bias"]
    assert report["shape_mismatches"] == [{"name": "model.tts_input_types.weight", "expected": [2, 64], "actual": [3, 64]}]


def _assert_one_sentence_error(code, out, err, *fragments):
    assert code == 2
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("error: ")
    for fragment in fragments:
        assert fragment in err


def test_not_a_checkpoint_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    code, out, err = run_cli("inspect", tmp_path)
    _assert_one_sentence_error(code, out, err, str(tmp_path), "no config.json")


def test_truncated_safetensors(tiny_checkpoints, tmp_path):
    ckpt = copy(tiny_checkpoints["realtime"], tmp_path)
    data = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(data[: len(data) // 2])
    code, out, err = run_cli("inspect", ckpt)
    _assert_one_sentence_error(code, out, err, str(ckpt / "model.safetensors"), "truncated or corrupt")


def test_corrupt_safetensors_header(tiny_checkpoints, tmp_path):
    ckpt = copy(tiny_checkpoints["1.5b"], tmp_path)
    shard = ckpt / "model-00002-of-00003.safetensors"
    shard.write_bytes(b"\xff" * 64)
    code, out, err = run_cli("inspect", ckpt)
    _assert_one_sentence_error(code, out, err, str(shard), "truncated or corrupt")


def test_shard_named_in_index_but_absent(tiny_checkpoints, tmp_path):
    ckpt = copy(tiny_checkpoints["1.5b"], tmp_path)
    (ckpt / "model-00003-of-00003.safetensors").unlink()
    code, out, err = run_cli("inspect", ckpt)
    _assert_one_sentence_error(code, out, err, "model-00003-of-00003.safetensors", "missing")


def test_unknown_model_type(tiny_checkpoints, tmp_path):
    ckpt = copy(tiny_checkpoints["realtime"], tmp_path)
    config = json.loads((ckpt / "config.json").read_text())
    config["model_type"] = "llama"
    (ckpt / "config.json").write_text(json.dumps(config))
    code, out, err = run_cli("inspect", ckpt)
    _assert_one_sentence_error(code, out, err, str(ckpt / "config.json"), "unknown model_type 'llama'")


def test_config_that_is_not_json(tiny_checkpoints, tmp_path):
    ckpt = copy(tiny_checkpoints["realtime"], tmp_path)
    (ckpt / "config.json").write_text("{not json")
    code, out, err = run_cli("inspect", ckpt)
    _assert_one_sentence_error(code, out, err, str(ckpt / "config.json"), "not valid JSON")


def test_human_report_flags_the_layer_split(tiny_checkpoints):
    code, out, err = run_cli("inspect", tiny_checkpoints["realtime"])
    assert code == 0
    assert "config says 6 layers" in out and "matches its layout exactly" in out
