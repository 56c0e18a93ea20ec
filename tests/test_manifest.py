"""The manifest read once into typed fields: a damaged one is refused by the field's name, an older one loads."""

from __future__ import annotations

import json
from pathlib import Path

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


def minimal(**changes) -> dict:
    """The smallest manifest this format accepts (no bundle behind it: the check reads the record alone)."""
    manifest = {"format_version": 4, "model_kind": "realtime", "precision": "fp32", "device": "cpu", "config": {},
                "graphs": {"lm": {"file": "lm.onnx", "inputs": [{"name": "x"}], "outputs": [{"name": "y"}]}},
                "tokenizer": {"file": "tokenizer.json"}, "source": {"hash": "sha256:0"}, "host_tensors": "host.safetensors"}
    return {**manifest, **changes}


def graph(**changes) -> dict:
    return {"graphs": {"lm": {**minimal()["graphs"]["lm"], **changes}}}


REFUSALS = [
    ([], "the manifest must be a JSON object, found list"),
    (minimal(format_version=None), "bundle format None is not supported (expected 4); build the bundle again"),
    *[(minimal(**{key: None}), f"the manifest has no valid '{key}' ({'an object' if kind is dict else 'a string'} expected)")
      for key, kind in (("model_kind", str), ("precision", str), ("device", str), ("config", dict), ("graphs", dict),
                        ("tokenizer", dict), ("source", dict), ("host_tensors", str))],
    (minimal(config=[]), "the manifest has no valid 'config' (an object expected)"),
    (minimal(model_kind="bert"), "the manifest has an unknown model_kind 'bert'"),
    *[(minimal(**{key: []}), f"the manifest has a '{key}' record that is not an object")
      for key in ("parity", "profile", "preprocessor", "tools", "bench")],
    (minimal(files=[]), "the manifest has a 'files' record that names something other than the bundle's own files"),
    (minimal(files={"../x": {}}), "the manifest has a 'files' record that names something other"),
    (minimal(files={"lm.onnx": "not a record"}), "the manifest has a 'files' record that names something other"),
    (minimal(source={"hash": 1}), "the manifest has a 'source' record whose 'hash' is not a string"),
    (minimal(host_tensors="../host.safetensors"),
     "the manifest names '../host.safetensors' as host tensors, which is not a plain file name inside the bundle"),
    (minimal(host_tensors="sub/host.safetensors"), "names 'sub/host.safetensors' as host tensors"),
    (minimal(host_tensors=".hidden"), "names '.hidden' as host tensors"),
    (minimal(host_tensors="a" * 129), "as host tensors"),
    (minimal(host_tensors="a..b"), "names 'a..b' as host tensors"),
    (minimal(tokenizer={}), "the manifest names 'None' as tokenizer, which is not a plain file name"),
    (minimal(graphs={"lm": []}), "the manifest has a graph entry 'lm' that is not an object"),
    (minimal(**graph(file="/etc/passwd")), "names '/etc/passwd' as the file of graph 'lm'"),
    (minimal(**graph(external_data="../lm.data")), "names '../lm.data' as the external data of graph 'lm'"),
    *[(minimal(**graph(**{side: value})), f"the manifest has no valid '{side}' list for graph 'lm'")
      for side in ("inputs", "outputs") for value in (None, [], [{"name": 1}], ["x"], {"name": "x"})],
]


@pytest.mark.parametrize("manifest, sentence", REFUSALS)
def test_each_damage_is_refused_in_the_sentence_that_names_it(manifest, sentence, tmp_path):
    with pytest.raises(BundleError) as refused:
        Manifest.from_dict(manifest, tmp_path / MANIFEST)
    assert str(refused.value).startswith(f"{tmp_path / MANIFEST}: ") and sentence in str(refused.value)
    if "format" not in sentence:
        assert str(refused.value).endswith(" (rebuild it with `vibevoice-onnx build`)")


def test_what_a_manifest_may_name_is_read_as_written(tmp_path):
    files = {"lm.onnx": {}, "voices/alice.safetensors": {}, "a" * 128: {}}
    manifest = Manifest.from_dict(minimal(files=files, parity=None, tools=None, host_tensors="h" * 128,
                                          **graph(external_data="lm.onnx.data")), tmp_path / MANIFEST)
    assert manifest.path == tmp_path / MANIFEST and manifest.host_tensors == "h" * 128
    assert manifest.files == files and manifest.tools == {} and manifest.parity is None and not manifest.verified
    assert manifest.profile_name == "dynamic" and manifest.source_path is None and manifest.source_hash == "sha256:0"
    fixed = Manifest.from_dict(minimal(profile={"name": "fixed"}, parity={"passed": True}, source={"path": "/ck"},
                                       tools={"graphs": "traced"}, bench={"rtf": 0.1}, preprocessor={"x": 1}), "m")
    assert (fixed.profile_name, fixed.verified, fixed.source_path, fixed.source_hash) == ("fixed", True, "/ck", None)
    assert (fixed.tools, fixed.bench, fixed.preprocessor) == ({"graphs": "traced"}, {"rtf": 0.1}, {"x": 1})
    assert isinstance(fixed.path, Path)
    copy = fixed.to_dict()
    copy["precision"] = "int8"
    assert fixed.raw["precision"] == "fp32"  # a writer's copy, not the record


@pytest.mark.parametrize("name, allowed", [("lm.onnx", True), ("voices/alice.safetensors", True), ("a" * 128, True),
                                           ("a" * 129, False), ("voices/../x", False), ("a..b", False), ("../x", False),
                                           ("sub/x", False), (".x", False), ("", False), (None, False), (3, False)])
def test_a_files_record_names_only_the_bundles_own_files(name, allowed):
    from vibevoice_onnx.runtime.manifest import recordable

    assert recordable(name) is allowed


def test_a_manifest_that_is_not_json_is_damaged(tmp_path):
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(BundleError) as refused:
        Manifest.read(tmp_path)
    assert str(refused.value).startswith(f"{tmp_path / MANIFEST}: this bundle is damaged: not valid JSON (Expecting ")
    (tmp_path / MANIFEST).write_bytes(b"\xff\xfe{}")
    with pytest.raises(BundleError, match="this bundle is damaged: not valid JSON"):
        Manifest.read(tmp_path)


def test_a_gate_reads_in_every_table_as_its_numbers_or_a_dash():
    from vibevoice_onnx.runtime.manifest import GATE_COLUMNS, gate_cells

    gate = {"name": "lm (past 11, new 5)", "cosine": 0.99999912, "relative": 1.234e-4, "gain": 1.0000049,
            "max_abs": 2.5e-3, "passed": True}
    assert gate_cells(gate) == ("lm (past 11, new 5)", "0.999999", "1.23e-04", "1.000005", "2.50e-03", "pass")
    assert gate_cells({"name": "old", "cosine": 0.5, "relative": None, "passed": False}) == \
        ("old", "0.500000", "-", "-", "-", "FAIL")  # an older record's gate: no gain, no max |Δ|
    assert len(GATE_COLUMNS) == len(gate_cells(gate)) and GATE_COLUMNS[0] == "gate" and GATE_COLUMNS[-1] == "result"
