"""The `vibevoice-onnx` command line.

Each subcommand imports what it needs when it runs, so the runtime commands (speak, voices) work on the
base install without torch, and a user error is one sentence on stderr, not a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import VibeVoiceError

EXIT_MISMATCH = 1  # the command ran, and what it checked is not right (inspect mismatch, failed gate)
EXIT_ERROR = 2  # the command could not run on this input


def cmd_inspect(args) -> int:
    from .checkpoints.inspect import format_report, inspect_checkpoint

    report = inspect_checkpoint(Path(args.checkpoint))
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0 if report["ok"] else EXIT_MISMATCH


def cmd_make_checkpoint(args) -> int:
    from .checkpoints.synthetic import make_checkpoint

    out = Path(args.out_dir)
    make_checkpoint(args.kind, out, size=args.size, seed=args.seed, dtype=args.dtype)
    if args.kind == "realtime":
        # Realtime voices exist only as presets (no acoustic encoder): make one in upstream's format.
        from .reference.loading import load_realtime
        from .reference.presets import write_synthetic_preset
        from .text import load_tokenizer

        preset = write_synthetic_preset(
            load_realtime(out), load_tokenizer(out / "tokenizer.json"), out / "voices" / "synthetic.pt", args.seed
        )
        print(f"  voice preset: {preset}", file=sys.stderr)
    print(out)
    return 0


def cmd_demo(args) -> int:
    """The main job on an embedded default: a tiny synthetic realtime checkpoint, end to end."""
    work = Path(args.workdir)
    checkpoint = work / "checkpoint"
    steps = []
    if not (checkpoint / "config.json").is_file():
        steps.append(["make-checkpoint", "realtime", str(checkpoint), "--size", "tiny"])
    steps.append(["inspect", str(checkpoint)])
    for step in steps:
        print(f"\n$ vibevoice-onnx {' '.join(step)}", flush=True)
        code = main(step)
        if code:
            return code
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vibevoice-onnx",
        description="Turn VibeVoice checkpoints into verified ONNX bundles and run them without PyTorch.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("inspect", help="recognise a checkpoint and compare it strictly with its layout")
    p.add_argument("checkpoint", metavar="CHECKPOINT_DIR")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("make-checkpoint", help="write a synthetic checkpoint in the exact hub layout")
    p.add_argument("kind", choices=["realtime", "1.5b", "asr", "asr-hf"])
    p.add_argument("out_dir", metavar="OUT_DIR")
    p.add_argument("--size", choices=["tiny", "full"], default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.set_defaults(func=cmd_make_checkpoint)

    p = sub.add_parser("demo", help="run the main job on a tiny synthetic realtime checkpoint")
    p.add_argument("--workdir", default="demo", help="where the checkpoint and outputs go (default ./demo)")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except VibeVoiceError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
