"""A model reference, whatever it names, to a bundle directory ready to open.

A reference is a local bundle directory, a local checkpoint directory, or a Hub repository id (ORG/NAME,
optionally @REVISION) of an upstream checkpoint or of a prebuilt bundle. Which one it is is decided by what is
there (a manifest.json, a config.json), never by its name. Checkpoints are built and verified once into the
bundle cache (hub/cache.py); prebuilt bundles are downloaded into the Hugging Face cache and every file checked
against the sha256 its manifest records.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from ..checkpoints.checkpoint import Checkpoint
from ..checkpoints.configs import PREPROCESSOR_CONFIG, model_dims, tokenizer_repo
from ..checkpoints.files import INDEX_FILE, SINGLE_FILE, read_json
from ..errors import BundleError, CheckpointError, VibeVoiceError
from ..runtime.bundle import FORMAT_VERSION, MANIFEST, Bundle, recordable
from .cache import (Source, build_and_verify, build_default, complete, remember_commit, remembered_commit,
                    require_builder, settled_default)
from .home import home, offline
from .repos import HubRef, Snapshot, parse_ref

_SHARD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")
TOKENIZER_FILE = "tokenizer.json"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def resolve_bundle(ref: str | Path, precision: str | None = None, device: str | None = None,
                   revision: str | None = None, tokenizer: str | Path | None = None, log=_log) -> Path:
    """The bundle directory `ref` names, fetched, built and verified as needed (see the module's note).
    `precision` and `device` pick the bundle a checkpoint is built into (default: the fastest precision whose
    gates pass on the device, int8 on a CPU, else fp32; CPU) and must match a bundle's own; `revision` pins a Hub reference (as ORG/NAME@REVISION does); `tokenizer` (a tokenizer.json or
    its folder) overrides the one found for a checkpoint that ships none."""
    local = Path(ref)
    if local.exists():
        if revision:
            raise VibeVoiceError(f"{ref}: is a local directory; a revision applies to Hub repositories only")
        if (local / MANIFEST).is_file():
            return _checked_variant(local, precision, device)
        if (local / "config.json").is_file():
            checkpoint = Checkpoint.open(local)
            return _build(checkpoint, Source.local(local), precision, device or "cpu", _tokenizer_for(checkpoint, tokenizer),
                          log)
        raise VibeVoiceError(f"{ref}: no {MANIFEST}, so this is not a complete vibevoice-onnx bundle, and no "
                             "config.json, so not a checkpoint either")
    hub = parse_ref(str(ref), revision)
    if hub is None:
        raise VibeVoiceError(f"{ref}: no such directory, and not a Hub repository id (ORG/NAME, or ORG/NAME@REVISION)")
    return _from_hub(hub, precision, device, tokenizer, log)


def _from_hub(ref: HubRef, precision: str | None, device: str | None, tokenizer, log) -> Path:
    try:
        snapshot = Snapshot.open(ref)
    except VibeVoiceError:  # offline, or the Hub unreachable, and no Hugging Face cache of it
        cached = _remembered_bundle(ref, precision, device)
        if cached is None:
            raise
        return cached
    if MANIFEST in snapshot.files:
        return _checked_variant(pull_bundle(snapshot, log), precision, device)
    if "config.json" not in snapshot.files:
        raise VibeVoiceError(f"{ref}: is neither a VibeVoice checkpoint (no config.json) nor a vibevoice-onnx bundle "
                             f"(no {MANIFEST})")
    source, device = Source.hub(ref, snapshot.commit), device or "cpu"
    remember_commit(ref, snapshot.commit)
    config = read_json(snapshot.fetch("config.json", "config"), "config.json")
    kind = _vibevoice_kind(config, ref)
    if precision is None:
        found = settled_default(source, kind, device)
    else:
        found = source.bundle(kind, device, precision)
        found = found if complete(found) and Bundle(found).info.verified else None
    if found is not None:
        return found  # built and verified before: no download, no build
    require_builder(kind)  # what cannot be built here is said before the download
    checkpoint = Checkpoint.open(fetch_checkpoint(snapshot, log))
    tokenizer_path = _tokenizer_for(checkpoint, tokenizer, source.record)
    return _build(checkpoint, source, precision, device, tokenizer_path, log)


def _build(checkpoint: Checkpoint, source, precision: str | None, device: str, tokenizer, log) -> Path:
    if precision is None:
        return build_default(checkpoint, source, device, tokenizer, log)
    return build_and_verify(checkpoint, source, precision, device, tokenizer, log)


def _vibevoice_kind(config: dict, ref) -> str:
    try:
        return model_dims(config, f"{ref}: config.json").kind
    except CheckpointError as e:
        raise VibeVoiceError(f"{e}; {ref} is not a VibeVoice checkpoint this project reads") from None


def _remembered_bundle(ref: HubRef, precision: str | None, device: str | None) -> Path | None:
    """Offline, with no Hugging Face cache of `ref`: a bundle built from the commit it last resolved to."""
    commit = remembered_commit(ref)
    if commit is None:
        return None
    source = Source.hub(ref, commit)
    kinds = sorted(path.name for path in source.folder.glob("*") if path.is_dir())
    for kind in kinds:
        found = settled_default(source, kind, device or "cpu") if precision is None else \
            source.bundle(kind, device or "cpu", precision)
        if found is not None and complete(found):
            return found
    return None


def fetch_checkpoint(snapshot: Snapshot, log) -> Path:
    """The files a build reads (config, weight index and shards, preprocessor config, tokenizer where the
    repository has one), into the Hugging Face cache; other files of the repository are not downloaded."""
    names = ["config.json"]
    if INDEX_FILE in snapshot.files:
        index = read_json(snapshot.fetch(INDEX_FILE, "weight index"), INDEX_FILE)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{snapshot.ref}: {INDEX_FILE} has no 'weight_map'")
        shards = list(dict.fromkeys(str(v) for v in weight_map.values()))
        strange = [name for name in shards if not _SHARD.fullmatch(name)]
        if strange:
            raise CheckpointError(f"{snapshot.ref}: {INDEX_FILE} names '{strange[0]}' as a shard, which is no plain "
                                  "file name of the repository")
        names += [INDEX_FILE, *shards]
    elif SINGLE_FILE in snapshot.files or offline():
        names.append(SINGLE_FILE)
    else:
        raise CheckpointError(f"{snapshot.ref}: has neither {SINGLE_FILE} nor {INDEX_FILE}")
    names += [n for n in (PREPROCESSOR_CONFIG, TOKENIZER_FILE) if n in snapshot.files]
    log(f"fetching {len(names)} files of {snapshot.ref.repo} at {snapshot.commit[:12]} into the Hugging Face cache "
        "(skipped where already there)")
    return snapshot.fetch_all(names, "checkpoint")


def _tokenizer_for(checkpoint: Checkpoint, given, record: dict | None = None) -> Path | None:
    """The tokenizer a build of `checkpoint` uses: the one given, else the checkpoint's own, else the Qwen2.5
    tokenizer that matches its LM, fetched from the Hub (named in `record`, the bundle's source record)."""
    if given is not None:
        return Path(given)
    if (checkpoint.root / TOKENIZER_FILE).is_file():
        return None  # build takes the checkpoint's own
    preprocessor_path = checkpoint.root / PREPROCESSOR_CONFIG
    preprocessor = read_json(preprocessor_path, PREPROCESSOR_CONFIG) if preprocessor_path.is_file() else None
    dims = checkpoint.dims
    repo = tokenizer_repo(dims, preprocessor)
    if repo is None:
        raise VibeVoiceError(f"{checkpoint.root}: ships no {TOKENIZER_FILE}, and its LM (width {dims.lm.hidden}) is of no "
                             "released Qwen2.5 size; pass --tokenizer with a Qwen2.5 tokenizer.json")
    ref = HubRef(repo)
    snapshot = Snapshot.open(ref)
    path = snapshot.fetch(TOKENIZER_FILE, "tokenizer")
    if record is not None:
        record["tokenizer"] = f"{repo}@{snapshot.commit}"
    return path


# -- prebuilt bundles --------------------------------------------------------------------------------------
def pull_bundle(snapshot: Snapshot, log=_log) -> Path:
    """A prebuilt bundle's files (those its manifest records, nothing else) into the Hugging Face cache, each
    checked against its recorded sha256 before the bundle is used; a check passed once is remembered by the
    files' sizes and times, so a later use starts at once."""
    manifest_path = snapshot.fetch(MANIFEST, "bundle manifest")
    manifest = read_json(manifest_path, f"{snapshot.ref}: {MANIFEST}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BundleError(f"{snapshot.ref}: holds a bundle of format {manifest.get('format_version')}, which this "
                          f"version does not read (it reads format {FORMAT_VERSION}); upgrade vibevoice-onnx, or "
                          "pull a revision built for this one")
    recorded = manifest.get("files")
    if not isinstance(recorded, dict) or not recorded:
        raise BundleError(f"{snapshot.ref}: its manifest records no file hashes, so its files cannot be checked; "
                          "refused")
    strange = [name for name in recorded if not recordable(name)]
    if strange:
        raise BundleError(f"{snapshot.ref}: its manifest names '{strange[0]}' as a file of the bundle, which is no "
                          "file a bundle holds; refused")
    missing = sorted(set(recorded) - set(snapshot.files)) if not offline() else []
    if missing:
        raise BundleError(f"{snapshot.ref}: the bundle's file {missing[0]} is missing from the repository")
    log(f"fetching the bundle {snapshot.ref.repo} at {snapshot.commit[:12]} ({len(recorded)} files, "
        f"{sum(int(v.get('size', 0)) for v in recorded.values()) / 1e9:.2f} GB) into the Hugging Face cache")
    folder = snapshot.fetch_all(list(recorded), "bundle")
    _check_once(Bundle(folder), f"{snapshot.ref.folder_name}--{snapshot.commit}")
    return folder


def _check_once(bundle: Bundle, key: str) -> None:
    memo = home() / "checked" / f"{key}.json"
    stamps = {name: [(bundle.path / name).stat().st_size, (bundle.path / name).stat().st_mtime_ns]
              for name in [MANIFEST, *bundle.info.files]}
    try:
        if json.loads(memo.read_text()) == stamps:
            return
    except (OSError, ValueError):
        pass
    bundle.check_files()
    memo.parent.mkdir(parents=True, exist_ok=True)
    memo.write_text(json.dumps(stamps))


def _checked_variant(bundle_dir: Path, precision: str | None, device: str | None) -> Path:
    """A bundle is what it is: a precision or device asked for that it is not is refused, not ignored."""
    manifest = Bundle(bundle_dir).info
    for asked, field in ((precision, "precision"), (device, "device")):
        if asked is not None and getattr(manifest, field) != asked:
            raise VibeVoiceError(f"{bundle_dir}: is a {manifest.device}_{manifest.precision} bundle, so its "
                                 f"{field} is not {asked}")
    return bundle_dir
