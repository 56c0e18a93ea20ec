"""What verify's gates measure, in direction and in size, and what a gain put into one graph does to the verdict.

For each kind and precision: a synthetic checkpoint, its bundle, `verify`, and every gate's cosine, relative error
(||Δ|| / ||ref||) and gain (<ours, ref> / <ref, ref>): the measurements verify.common.LIMITS are set from. Then, for
each precision given to --gains, four copies of the realtime bundle, one graph's output multiplied by each factor
(verify.calibration.scaled_output: the decoder's audio, the head's velocity, the connector's embeddings, the upper
LM's hidden states), each verified: which gates refuse it.

    .venv/bin/python benchmarks/gate_sizes.py --size tiny --workdir bench-out/gates-tiny      # about 20 minutes
    .venv/bin/python benchmarks/gate_sizes.py --kinds realtime --precisions fp32,int8 --workdir bench-out/gates-full

Results go to WORKDIR/gate-sizes.json. Not part of CI (tests/test_gates.py pins the limits on small defects).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from phases import header, run

from vibevoice_onnx.checkpoints.synthetic import make_checkpoint
from vibevoice_onnx.checkpoints.tokenizer import build_tokenizer
from vibevoice_onnx.errors import VibeVoiceError
from vibevoice_onnx.export.build import build_bundle
from vibevoice_onnx.families import family
from vibevoice_onnx.verify.calibration import REALTIME_GAIN_POINTS, scaled_output
from vibevoice_onnx.verify.common import verify_bundle

KINDS = ("realtime", "1.5b", "large", "asr", "asr-streaming", "asr-bitnet")
PRECISIONS = ("fp32", "int8", "int4", "int4-mixed")
GAINS = {"fp32": (1.01, 1.001), "int8": (1.05, 1.01), "int4": (1.1,), "int4-mixed": (1.1,)}


def measured(record: dict) -> dict:
    return {"passed": record["passed"], "thresholds": record["thresholds"],
            "gates": [{key: g.get(key) for key in ("name", "cosine", "relative", "gain", "max_abs", "passed")}
                      for g in record["gates"]]}


def bundle_of(kind: str, precision: str, size: str, work: Path) -> Path | None:
    checkpoint = work / "checkpoints" / kind
    if not (checkpoint / "config.json").is_file():
        make_checkpoint(kind, checkpoint, size=size, seed=0)
    tokenizer = None
    if not (checkpoint / "tokenizer.json").is_file() and not family(kind).capabilities.speaks:
        tokenizer = work / "checkpoints" / f"{kind}-tokenizer.json"
        build_tokenizer(size)[0].save(str(tokenizer))
    try:
        return build_bundle(checkpoint, work / "onnx", precision, "cpu", tokenizer)
    except VibeVoiceError as e:  # a precision the kind has no policy for
        print(f"{kind} {precision}: not built ({e})", flush=True)
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["tiny", "full"], default="full")
    parser.add_argument("--workdir", default="bench-out/gates")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--gains", default="fp32,int8", help="the realtime precisions whose gained copies to verify")
    args = parser.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    results = {**header(), "size": args.size, "bundles": {}, "gained": {}}
    out = work / "gate-sizes.json"
    for kind in args.kinds.split(","):
        for precision in args.precisions.split(","):
            bundle = bundle_of(kind, precision, args.size, work)
            if bundle is None:
                continue
            record = verify_bundle(bundle, work / "checkpoints" / kind, log=lambda line: None)
            results["bundles"][f"{kind}/{precision}"] = measured(record)
            print(f"{kind} {precision}: {'passed' if record['passed'] else 'FAILED'}", flush=True)
            out.write_text(json.dumps(results, indent=1) + "\n")
    for precision in args.gains.split(",") if "realtime" in args.kinds.split(",") else ():
        source = work / "onnx" / "realtime" / f"cpu_{precision}"
        for factor in GAINS[precision]:
            for graph, output in REALTIME_GAIN_POINTS.items():
                copy = work / "gained" / f"{precision}-{graph}-{factor}"
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(source, copy)
                scaled_output(copy / f"{graph}.onnx", output, factor)
                record = verify_bundle(copy, work / "checkpoints" / "realtime", log=lambda line: None)
                failed = [g["name"] for g in record["gates"] if not g["passed"]]
                results["gained"][f"{precision} {graph}.{output} x{factor}"] = {"passed": record["passed"], "refused_by": failed}
                print(f"{precision} {graph} x{factor}: {'passed' if record['passed'] else 'refused by ' + ', '.join(failed)}",
                      flush=True)
                shutil.rmtree(copy)
                out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    run(main)
