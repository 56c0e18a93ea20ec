"""A checkpoint is opened once and passed down: build and verify read nothing of it again but its weights."""

from __future__ import annotations

import shutil

from vibevoice_onnx.checkpoints.checkpoint import Checkpoint
from vibevoice_onnx.checkpoints.files import INDEX_FILE, checkpoint_hash, open_checkpoint
from vibevoice_onnx.checkpoints.inspect import inspect_checkpoint
from vibevoice_onnx.runtime.bundle import Bundle


def test_open_returns_an_open_checkpoint_unchanged_and_derives_what_it_is(tiny_checkpoints):
    checkpoint = Checkpoint.open(tiny_checkpoints["1.5b"])
    assert Checkpoint.open(checkpoint) is checkpoint
    assert checkpoint.kind == checkpoint.dims.kind == checkpoint.family.name == "1.5b"
    assert checkpoint.hash == checkpoint_hash(tiny_checkpoints["1.5b"], open_checkpoint(tiny_checkpoints["1.5b"]))
    report = inspect_checkpoint(checkpoint)
    assert report["ok"] and report["expected_tensors"] == len(checkpoint.layout.by_name())


def test_one_opened_checkpoint_serves_build_and_verify(tiny_checkpoints, tmp_path):
    """Opened, hashed, and then its config.json and weight index deleted: a build and a verify that reopened
    the checkpoint anywhere would fail on the missing files. (The build writes its graphs; verify loads the
    PyTorch model from the opened checkpoint, as tracing does.)"""
    from vibevoice_onnx.export.build import build_bundle
    from vibevoice_onnx.verify.common import verify_bundle

    root = shutil.copytree(tiny_checkpoints["1.5b"], tmp_path / "checkpoint")
    checkpoint = Checkpoint.open(root)
    recorded_hash = checkpoint.hash
    (root / "config.json").unlink()
    (root / INDEX_FILE).unlink(missing_ok=True)

    bundle = build_bundle(checkpoint, tmp_path / "onnx", write=True)
    assert Bundle(bundle).info.source_hash == recorded_hash
    record = verify_bundle(bundle, checkpoint, log=lambda message: None)
    assert record["passed"], [g["name"] for g in record["gates"] if not g["passed"]]
