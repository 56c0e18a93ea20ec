"""The base install as a user gets it: a wheel built from this repository, installed with no extras into a fresh
virtual environment (torch is not importable there), speaking a realtime model by its Hub id through the local
stand-in for the Hub (tests/hub_standin.py): the checkpoint downloaded, its int8 bundle written and verified
against its fp32 graphs, speech written; and transcribing by an ASR model's Hub id, its fp32 graphs written (its
gates need PyTorch so far, which one sentence says)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hub_standin import ASR_ID, REALTIME_ID, audio, environment

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory) -> Path:
    """A fresh venv holding this package's wheel and its base dependencies only."""
    root = tmp_path_factory.mktemp("base-install")
    wheels = root / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(wheels), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    wheel = next(wheels.glob("vibevoice_onnx-*.whl"))
    installed = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], capture_output=True, text=True,
                               timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return venv


def test_the_base_install_has_no_torch(base_venv):
    probe = "import importlib.util as u; print([n for n in ('torch', 'transformers', 'onnxscript') if u.find_spec(n)])"
    done = subprocess.run([str(base_venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_the_base_install_speaks_a_realtime_hub_id_and_transcribes_an_asr_one(base_venv, hub, tiny_preset, tmp_path):
    import json

    env = environment(tmp_path, hub.endpoint)
    cli = str(base_venv / "bin" / "vibevoice-onnx")
    spoken = subprocess.run([cli, "speak", "--model", REALTIME_ID, "Hello from a fresh install.", "--voice",
                             str(tiny_preset), "--seed", "7", "--max-frames", "6", "-o", str(tmp_path / "hello.wav")],
                            env=env, capture_output=True, text=True, timeout=600)
    assert spoken.returncode == 0, spoken.stderr[-3000:]
    assert "first use: writing the graphs of a realtime int8 bundle" in spoken.stderr
    assert "built and verified against its fp32 graphs" in spoken.stderr and "every gate passes" in spoken.stderr
    assert audio(tmp_path / "hello.wav").size == 6 * 3200
    heard = subprocess.run([cli, "transcribe", "--model", ASR_ID, str(tmp_path / "hello.wav"), "--mean-latents",
                            "--max-new-tokens", "6", "--format", "json"], env=env, capture_output=True, text=True,
                           timeout=600)
    assert heard.returncode == 0, heard.stderr[-3000:]
    assert "first use: writing the graphs of an asr int8 bundle" in heard.stderr and "Traceback" not in heard.stderr
    assert heard.stderr.count("built and verified against its fp32 graphs") == 1 and "every gate passes" in heard.stderr
    assert "6 tokens" in heard.stderr and isinstance(json.loads(heard.stdout), dict)
