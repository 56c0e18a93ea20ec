"""Every script in examples/ runs as a user runs it (its own process, the bundle path as an argument) on the tiny
bundles, and leaves what it says it makes: a WAV of nonzero length at 24 kHz, a transcript file, the server's
answer. Each has a bounded time; the server example starts and stops its own server on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import write_voice_sample

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
RATE = 24000


def run_example(name: str, *args, timeout: float = 300) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def assert_wav(path: Path) -> None:
    import soundfile as sf

    info = sf.info(str(path))
    assert info.samplerate == RATE and info.channels == 1, info
    samples, _ = sf.read(str(path))
    assert len(samples) > 0


def test_every_example_is_short_and_documented():
    scripts = sorted(EXAMPLES.glob("*.py"))
    assert {p.name for p in scripts} >= {"speak.py", "llm_stream.py", "dialogue.py", "transcribe.py", "serve_openai.py"}
    for script in scripts:
        text = script.read_text()
        assert text.startswith('"""'), f"{script.name}: a docstring saying what it shows comes first"
        assert len(text.splitlines()) <= 50, f"{script.name}: an example stays short"


def test_speak(tiny_bundle, tmp_path):
    out = tmp_path / "hello.wav"
    run_example("speak.py", tiny_bundle, "Hello from an example.", out, "--max-frames", "8")
    assert_wav(out)


def test_llm_stream(tiny_bundle, tmp_path):
    out = tmp_path / "answer.wav"
    assert "chunks" in run_example("llm_stream.py", tiny_bundle, out, "--voice", "synthetic", "--max-frames", "8")
    assert_wav(out)


def test_dialogue(tiny_15b_bundle, tmp_path):
    out, bob = tmp_path / "dialogue.wav", write_voice_sample(tmp_path / "bob.flac", pitch=120.0)
    run_example("dialogue.py", tiny_15b_bundle, out, "--speaker", "1=alice", "--speaker", f"2={bob}",
                "--max-frames", "12")
    assert_wav(out)


def test_transcribe(tiny_asr_bundle, tmp_path):
    audio, out = write_voice_sample(tmp_path / "meeting.wav", seconds=1.5), tmp_path / "meeting.json"
    run_example("transcribe.py", tiny_asr_bundle, audio, out, "--max-new-tokens", "8")
    transcript = json.loads(out.read_text())
    assert isinstance(transcript["text"], str) and isinstance(transcript["segments"], list)
    assert transcript["audio_seconds"] == pytest.approx(1.5, abs=0.01)


def test_serve_openai(tiny_bundle, tmp_path):
    pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    out = tmp_path / "speech.wav"
    assert "written by the server" in run_example("serve_openai.py", tiny_bundle, out, "--max-frames", "8",
                                                  timeout=240)
    assert_wav(out)
