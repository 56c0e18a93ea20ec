"""A bundle's manifest.json, read once, checked, and held as typed fields (torch-free).

The file's format does not change: what build writes and verify updates is still a plain dict (`to_dict`
gives it back), and a bundle built before reads as it did. Only reading goes through the fields here, so
a damaged manifest is refused once, by name, instead of failing somewhere as a KeyError.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import BundleError
from ..families import KINDS

FORMAT_VERSION = 4  # 2: the diffusion head split in two graphs; 3: one streaming decoder graph serves every decode;
# 4: LM graphs over fixed-capacity KV caches written in place (GroupQueryAttention)
MANIFEST = "manifest.json"
_PLAIN_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_BUNDLE_FILE = re.compile(r"(voices/)?[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # what a bundle's `files` record may name


def recordable(name) -> bool:
    """A name the `files` record may hold: a plain file of the bundle or of its voices/ folder, never a path out."""
    return isinstance(name, str) and bool(_BUNDLE_FILE.fullmatch(name)) and ".." not in name


def damaged(path: Path, problem: str) -> BundleError:
    return BundleError(f"{path}: this bundle is damaged: {problem} (rebuild it with `vibevoice-onnx build`)")


# A parity record's gate as every table shows it (verify's and the Hub card's): its columns, and each gate's cells
# ("-" where a gate, or an older bundle's record, has no such number).
GATE_COLUMNS = ("gate", "cosine", "rel. error", "gain", "max |Δ|", "result")


def gate_cells(gate: dict) -> tuple[str, ...]:
    def cell(key: str, spec: str) -> str:
        return "-" if gate.get(key) is None else format(gate[key], spec)

    return (gate["name"], cell("cosine", ".6f"), cell("relative", ".2e"), cell("gain", ".6f"), cell("max_abs", ".2e"),
            "pass" if gate["passed"] else "FAIL")


# The fields every bundle of this format has, with their JSON type.
REQUIRED = (("model_kind", str), ("precision", str), ("device", str), ("config", dict), ("graphs", dict),
            ("tokenizer", dict), ("source", dict), ("host_tensors", str))
# Fields a bundle may lack (older builds, or never written for its kind): absent or null reads as None.
OPTIONAL = (("parity", dict), ("files", dict), ("profile", dict), ("preprocessor", dict), ("tools", dict),
            ("bench", dict))


def validate_manifest(manifest, path: Path) -> None:
    """Check the manifest's structure before anything trusts it: types, and file names that stay inside the
    bundle (a manifest naming ../ paths could otherwise make the runtime open files elsewhere)."""

    def fail(problem: str):
        raise damaged(path, f"the manifest {problem}")

    def plain_file(value, field: str):
        if not (isinstance(value, str) and _PLAIN_FILE.fullmatch(value) and ".." not in value):
            fail(f"names '{value}' as {field}, which is not a plain file name inside the bundle")

    if not isinstance(manifest, dict):
        fail(f"must be a JSON object, found {type(manifest).__name__}")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise BundleError(f"{path}: bundle format {version} is not supported (expected {FORMAT_VERSION}); "
                          "build the bundle again with this version's `vibevoice-onnx build`")
    for key, kind in REQUIRED:
        if not isinstance(manifest.get(key), kind):
            fail(f"has no valid '{key}' ({'an object' if kind is dict else 'a string'} expected)")
    if manifest["model_kind"] not in KINDS:
        fail(f"has an unknown model_kind '{manifest['model_kind']}'")
    if not isinstance(manifest.get("parity"), (dict, type(None))):
        fail("has a 'parity' record that is not an object")
    files = manifest.get("files")
    if files is not None and not (isinstance(files, dict) and all(recordable(n) and isinstance(f, dict) for n, f in files.items())):
        fail("has a 'files' record that names something other than the bundle's own files")
    for key, _ in OPTIONAL:
        if not isinstance(manifest.get(key), (dict, type(None))):
            fail(f"has a '{key}' record that is not an object")
    if not isinstance(manifest["source"].get("hash"), (str, type(None))):
        fail("has a 'source' record whose 'hash' is not a string")
    plain_file(manifest["host_tensors"], "host tensors")
    plain_file(manifest["tokenizer"].get("file"), "tokenizer")
    for name, graph in manifest["graphs"].items():
        if not isinstance(graph, dict):
            fail(f"has a graph entry '{name}' that is not an object")
        plain_file(graph.get("file"), f"the file of graph '{name}'")
        if graph.get("external_data") is not None:
            plain_file(graph["external_data"], f"the external data of graph '{name}'")
        for side in ("inputs", "outputs"):
            values = graph.get(side)
            if not (isinstance(values, list) and values and all(isinstance(v, dict) and isinstance(v.get("name"), str) for v in values)):
                fail(f"has no valid '{side}' list for graph '{name}'")


@dataclass(frozen=True)
class Manifest:
    """A checked manifest. `graphs` keeps each graph's entry as written (file, external_data, inputs, outputs
    and what its kind adds: states, precision): the runtime modules read those by name."""

    path: Path  # the manifest file, for error messages
    model_kind: str
    precision: str
    device: str
    config: dict
    graphs: dict[str, dict]
    tokenizer_file: str
    host_tensors: str
    source: dict  # path, hash, and where it came from (a Hub repository, its commit)
    parity: dict | None  # verify's record; None until verified
    files: dict | None  # name -> size and sha256; None in bundles built before files were recorded
    profile: dict | None  # None for the default (dynamic) profile
    preprocessor: dict | None
    tools: dict
    bench: dict | None  # `bench --record`'s measurements
    raw: dict  # the manifest as read: what writers copy and change (to_dict)

    @classmethod
    def from_dict(cls, manifest, path: Path) -> Manifest:
        validate_manifest(manifest, path)
        optional = {key: manifest.get(key) for key, _ in OPTIONAL}
        return cls(path=Path(path), model_kind=manifest["model_kind"], precision=manifest["precision"],
                   device=manifest["device"], config=manifest["config"], graphs=manifest["graphs"],
                   tokenizer_file=manifest["tokenizer"]["file"], host_tensors=manifest["host_tensors"],
                   source=manifest["source"], **{**optional, "tools": optional["tools"] or {}}, raw=manifest)

    @classmethod
    def read(cls, bundle_dir: Path) -> Manifest:
        """The manifest of the bundle at `bundle_dir`, refused with the sentence that says what is wrong."""
        path = Path(bundle_dir) / MANIFEST
        if not path.is_file():
            raise BundleError(f"{Path(bundle_dir)}: no {MANIFEST}, so this is not a complete vibevoice-onnx bundle")
        try:
            manifest = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise damaged(path, f"not valid JSON ({e})") from None
        return cls.from_dict(manifest, path)

    @property
    def kind(self) -> str:
        return self.model_kind

    @property
    def source_hash(self) -> str | None:
        return self.source.get("hash")

    @property
    def source_path(self) -> str | None:
        return self.source.get("path")

    @property
    def profile_name(self) -> str:
        """"dynamic" (the default build), or "fixed" (`build --profile fixed`: static shapes, export/fixed.py)."""
        return (self.profile or {}).get("name", "dynamic")

    @property
    def verified(self) -> bool:
        return bool(self.parity)

    def to_dict(self) -> dict:
        """A copy of the manifest as written, for a writer to change and write back (write_manifest)."""
        return dict(self.raw)
