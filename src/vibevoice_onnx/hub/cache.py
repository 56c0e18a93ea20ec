"""Bundles built from checkpoints, kept under $VIBEVOICE_ONNX_HOME/bundles and keyed by their source.

A source is a Hub repository at one commit (ORG--NAME--COMMIT) or a local checkpoint by its content hash
(local--HASH). Under it, bundles live as `build` lays them out: KIND/DEVICE_PRECISION. The first use builds
and verifies; a later one finds the bundle and starts at once. One lock per source makes two processes that
ask at once build it once, and `build` writes each bundle atomically, so a build killed halfway leaves
nothing that looks like a bundle.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..checkpoints.checkpoint import Checkpoint
from ..checkpoints.files import checkpoint_hash, open_checkpoint
from ..errors import VibeVoiceError
from ..export.makers import TRACED, WRITTEN, torch_installed
from ..families import family
from ..runtime.bundle import MANIFEST, Bundle
from .home import home
from .repos import HubRef

SOURCE_RECORD = "source.json"


def bundles_root() -> Path:
    return home() / "bundles"


@dataclass(frozen=True)
class Source:
    """Where a cached bundle's checkpoint came from: `key` names its folder; `record` goes into its manifest."""

    key: str
    record: dict

    @classmethod
    def hub(cls, ref: HubRef, commit: str) -> "Source":
        return cls(f"{ref.folder_name}--{commit}", {"repo": ref.repo, "revision": ref.revision or "main",
                                                    "commit": commit})

    @classmethod
    def local(cls, checkpoint: Path) -> "Source":
        return cls(f"local--{local_hash(checkpoint).removeprefix('sha256:')[:24]}",
                   {"path": str(Path(checkpoint).resolve())})

    @property
    def folder(self) -> Path:
        return bundles_root() / self.key

    def bundle(self, kind: str, device: str, precision: str) -> Path:
        return self.folder / kind / f"{device}_{precision}"


def local_hash(checkpoint: Path) -> str:
    """A local checkpoint's content hash (build's own), remembered by its files' sizes and times, so a
    checkpoint of 17 GB is read once, not at every use."""
    checkpoint = Path(checkpoint).resolve()
    files = open_checkpoint(checkpoint)
    stamp = [[name, (checkpoint / name).stat().st_size, (checkpoint / name).stat().st_mtime_ns]
             for name in ("config.json", *files.shards)]
    memo = home() / "hashes" / (checkpoint_hash_key(checkpoint) + ".json")
    try:
        known = json.loads(memo.read_text())
        if known.get("stamp") == stamp and known.get("path") == str(checkpoint):
            return known["hash"]
    except (OSError, ValueError, AttributeError):
        pass
    print(f"hashing {checkpoint} (once; later uses remember it)", file=sys.stderr, flush=True)
    digest = checkpoint_hash(checkpoint, files)
    memo.parent.mkdir(parents=True, exist_ok=True)
    _write_json(memo, {"path": str(checkpoint), "stamp": stamp, "hash": digest})
    return digest


def checkpoint_hash_key(path: Path) -> str:
    import hashlib

    return hashlib.sha256(str(path).encode()).hexdigest()[:24]


def _write_json(path: Path, data: dict) -> None:
    from ..outputs import atomic_file

    with atomic_file(path, "writing the cache record") as partial:
        partial.write_text(json.dumps(data, indent=2) + "\n")


def remember_commit(ref: HubRef, commit: str) -> None:
    """What `ref` resolved to, so that offline it still finds the bundle built from it."""
    path = bundles_root() / "refs" / ref.folder_name / (ref.revision or "main").replace("/", "--")
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != commit:
        path.write_text(commit)


def remembered_commit(ref: HubRef) -> str | None:
    path = bundles_root() / "refs" / ref.folder_name / (ref.revision or "main").replace("/", "--")
    return path.read_text().strip() if path.is_file() else None


def complete(bundle: Path) -> bool:
    return (bundle / MANIFEST).is_file()


def source_lock(source: Source):
    """An inter-process lock for one source's bundles (filelock: what huggingface_hub locks its cache with)."""
    from filelock import FileLock

    source.folder.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(source.folder) + ".lock")


