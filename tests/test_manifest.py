"""The manifest read once into typed fields: a damaged one is refused by the field's name, an older one loads."""

from __future__ import annotations

import json

import pytest

from vibevoice_onnx.errors import BundleError
from vibevoice_onnx.runtime.bundle import Bundle
from vibevoice_onnx.runtime.manifest import MANIFEST, Manifest

from conftest import copy_bundle


def written(bundle) -> dict:
    return json.loads((bundle / MANIFEST).read_text())


def test_the_fields_are_the_manifest_as_written(tiny_bundle):
    manifest, raw = Manifest.read(tiny_bundle), written(tiny_bundle)
    assert (manifest.kind, manifest.precision, manifest.device) == ("realtime", "fp32", "cpu")
    assert manifest.graphs == raw["graphs"] and manifest.source_hash == raw["source"]["hash"]
    assert manifest.tokenizer_file == "tokenizer.json" and manifest.profile_name == "dynamic"
    assert manifest.to_dict() == raw
    bundle = Bundle(tiny_bundle)
    assert bundle.manifest == raw and bundle.info == manifest  # the dict as written stays readable


@pytest.mark.parametrize("edit, sentence", [
    (lambda m: m.pop("precision"), "the manifest has no valid 'precision' (a string expected)"),
    (lambda m: m.update(device=3), "the manifest has no valid 'device' (a string expected)"),
    (lambda m: m.update(source=[]), "the manifest has no valid 'source' (an object expected)"),
    (lambda m: m.update(profile="fixed"), "the manifest has a 'profile' record that is not an object"),
    (lambda m: m.update(parity=True), "the manifest has a 'parity' record that is not an object"),
    (lambda m: m["source"].update(hash=1), "the manifest has a 'source' record whose 'hash' is not a string"),
    (lambda m: m.update(format_version=3), "bundle format 3 is not supported (expected 4)"),
])
def test_a_missing_or_mistyped_field_is_refused_by_name(tiny_bundle, edit, sentence):
    manifest = written(tiny_bundle)
    edit(manifest)
    with pytest.raises(BundleError, match=r"manifest.json: ") as refused:
        Manifest.from_dict(manifest, tiny_bundle / MANIFEST)
    assert sentence in str(refused.value)


def test_a_folder_without_a_manifest_is_no_bundle(tmp_path):
    with pytest.raises(BundleError, match="no manifest.json, so this is not a complete vibevoice-onnx bundle"):
        Manifest.read(tmp_path)


def test_a_bundle_written_before_the_optional_records_still_loads(tiny_bundle, tmp_path):
    """Bundles built before `files`, `preprocessor`, `profile`, `tools` and `bench` were recorded, and never verified."""
    old = copy_bundle(tiny_bundle, tmp_path / "old")
    manifest = written(old)
    for key in ("files", "preprocessor", "profile", "tools", "bench"):
        manifest.pop(key, None)
    (old / MANIFEST).write_text(json.dumps({**manifest, "parity": None}, indent=2))

    bundle = Bundle(old)
    assert bundle.info.files is None and bundle.info.parity is None and not bundle.info.verified
    assert bundle.info.tools == {} and bundle.profile == "dynamic" and bundle.kind == "realtime"
    assert bundle.dims == Bundle(tiny_bundle).dims
    with pytest.raises(BundleError, match="records no file hashes"):
        bundle.check_files()
