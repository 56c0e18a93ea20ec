"""The README and getting-started as a new user follows them: the demo run in a fresh folder, then every block
marked `<!-- test: after-demo -->` run as written, in order, as one terminal would run them (the environment
active, as the README's first block makes it). A block marked `after-demo, server` is a server: it runs in the
background, on a free port in place of the one written, until the blocks after it are done. The blocks
marked `the demo's commands` must be what the demo itself runs. So the front door cannot drift from the code."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from helpers import free_port

REPO = Path(__file__).resolve().parents[1]
DOCS = (REPO / "README.md", REPO / "docs" / "getting-started.md")
MARKED = re.compile(r"<!-- test: ([^>]+?) -->\n```(\w+)\n(.*?)```", re.S)
WRITTEN_PORT = "8000"
FRAME = 3200  # samples a latent frame decodes to, at 24 kHz


def marked_blocks(path: Path, marker: str | None = None) -> list[tuple[str, str, str]]:
    """(marker, language, code) of each marked block, in order."""
    return [(m, language, code) for m, language, code in MARKED.findall(path.read_text())
            if marker is None or m == marker or m.startswith(marker + ",")]


@pytest.fixture(scope="module")
def after_demo(tmp_path_factory) -> tuple[Path, str]:
    """A folder where the demo ran as `scripts/demo` runs it, with `.venv` the environment these tests run in."""
    if not Path(sys.prefix, "bin", "activate").is_file():
        pytest.skip("the tests do not run in a virtual environment (scripts/test makes one)")
    folder = tmp_path_factory.mktemp("clone")
    (folder / ".venv").symlink_to(sys.prefix)
    done = subprocess.run([str(folder / ".venv" / "bin" / "vibevoice-onnx"), "demo"], cwd=folder, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return folder, done.stdout + done.stderr


def test_the_demo_says_what_it_runs_and_each_progress_line_once(after_demo):
    """Its output goes to a pipe here, as in a CI log: each progress line is printed once (three times, before)."""
    _, said = after_demo
    progress = [line for line in said.splitlines() if line.startswith("frame ")]
    assert [line.split()[1] for line in progress] == ["6", "12", "18", "24"], said
    run = [line.removeprefix("$ ") for line in said.splitlines() if line.startswith("$ vibevoice-onnx ")]
    (_, _, documented), = marked_blocks(DOCS[1], "the demo's commands")
    assert documented.strip().splitlines() == run
    assert all(shlex.split(line) for line in run)  # each as a shell takes it: copied, it runs


def test_the_readme_runs_as_written_after_the_demo(after_demo):
    folder, _ = after_demo
    blocks = [block for path in DOCS for block in marked_blocks(path, "after-demo")]
    languages = [language for _, language, _ in blocks]
    assert "python" in languages and languages.count("bash") >= 3, blocks  # the markers are still there
    port = str(free_port())
    server = None
    try:
        for marker, language, code in blocks:
            code = code.replace(WRITTEN_PORT, port)
            if marker.endswith("server"):
                server = background(folder, code, port)
            elif language == "python":
                shown = run_python(folder, code + "\nprint(len(audio), sample_rate)\n")
                assert shown.split() == [str(24 * FRAME), "24000"], shown
            else:
                run_shell(folder, code)
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            assert server.wait(30) is not None
    for name in ("hello.wav", "served.wav"):  # what the blocks say they write: 24 frames each
        audio, rate = sf.read(str(folder / name), dtype="float32")
        assert rate == 24000 and len(audio) == 24 * FRAME and np.abs(audio).max() > 0, name


def shell(code: str) -> list[str]:
    """bash running `code` in the terminal the README's first block prepared: the environment active."""
    return ["bash", "-euo", "pipefail", "-c", ". .venv/bin/activate\n" + code]


def run_shell(folder: Path, code: str) -> None:
    done = subprocess.run(shell(code), cwd=folder, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{code}\n{done.stdout}{done.stderr}"


def run_python(folder: Path, code: str) -> str:
    done = subprocess.run([str(folder / ".venv" / "bin" / "python"), "-c", code], cwd=folder, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"{code}\n{done.stdout}{done.stderr}"
    return done.stdout


def background(folder: Path, code: str, port: str) -> subprocess.Popen:
    """The server block, started as a terminal would run it, once it answers /health."""
    log = open(folder / "server.log", "wb")
    process = subprocess.Popen(shell(code), cwd=folder, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, (folder / "server.log").read_text()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return process
        except OSError:
            time.sleep(0.2)
    os.killpg(process.pid, signal.SIGTERM)
    raise AssertionError(f"the README's server did not answer in 120 s: {(folder / 'server.log').read_text()}")


def test_setup_reuses_the_environment_it_made():
    """`scripts/setup` (under both of the README's commands) installs nothing when nothing changed: a second
    `scripts/demo` or `scripts/test` starts at once. Only where these tests run in the environment it made."""
    venv = REPO / ".venv"
    if Path(sys.prefix).resolve() != venv.resolve() or not (venv / ".vibevoice-onnx-setup").is_file():
        pytest.skip("the tests do not run in the .venv that scripts/setup made")
    installed = {p: p.stat().st_mtime_ns for p in venv.glob("lib/python*/site-packages/*")}
    done = subprocess.run([str(REPO / "scripts" / "setup")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "up to date" in done.stdout, done.stdout + done.stderr
    assert {p: p.stat().st_mtime_ns for p in venv.glob("lib/python*/site-packages/*")} == installed
