"""Verified bundles on the Hub: `push` uploads one with a model card built from its manifest (the parity gates,
the quantization policy, file sizes, benchmark numbers), `pull` downloads one and checks every file against the
sha256 its manifest records. Both go through `huggingface_hub`."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..errors import BundleError, VibeVoiceError
from ..families import family
from ..outputs import atomic_directory
from ..runtime.bundle import MANIFEST, MODEL_CARD, Bundle, record_files, write_manifest
from ..runtime.manifest import GATE_COLUMNS, Manifest, gate_cells
from .repos import Snapshot, hub_errors, parse_ref
from .resolve import pull_bundle


def publishable(bundle_dir: Path) -> Bundle:
    """A bundle fit to publish: verified, every gate passed, every file the one its manifest records (a bundle
    built before files were recorded gets its record now)."""
    bundle = Bundle(bundle_dir)
    parity = bundle.info.parity
    if not parity:
        raise BundleError(f"{bundle.path}: has not been verified; run `vibevoice-onnx verify {bundle.path}` first: "
                          "only a bundle whose gates passed is published")
    if not parity.get("passed"):
        failed = ", ".join(g["name"] for g in parity.get("gates", []) if not g.get("passed"))
        raise BundleError(f"{bundle.path}: failed its parity gates ({failed}); it is not published")
    if not bundle.info.files:
        write_manifest(bundle.path, record_files(bundle.path, bundle.info.to_dict()), "recording the bundle's file hashes")
        bundle = Bundle(bundle.path)
    bundle.check_files()
    return bundle


def upload_plan(bundle: Bundle, repo_id: str, base_model: str | None = None) -> dict[str, Path | bytes]:
    """What goes into the repository: the bundle's recorded files, its manifest and the model card."""
    plan: dict[str, Path | bytes] = {name: bundle.path / name for name in bundle.info.files}
    plan[MANIFEST] = bundle.path / MANIFEST
    plan[MODEL_CARD] = model_card(bundle, repo_id, base_model).encode()
    return plan


def push(bundle_dir: Path, repo_id: str, private: bool = False, revision: str | None = None,
         dry_run: Path | None = None, base_model: str | None = None, log=print) -> str:
    """Upload a verified bundle to `repo_id` (created if missing; `revision`: a branch, created if missing) in one
    commit; with `dry_run`, write exactly those files into that folder instead. Returns where it went."""
    ref = parse_ref(repo_id)
    if ref is None or ref.revision:
        raise VibeVoiceError(f"'{repo_id}' is not a Hub repository id (ORG/NAME; give a branch with --revision)")
    bundle = publishable(bundle_dir)
    plan = upload_plan(bundle, repo_id, base_model)
    if dry_run is not None:
        with atomic_directory(Path(dry_run)) as partial:
            for name, content in plan.items():
                (partial / name).parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, bytes):
                    (partial / name).write_bytes(content)
                else:
                    shutil.copyfile(content, partial / name)
        log(f"wrote the {len(plan)} files that would be pushed to {repo_id} into {dry_run}")
        return str(dry_run)
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi()
    with hub_errors(ref, "repository"):
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        operations = [CommitOperationAdd(name, content if isinstance(content, bytes) else str(content))
                      for name, content in plan.items()]
        manifest = bundle.info
        api.create_commit(repo_id, operations, revision=revision,
                          commit_message=f"vibevoice-onnx {manifest.kind} {manifest.device}_"
                                         f"{manifest.precision} bundle, verified")
    log(f"pushed {bundle.path} to {url}" + (f" (branch {revision})" if revision else ""))
    return str(url)


def pull(repo: str, revision: str | None = None, local_dir: Path | None = None, log=print) -> Path:
    """Download a prebuilt bundle and check its files; with `local_dir`, also copy it there (a plain folder you
    may change, e.g. import voices into)."""
    ref = parse_ref(repo, revision)
    if ref is None:
        raise VibeVoiceError(f"'{repo}' is not a Hub repository id (ORG/NAME, or ORG/NAME@REVISION)")
    snapshot = Snapshot.open(ref)
    if MANIFEST not in snapshot.files:
        raise VibeVoiceError(f"{ref}: holds no vibevoice-onnx bundle (no {MANIFEST}); a checkpoint repository is "
                             "built on first use instead: give it to speak/transcribe with --model")
    folder = pull_bundle(snapshot, log)
    if local_dir is None:
        return folder
    with atomic_directory(Path(local_dir)) as partial:
        for name in [MANIFEST, *Bundle(folder).info.files]:
            (partial / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / name, partial / name)
    return Path(local_dir)


