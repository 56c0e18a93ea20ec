"""The public surface stays what it was while the inside is rebuilt: every command's `--help` and the server's
OpenAPI document equal the snapshots under tests/surface/. A change to either is a change users see: make it
on purpose and rewrite the snapshots with VIBEVOICE_UPDATE_SURFACE=1."""

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vibevoice_onnx.cli import build_parser

SNAPSHOTS = Path(__file__).parent / "surface"
UPDATE = os.environ.get("VIBEVOICE_UPDATE_SURFACE") == "1"


def matches_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if UPDATE:
        path.write_text(text)
    assert path.is_file(), f"no snapshot {path}: run with VIBEVOICE_UPDATE_SURFACE=1 once"
    assert text == path.read_text(), f"{name} changed; if on purpose, rewrite it with VIBEVOICE_UPDATE_SURFACE=1"


def parsers(parser: argparse.ArgumentParser, path: str = "vibevoice-onnx"):
    """Every parser of the command line, with the words that reach it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from parsers(child, f"{path} {name}")


def test_every_commands_help_is_unchanged(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps to the terminal's width
    text = "".join(f"$ {path} --help\n{parser.format_help()}\n" for path, parser in parsers(build_parser()))
    assert text.count("$ vibevoice-onnx ") >= 20
    matches_snapshot("cli-help.txt", text)


def test_every_argument_and_command_says_what_it_is():
    missing = [f"{path} {action.option_strings or action.metavar or action.dest}"
               for path, parser in parsers(build_parser()) for action in parser._actions
               if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()]
    assert not missing, f"arguments without help text: {missing}"
    undescribed = [path for path, parser in parsers(build_parser()) if not (parser.description or "").strip()]
    assert not undescribed, f"commands whose --help does not say what they do: {undescribed}"


def test_version_names_the_package_and_onnxruntime():
    from importlib.metadata import version

    import onnxruntime

    done = subprocess.run([sys.executable, "-m", "vibevoice_onnx.cli", "--version"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith(f"vibevoice-onnx {version('vibevoice-onnx')} (onnxruntime {onnxruntime.__version__}, "
                                  "runs on: ")
    assert done.stdout.rstrip().endswith("CPU)") and "Azure" not in done.stdout  # a device list, not a remote endpoint


def test_the_servers_openapi_document_is_unchanged(tiny_bundle, tiny_15b_bundle, tiny_asr_bundle, tmp_path):
    pytest.importorskip("fastapi")
    from vibevoice_onnx.serve import Models, Settings, create_app

    bundles = [shutil.copytree(b, tmp_path / name) for b, name in
               ((tiny_bundle, "cpu_fp32"), (tiny_15b_bundle, "cpu_fp32_15b"), (tiny_asr_bundle, "cpu_fp32_asr"))]
    document = create_app(Models.open(bundles, aliases={"alloy": "synthetic"}), Settings()).openapi()
    matches_snapshot("openapi.json", json.dumps(document, indent=1, sort_keys=True) + "\n")
