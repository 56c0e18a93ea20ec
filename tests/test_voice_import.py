"""`voices import` / `voices list`: upstream presets into a bundle, refusing what does not fit."""

import pytest

from vibevoice_onnx.cli import main

from conftest import copy_bundle, need_shared_voices


@pytest.fixture
def bundle(tiny_bundle, tmp_path):
    return copy_bundle(tiny_bundle, tmp_path / "bundle")


def test_import_and_list_show_the_cached_lengths(bundle, tiny_preset, capsys):
    assert main(["voices", "import", str(bundle), str(tiny_preset), "--name", "second"]) == 0
    assert "imported voice 'second'" in capsys.readouterr().out
    assert main(["voices", "list", str(bundle)]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
    assert lines["second"] == lines["synthetic"] == ["lm", "21", "tts_lm", "29", "neg_tts_lm", "1"]


def test_a_name_in_use_needs_force(bundle, tiny_preset, capsys):
    assert main(["voices", "import", str(bundle), str(tiny_preset), "--name", "synthetic"]) == 2
    assert "already has a voice 'synthetic'" in capsys.readouterr().err
    assert main(["voices", "import", str(bundle), str(tiny_preset), "--name", "synthetic", "--force"]) == 0


def test_a_real_preset_that_does_not_fit_is_refused_and_leaves_nothing(bundle, capsys):
    voices = need_shared_voices()
    before = sorted(p.name for p in (bundle / "voices").iterdir())
    assert main(["voices", "import", str(bundle), str(voices / "en-Davis_man.pt")]) == 2
    err = capsys.readouterr().err
    assert "does not fit this model: hidden is 896 in the preset but 64 in the model" in err
    assert sorted(p.name for p in (bundle / "voices").iterdir()) == before


def test_names_are_validated(bundle, tiny_preset, capsys):
    assert main(["voices", "import", str(bundle), str(tiny_preset), "--name", "../escape"]) == 2
    assert "not a usable voice name" in capsys.readouterr().err
    assert main(["voices", "import", str(bundle), str(tiny_preset), "--name", "abc\n"]) == 2
    assert main(["speak", str(bundle), "Hi.", "--voice", "../../elsewhere", "-o", str(bundle / "x.wav")]) == 2
    assert "not a usable voice name" in capsys.readouterr().err


def test_a_foreign_file_in_voices_is_reported_not_crashed_on(bundle, capsys):
    from safetensors.numpy import save_file
    import numpy as np

    save_file({"weights": np.zeros(3, np.float32)}, str(bundle / "voices" / "stray.safetensors"))
    assert main(["voices", "list", str(bundle)]) == 2
    assert "stray.safetensors: not a vibevoice-onnx voice file" in capsys.readouterr().err
