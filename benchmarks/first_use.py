"""What a user's first and later runs by model id cost: a full-size synthetic checkpoint in the real hub layout,
served by the local stand-in for the Hub (tests/hub_standin.py) with the Qwen tokenizer in a second repository,
then `speak --model ID` (or `transcribe --model ID`) run as a user runs it: first (download, build, verify, run),
second (cached), and offline (HF_HUB_OFFLINE=1). Each run's wall time and peak memory (GNU time: the largest
process, the build's child included) and the caches' size on disk. `--without-torch` runs the commands where torch
and transformers cannot be imported (the base install: graphs written, quantized bundles judged against them);
`--precision default` gives none (the fastest whose gates pass).

    .venv/bin/python benchmarks/first_use.py --kind realtime --workdir bench-out/first-use
    .venv/bin/python benchmarks/first_use.py --kind realtime --precision default --without-torch

Results go to WORKDIR/first-use-KIND-PRECISION.json, with the date, commit and CPU. Not part of CI.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from phases import CLI, cpu_flags, run_phase

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from hub_standin import StandInHub  # noqa: E402

SHARED = ROOT.parent / "shared" / "fixtures"
IDS = {"realtime": "microsoft/VibeVoice-Realtime-0.5B", "1.5b": "microsoft/VibeVoice-1.5B", "asr": "microsoft/VibeVoice-ASR"}


def repositories(checkpoint: Path, work: Path) -> tuple[Path, Path]:
    """The checkpoint as its Hub repository holds it (no tokenizer), and a Qwen repository with the tokenizer;
    files are hard links, not copies."""
    repo, qwen = work / "repo", work / "qwen"
    for folder in (repo, qwen):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    for path in checkpoint.iterdir():
        if path.is_file() and path.name != "tokenizer.json":
            os.link(path, repo / path.name)
    os.link(checkpoint / "tokenizer.json", qwen / "tokenizer.json")
    return repo, qwen


BLOCK_TORCH = """import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ModuleNotFoundError(f"blocked import of {name} (benchmarks/first_use.py --without-torch)",
                                      name=name.split(".")[0])  # as Python says it of a package not installed
sys.meta_path.insert(0, Block())
"""


def command(kind: str, model: str, precision: str, work: Path, name: str) -> list[str]:
    chosen = [] if precision == "default" else ["--precision", precision]
    if kind == "realtime":
        return [*CLI, "speak", "--model", model, *chosen, "Hello from the Hub, a first run.",
                "--voice", str(SHARED / "voices" / "en-Davis_man.pt"), "--seed", "7", "--max-frames", "24",
                "-o", str(work / f"{name}.wav")]
    if kind == "1.5b":
        return [*CLI, "speak", "--model", model, *chosen, "Speaker 1: Hello from the Hub.",
                "--speaker", f"1={SHARED / 'audio' / 'demo3-hotwords.wav'}", "--seed", "7", "--max-frames", "24",
                "-o", str(work / f"{name}.wav")]
    return [*CLI, "transcribe", "--model", model, *chosen, str(SHARED / "audio" / "demo3-hotwords.wav"),
            "--mean-latents", "--max-new-tokens", "16"]


def disk(folder: Path) -> float:
    return round(sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink()) / 1e9, 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", choices=sorted(IDS), default="realtime")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--workdir", default="bench-out/first-use")
    parser.add_argument("--without-torch", action="store_true", help="torch and transformers blocked (the base install)")
    args = parser.parse_args()
    work = Path(args.workdir) / args.kind
    work.mkdir(parents=True, exist_ok=True)
    checkpoint = work / "checkpoint"
    results = {"date": datetime.date.today().isoformat(), "cpu": cpu_flags(), "kind": args.kind,
               "precision": args.precision, "model": IDS[args.kind], "torch": not args.without_torch,
               "commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True).stdout.strip(),
               "command": " ".join(["benchmarks/first_use.py", *sys.argv[1:]])}
    if not (checkpoint / "config.json").is_file():
        run_phase("make_checkpoint", [*CLI, "make-checkpoint", args.kind, str(checkpoint), "--size", "full"], results, work)
    repo, qwen = repositories(checkpoint, work)
    hf, home, blocked = work / "hf", work / "home", work / "torch-blocked"
    for folder in (hf, home, blocked):
        shutil.rmtree(folder, ignore_errors=True)
    blocked.mkdir()
    (blocked / "sitecustomize.py").write_text(BLOCK_TORCH)
    with StandInHub() as hub:
        hub.add_repo(IDS[args.kind], repo)
        hub.add_repo({"realtime": "Qwen/Qwen2.5-0.5B", "1.5b": "Qwen/Qwen2.5-1.5B"}.get(args.kind, "Qwen/Qwen2.5-7B"), qwen)
        env = dict(os.environ, HF_ENDPOINT=hub.endpoint, HF_HUB_CACHE=str(hf), VIBEVOICE_ONNX_HOME=str(home),
                   HF_HUB_DISABLE_PROGRESS_BARS="1", **({"PYTHONPATH": str(blocked)} if args.without_torch else {}))
        for name, extra in (("first", {}), ("second", {}), ("offline", {"HF_HUB_OFFLINE": "1"})):
            os.environ.update(env, **extra)
            proc = run_phase(name, command(args.kind, IDS[args.kind], args.precision, work, name), results, work)
            os.environ.pop("HF_HUB_OFFLINE", None)
            results[name]["log"] = [line for line in proc.stderr.splitlines() if line.startswith(
                ("first use", "fetching", "built", "frames", "/", "verify", "the int8")) or "built and verified" in line
                or "verified against PyTorch only" in line][:12]
            if name == "first":
                results["downloads"] = len(hub.downloads())
            else:
                results[name]["downloads"] = len(hub.downloads()) - results["downloads"]
    results["disk_gb"] = {"hugging_face_cache": disk(hf), "bundle_cache": disk(home)}
    out = Path(args.workdir) / f"first-use-{args.kind}-{args.precision}{'-without-torch' if args.without_torch else ''}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