def build_and_verify(source_checkpoint: Checkpoint | Path, source: Source, precision: str, device: str, tokenizer: Path | None,
                     log) -> Path:
    """The cached bundle of `checkpoint` at this precision and device: built and verified on first use (under
    the source's lock), found at once later. Its verdict is recorded in its manifest, as `verify` records it;
    whoever opens the bundle then admits or refuses it by that verdict. The build and the verification run in a
    child process: torch and the reference's memory are gone before the bundle is used, and this process's
    onnxruntime settings (one shared thread pool) stay its own."""
    checkpoint = Checkpoint.open(source_checkpoint)
    target = source.bundle(checkpoint.kind, device, precision)
    if settled(target):
        return target
    require_builder(checkpoint.kind)
    if precision != "fp32" and not torch_installed():
        from ..verify.judge import require_room

        require_room(4 * checkpoint.files.parameters(), f"a {checkpoint.kind} {precision} bundle")
    with source_lock(source):
        if not settled(target):
            if not complete(target):
                log(estimate(checkpoint, precision))
            started = time.perf_counter()
            _child({"checkpoint": str(checkpoint.root), "out_root": str(source.folder), "precision": precision,
                    "device": device, "tokenizer": str(tokenizer) if tokenizer else None, "source": source.record})
            _write_json(source.folder / SOURCE_RECORD, source.record)
            parity = Bundle(target).info.parity
            if parity is None:  # fp32 written without torch: nothing to judge it by here
                log(f"{target}: built in {time.perf_counter() - started:.0f} s, its graphs written without PyTorch "
                    "(not verified here: `verify` needs PyTorch; the writer is held to the traced export in the tests)")
            else:
                judged = "" if torch_installed() else " against its fp32 graphs"
                log(f"{target}: built and verified{judged} in {time.perf_counter() - started:.0f} s: "
                    + ("every gate passes" if parity.get("passed") else "FAILED its gates (" + failed_gates(parity) + ")"))
    return target


def settled(bundle: Path) -> bool:
    """Built, and verified where this install can verify it: a bundle whose graphs were written without torch
    is verified against PyTorch once torch is installed, and is final without it (fp32: its graphs are the
    traced export's, held to it in the tests; what needs gates is refused by the bundle's admission rule)."""
    if not complete(bundle):
        return False
    info = Bundle(bundle).info
    return info.verified or (not torch_installed() and info.tools.get("graphs") == WRITTEN and info.precision == "fp32")


# Without --precision: the fastest precision whose gates pass on the device, in this order; the last is the fallback
# (its graphs are the checkpoint's own arithmetic). fp16 on CUDA waits for its gates to have run on a GPU.
DEFAULT_ORDER = {"cpu": ("int8", "fp32"), "cuda": ("fp32",)}


def build_default(checkpoint: Checkpoint, source: Source, device: str, tokenizer: Path | None, log) -> Path:
    """The bundle a checkpoint gets when no precision is asked for: the first of DEFAULT_ORDER whose gates pass,
    built and verified on first use; one sentence where a precision's gates refuse it and the next is used."""
    settled_before = settled_default(source, checkpoint.kind, device)
    if settled_before is not None:
        return settled_before
    *faster, fallback = DEFAULT_ORDER[device]
    for precision in faster:
        target = build_and_verify(checkpoint, source, precision, device, tokenizer, log)
        parity = Bundle(target).info.parity or {}
        if parity.get("passed"):
            return target
        log(f"the {precision} bundle failed its gates ({failed_gates(parity)}), so {fallback} is used "
            f"(--precision {precision} --force would run it anyway)")
    return build_and_verify(checkpoint, source, fallback, device, tokenizer, log)


def settled_default(source: Source, kind: str, device: str) -> Path | None:
    """The bundle build_default settled on before, if it did: no download, no build."""
    order = DEFAULT_ORDER[device]
    for precision in order:
        target = source.bundle(kind, device, precision)
        if not settled(target):
            return None
        parity = Bundle(target).info.parity
        if parity is None or parity.get("passed") or precision == order[-1]:
            return target
    return None


def failed_gates(record: dict) -> str:
    return ", ".join(g["name"] for g in record.get("gates", []) if not g["passed"])


