"""Reading upstream voice presets without torch and without trusting the pickle."""

import io
import pickle
import subprocess
import sys
import zipfile

import ml_dtypes
import numpy as np
import pytest
import torch

from vibevoice_onnx.errors import VibeVoiceError
from vibevoice_onnx.voices import read_upstream_preset

from conftest import REAL_PRESETS, need_shared_voices


@pytest.mark.parametrize("name", sorted(REAL_PRESETS))
def test_real_presets_read_with_their_published_lengths(name):
    voices = need_shared_voices()
    prompt = read_upstream_preset(voices / f"{name}.pt")
    lm_length, tts_length = REAL_PRESETS[name]
    assert prompt.lengths == {"lm": lm_length, "tts_lm": tts_length, "neg_tts_lm": 1}
    summary = prompt.shape_summary()
    assert (summary["hidden"], summary["kv_heads"], summary["head_dim"]) == (896, 2, 64)
    assert (summary["lm_layers"], summary["tts_lm_layers"]) == (4, 20)
    assert prompt.lm[0][0].dtype == ml_dtypes.bfloat16
    assert np.isfinite(prompt.tts_lm[19][1].astype(np.float32)).all()


def test_non_contiguous_kv_are_rebuilt_from_raw_storage():
    # In en-Mike_man.pt, storage "1" is the lm layer-0 key: a [1,2,49,64] view with strides (6272,64,128,1)
    # of a [1,49,2,64] buffer (seen in the pickle's disassembly). Rebuild it by hand from the raw bytes.
    path = need_shared_voices() / "en-Mike_man.pt"
    with zipfile.ZipFile(path) as z:
        root = z.namelist()[0].split("/")[0]
        raw = np.frombuffer(z.read(f"{root}/data/1"), dtype=ml_dtypes.bfloat16)
    by_hand = raw.reshape(49, 2, 64).transpose(1, 0, 2)
    assert np.array_equal(read_upstream_preset(path).lm[0][0][0], by_hand)


def test_negative_prompt_is_identical_across_voices():
    voices = need_shared_voices()
    a, b = (read_upstream_preset(voices / f"{n}.pt") for n in ("en-Davis_man", "en-Grace_woman"))
    assert all(np.array_equal(x[0], y[0]) for x, y in zip(a.neg_tts_lm, b.neg_tts_lm))
    assert np.array_equal(a.neg_condition, b.neg_condition)


def _zip_with_pickle(path, payload: bytes):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("evil/data.pkl", payload)
        z.writestr("evil/version", "3\n")


def test_pickle_with_a_foreign_global_is_refused(tmp_path):
    class Exploit:
        def __reduce__(self):
            import os

            return os.system, ("echo pwned > " + str(tmp_path / "pwned"),)

    _zip_with_pickle(tmp_path / "evil.pt", pickle.dumps({"lm": Exploit()}, protocol=2))
    with pytest.raises(VibeVoiceError, match="refused to load.*(posix|os)\\.system"):
        read_upstream_preset(tmp_path / "evil.pt")
    assert not (tmp_path / "pwned").exists()


def test_a_tensor_reaching_outside_its_storage_is_refused(tmp_path):
    """A crafted pickle whose tensor geometry addresses memory beyond its 4-element storage."""
    from collections import OrderedDict

    import torch._utils

    class Storage:
        pass

    marker = Storage()

    class Crafted:
        def __reduce__(self):
            return torch._utils._rebuild_tensor_v2, (marker, 0, (4096,), (1,), False, OrderedDict())

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", torch.FloatStorage, "0", "cpu", 4) if obj is marker else None

    buffer = io.BytesIO()
    Pickler(buffer, protocol=2).dump({"lm": Crafted()})
    with zipfile.ZipFile(tmp_path / "crafted.pt", "w") as z:
        z.writestr("crafted/data.pkl", buffer.getvalue())
        z.writestr("crafted/data/0", np.zeros(4, np.float32).tobytes())
    with pytest.raises(VibeVoiceError, match=r"refused to load: tensor of size \(4096,\) reaches element 4095 of a storage of 4"):
        read_upstream_preset(tmp_path / "crafted.pt")


def test_files_that_are_not_presets(tmp_path):
    (tmp_path / "plain.pt").write_bytes(b"not a zip at all")
    with pytest.raises(VibeVoiceError, match="not a torch zip archive"):
        read_upstream_preset(tmp_path / "plain.pt")
    buffer = io.BytesIO()
    torch.save({"weights": torch.zeros(3)}, buffer)
    (tmp_path / "other.pt").write_bytes(buffer.getvalue())
    with pytest.raises(VibeVoiceError, match="holds lm, tts_lm, neg_lm, neg_tts_lm"):
        read_upstream_preset(tmp_path / "other.pt")


def test_a_recording_given_as_a_realtime_voice_says_what_a_realtime_voice_is(tiny_bundle, tmp_path):
    from vibevoice_onnx.cli import main

    from conftest import write_voice_sample

    recording = write_voice_sample(tmp_path / "me.wav")
    said = (f"{recording}: is a WAV recording, but a realtime voice is a preset: the cached prompt "
            "upstream's tools save as a .pt file")
    cloners = "a voice cloned from audio is what VibeVoice-1.5B and VibeVoice-Large (7B) do"
    with pytest.raises(VibeVoiceError) as refused:
        read_upstream_preset(recording)
    assert str(refused.value).startswith(said) and str(refused.value).endswith(cloners)
    done = subprocess.run([sys.executable, "-m", "vibevoice_onnx.cli", "speak", str(tiny_bundle), "Hello.", "--voice",
                           str(recording), "-o", str(tmp_path / "x.wav")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith(f"error: {said}") and cloners in done.stderr, done.stderr
    assert not (tmp_path / "x.wav").exists()


def test_synthetic_preset_round_trips_the_computed_caches(realtime_reference, tiny_checkpoints, tmp_path):
    from vibevoice_onnx.reference.presets import compute_prompt, save_upstream_preset

    prompt = compute_prompt(realtime_reference, [3, 4, 5, 6], pad_id=7)
    save_upstream_preset(prompt, tmp_path / "voice.pt")
    with zipfile.ZipFile(tmp_path / "voice.pt") as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    assert b"cuda:0" in pkl and b"transformers.cache_utils" in pkl and b"BFloat16Storage" in pkl
    read = read_upstream_preset(tmp_path / "voice.pt")
    state = prompt["tts_lm"].past_key_values.state
    assert not state["key_cache"][0].is_contiguous()  # written as upstream's non-contiguous views
    for i, key in enumerate(state["key_cache"]):
        assert np.array_equal(read.tts_lm[i][0].astype(np.float32), key.float().numpy())
    assert read.lengths == {"lm": 4, "tts_lm": 4 + 8, "neg_tts_lm": 1}
    expected = prompt["neg_tts_lm"].last_hidden_state[0, -1].float().numpy()
    assert np.array_equal(read.neg_condition.astype(np.float32), expected)
