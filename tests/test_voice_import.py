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
    assert "second" in out and "synthetic" in out and "lm   21" in out.replace("  ", "  ")


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