def require_builder(kind: str) -> None:
    """A first use builds and verifies: that needs the export extra (torch, transformers, onnxscript) unless the
    kind's graphs are written without it (and then verified against its fp32 graphs). Said in one sentence where
    it cannot, before anything is downloaded or built."""
    import importlib.util

    if family(kind).writer is not None and not torch_installed():
        return
    missing = [name for name in ("torch", "transformers", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        raise VibeVoiceError(
            f"building a bundle from a checkpoint needs the export extra ({', '.join(missing)} not installed): "
            "pip install 'vibevoice-onnx[export]'; or use a prebuilt bundle's Hub id (a repository that "
            "`vibevoice-onnx push` made; `vibevoice-onnx pull ORG/NAME`), which needs no torch")


# The child's command: not `python -m vibevoice_onnx.hub.cache`, since importing the hub package imports this module
# first, and runpy then warns (to the user) that it is running a module already imported.
_CHILD_CODE = "import json, sys; from vibevoice_onnx.hub.cache import _build_here; sys.exit(_build_here(json.loads(sys.argv[1])))"


def _child(job: dict) -> None:
    import subprocess

    done = subprocess.run([sys.executable, "-c", _CHILD_CODE, json.dumps(job)])
    if done.returncode == 130 or done.returncode < 0:
        raise KeyboardInterrupt
    if done.returncode:
        raise VibeVoiceError(f"building the bundle from {job['checkpoint']} failed (see above); nothing was kept")


def _build_here(job: dict) -> int:
    """The child's work: build (if not built), then verify (if not verified): against PyTorch where it is
    installed; without it, a quantized bundle against the fp32 bundle of the same checkpoint, written first as
    its teacher."""
    from ..export.build import build_bundle

    checkpoint = Checkpoint.open(job["checkpoint"])  # once: the build and the verification share it (and its hash)
    out_root, precision, device = Path(job["out_root"]), job["precision"], job["device"]
    target = out_root / checkpoint.kind / f"{device}_{precision}"
    teacher = None if torch_installed() or precision == "fp32" else out_root / checkpoint.kind / f"{device}_fp32"
    tokenizer = Path(job["tokenizer"]) if job["tokenizer"] else None
    try:
        for bundle, bundle_precision in ((teacher, "fp32"), (target, precision)):
            if bundle is not None and not complete(bundle):
                build_bundle(checkpoint, out_root, bundle_precision, device, tokenizer, origin=job["source"])
        if not settled(target):
            from ..verify.judge import verify_bundle

            against = "the PyTorch reference" if teacher is None else f"the fp32 graphs of {teacher}"
            print(f"verifying {target} against {against} (once; the verdict is kept in the bundle)",
                  file=sys.stderr, flush=True)
            verify_bundle(target, checkpoint, teacher=teacher)
    except VibeVoiceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def estimate(checkpoint: Checkpoint, precision: str) -> str:
    """What the first build will cost, from the checkpoint's size and the costs measured on full-size builds."""
    from ..export.build import build_cost

    files, kind = checkpoint.files, checkpoint.kind
    count = files.parameters()
    written = family(kind).writer is not None and not torch_installed()
    minutes, peak_gb = build_cost(kind, precision, count, WRITTEN if written else TRACED)
    duration = "under a minute" if minutes < 1 else f"about {minutes:.0f} min"
    doing = "writing the graphs of" if written else "building and verifying"
    article = "an" if kind[0] in "aeiou" else "a"
    return (f"first use: {doing} {article} {kind} {precision} bundle from {checkpoint.root} "
            f"({count / 1e9:.2f} B parameters, {files.total_bytes() / 1e9:.1f} GB); on 2 cores expect "
            f"{duration} and up to {peak_gb:.1f} GB of memory (later uses start at once)")


def cached_bundles() -> list[dict]:
    """Every cached bundle: its source, kind, variant, size on disk and verdict."""
    out = []
    root = bundles_root()
    for manifest in sorted(root.glob(f"*/*/*/{MANIFEST}")):
        bundle = manifest.parent
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        parity = data.get("parity")
        out.append({"path": str(bundle), "source": data.get("source", {}), "kind": data.get("model_kind"),
                    "variant": bundle.name, "bytes": folder_bytes(bundle),
                    "verdict": "not verified" if not parity else "passed" if parity.get("passed") else "FAILED"})
    return out


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def remove_cached(match: str) -> list[str]:
    """Remove the cached bundles whose source repository, key or path is `match` (ORG/NAME, optionally
    @REVISION, or a bundle path); returns what went."""
    removed = []
    for entry in cached_bundles():
        source, path = entry["source"], Path(entry["path"])
        names = {str(path), source.get("repo"), f"{source.get('repo')}@{source.get('revision')}", source.get("path"),
                 path.parents[1].name}
        if match in names or str(Path(match).resolve()) in (str(path), source.get("path")):
            shutil.rmtree(path)
            removed.append(str(path))
    for folder in {Path(r).parents[1] for r in removed}:
        if not any(folder.glob(f"*/*/{MANIFEST}")):
            shutil.rmtree(folder, ignore_errors=True)
            Path(str(folder) + ".lock").unlink(missing_ok=True)
    return removed


def home_summary() -> str:
    return f"{home()} ({'set by VIBEVOICE_ONNX_HOME' if os.environ.get('VIBEVOICE_ONNX_HOME') else 'default'})"

