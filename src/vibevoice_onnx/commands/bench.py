"""`vibevoice-onnx bench`: the runtime's timings (runtime.bench) run, printed, plotted and recorded."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def bench_command(args) -> int:
    """`vibevoice-onnx bench` as parsed: run it, print (or plot) the report, record its headline in the bundle."""
    from ..runtime.bench import bench, format_report, plot, record_bench

    report = bench(Path(args.bundle), frames=args.frames, voice=args.voice,
                   reference=Path(args.reference) if args.reference else None, threads=args.threads,
                   decode_group=args.decode_group, streams=args.streams,
                   audio=[Path(path) for path in args.audio or ()],
                   against=Path(args.against) if args.against else None, cuda_graphs=args.cuda_graphs,
                   profile=args.profile)
    if args.plot:
        plot(report, Path(args.plot))
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    command = f"vibevoice-onnx bench BUNDLE --frames {args.frames}" + (f" --streams {args.streams}" if args.streams > 1 else "")
    command += " --cuda-graphs" if args.cuda_graphs else ""
    if record_bench(Path(args.bundle), report, command, args.threads):
        print(f"recorded these numbers in {Path(args.bundle) / 'manifest.json'} (bench)", file=sys.stderr)
    return 0