# -- the model card --------------------------------------------------------------------------------------------
def model_card(bundle: Bundle, repo_id: str, base_model: str | None = None) -> str:
    """README.md with the Hub's metadata and, in its body, what a user needs to trust and use the bundle."""
    from huggingface_hub import ModelCard, ModelCardData

    manifest, speaks = bundle.info, bundle.dims.head is not None
    base_model = base_model or manifest.source.get("repo")
    data = ModelCardData(
        license="mit", base_model=base_model, library_name="vibevoice-onnx",
        pipeline_tag="text-to-speech" if speaks else "automatic-speech-recognition",
        tags=["vibevoice", "onnx", "vibevoice-onnx", manifest.kind, manifest.precision, manifest.device])
    title = f"{base_model or manifest.kind}: ONNX bundle ({manifest.device}, {manifest.precision})"
    body = "\n\n".join([
        f"# {title}",
        "A [vibevoice-onnx](https://pypi.org/project/vibevoice-onnx/) bundle: the model's graphs, host tensors, tokenizer"
        + (" and voices" if speaks else "") + ", run with onnxruntime and numpy alone (no PyTorch). Every graph "
        "was checked against the fp32 PyTorch reference, and so was the whole generation loop; the numbers are "
        "below and in `manifest.json` (`parity`), and every file's sha256 is recorded there (`files`), checked "
        "by `vibevoice-onnx pull` before use.",
        "## Use it\n\n```bash\npip install vibevoice-onnx\n" + usage(bundle, repo_id) + "\n```",
        gate_section(manifest.parity),
        precision_section(manifest),
        files_section(manifest),
        bench_section(manifest.bench),
        "## Source\n\n" + source_lines(manifest),
    ])
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}\n").content


def usage(bundle: Bundle, repo_id: str) -> str:
    facts = family(bundle.kind)
    if bundle.dims.head is None:
        stream = " --stream" if facts.streams_audio else ""
        return f"vibevoice-onnx transcribe --model {repo_id}{stream} recording.wav"
    voices = bundle.voices()
    voice = f" --voice {voices[0]}" if voices else " --voice PRESET_OR_AUDIO"
    if not facts.capabilities.long_form:
        return f'vibevoice-onnx speak --model {repo_id} "Hello there."{voice} -o hello.wav'
    speaker = voices[0] if voices else "SAMPLE.wav"
    return f'vibevoice-onnx speak --model {repo_id} "Speaker 1: Hello there." --speaker 1={speaker} -o hello.wav'


def gate_section(parity: dict) -> str:
    """The gates as the card shows them: direction (cosine), size (relative error) and bias (gain)."""
    rows = [f"| {' | '.join(cells)} |" for cells in (GATE_COLUMNS, ("---",) * len(GATE_COLUMNS),
                                                         *map(gate_cells, parity["gates"]))]
    when = parity.get("verified_at", "?")
    return (f"## Parity gates\n\nVerified {when} against {parity.get('reference', 'the fp32 PyTorch reference')} "
            f"({parity.get('precision')}); every gate passed.\n\n" + "\n".join(rows))


def precision_section(manifest: Manifest) -> str:
    rows = ["| graph | scheme | weights |", "|---|---|---|"]
    for name, graph in manifest.graphs.items():
        details = graph.get("precision") or {"scheme": manifest.precision}
        size = details.get("weight_bytes_after")
        rows.append(f"| {name} | {details.get('scheme', '?')} | {f'{size / 1e6:.1f} MB' if size else '-'} |")
    return f"## Quantization policy ({manifest.precision})\n\n" + "\n".join(rows)


def files_section(manifest: Manifest) -> str:
    files = manifest.files
    total = sum(f["size"] for f in files.values())
    rows = ["| file | size | sha256 |", "|---|---|---|"]
    rows += [f"| {name} | {f['size'] / 1e6:.1f} MB | `{f['sha256'][:16]}…` |" for name, f in files.items()]
    return f"## Files ({total / 1e9:.2f} GB)\n\n" + "\n".join(rows)


def bench_section(bench: dict | None) -> str:
    if not bench:
        return "## Speed\n\nNot benchmarked when pushed (`vibevoice-onnx bench BUNDLE` records its numbers here)."
    rows = [f"- {label}: {value}" for label, value in bench["results"].items()]
    return (f"## Speed\n\n`{bench['command']}` on {bench['cpu']} ({bench['threads']} threads), "
            f"{bench['date']}:\n\n" + "\n".join(rows))


def source_lines(manifest: Manifest) -> str:
    source, tools = manifest.source, manifest.tools
    lines = [f"- checkpoint: {source.get('repo', source.get('path'))}"
             + (f" at commit {source['commit']}" if source.get("commit") else "") + f" ({source['hash']})"]
    if source.get("tokenizer"):
        lines.append(f"- tokenizer: {source['tokenizer']}")
    lines.append("- built with " + ", ".join(f"{k} {v}" for k, v in tools.items() if v))
    return "\n".join(lines)
