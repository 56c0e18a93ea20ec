"""A mutation score of the code that decides what ships: mutmut makes small changes to verify's judging code (a
`>=` turned into `>`, a constant nudged, an argument dropped) and runs the tests that cover each changed function
(pyproject.toml's [tool.mutmut]: the paths mutated, the tests run); a mutant no test notices survives.

    .venv/bin/python benchmarks/mutation.py --out benchmarks/results/DATE-mutation-verify.json     # about 7 minutes
    .venv/bin/python benchmarks/mutation.py --sources src/vibevoice_onnx/generation/common.py \
        src/vibevoice_onnx/generation/realtime.py --tests tests/test_scheduler.py tests/test_loop_upstream.py \
        tests/test_generate.py --out benchmarks/results/DATE-mutation-generation.json

Needs `pip install mutmut` (3.x). With pyproject.toml's [tool.mutmut] it works in ./mutants (removed first); with
--sources and --tests, in a scratch copy of the checkout whose [tool.mutmut] names them. The results: the counts by outcome, the
score (killed / (killed + survived): the mutants some test covers), and every survivor with its change, grouped by
function, for triage. Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

from phases import header, run

REPO = Path(__file__).resolve().parents[1]
MUTMUT = [str(Path(sys.executable).parent / "mutmut")]


def results(where: Path) -> dict[str, str]:
    """Every mutant's outcome, by name (mutmut's own words: killed, survived, no tests, timeout, ...)."""
    listing = subprocess.run([*MUTMUT, "results", "--all", "true"], cwd=where, capture_output=True, text=True,
                             check=True)
    return dict(line.strip().rsplit(": ", 1) for line in listing.stdout.splitlines() if ": " in line)


def change(name: str, where: Path) -> str:
    """The mutant's change, as the lines it removes and adds."""
    shown = subprocess.run([*MUTMUT, "show", name], cwd=where, capture_output=True, text=True).stdout
    return "\n".join(line for line in shown.splitlines() if re.match(r"^[-+](?!--|\+\+)", line))  # not the headers


# How a survivor is read: by what its change leaves different, once the parts that cannot matter are set aside.
STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
ERRORS = re.compile(r"VibeVoiceError\(.*\)")
DTYPES = re.compile(r"(asarray\([^,()]*(?:\([^()]*\))?)(?:, *(?:None|np\.float64|F32|np\.float32)?)?\)|astype\((?:None|np\.float64)\)")


def _same(minus: str, plus: str, normalise) -> bool:
    return normalise(minus) == normalise(plus)


TRIAGE = (
    ("equivalent: float('INF') is float('inf')", lambda line: line.replace('"INF"', '"inf"')),
    ("equivalent: a float array cast to float32 or float64 as it already is, or not at all",
     lambda line: DTYPES.sub(lambda m: (m.group(1) + ")") if m.group(1) else "astype()", line)),
    ("equivalent in practice: < for <= (or > for >=) between floats measured from data, equal with probability 0",
     lambda line: line.replace("<=", "<").replace(">=", ">")),
    ("wording: only the text of a message or a record's key",  # an f-string's {expressions} are not its text
     lambda line: STRINGS.sub(lambda m: '"' + "".join(re.findall(r"\{[^{}]*\}", m[0])) + '"', line)),
    ("wording: an error's message", lambda line: ERRORS.sub("VibeVoiceError()", line)),
)


# Survivors read one by one and argued equivalent (or not worth a test, and why), by function and change:
# [{"function": "vibevoice_onnx.outputs.x_file_sha256", "minus": LINE, "plus": LINE, "why": SENTENCE}, ...].
ARGUED = Path(__file__).with_name("mutation-equivalents.json")


def triage(survivors: dict[str, list[dict]]) -> dict[str, int]:
    """Each survivor's reading (ARGUED, then TRIAGE; "open": a test could kill it), counted."""
    argued = {(a["function"], a["minus"], a["plus"]): a["why"] for a in json.loads(ARGUED.read_text())}
    counts: Counter = Counter()
    for function, found in survivors.items():
        for mutant in found:
            lines = mutant["change"].splitlines()
            minus = " ".join(line[1:].strip() for line in lines if line.startswith("-"))
            plus = " ".join(line[1:].strip() for line in lines if line.startswith("+"))
            argument = argued.get((function, minus, plus))
            mutant["triage"] = f"argued: {argument}" if argument else next(
                (why for why, normalise in TRIAGE if minus != plus and _same(minus, plus, normalise)), "open")
            counts[mutant["triage"]] += 1
    return dict(counts)


def without_option(args: list[str], option: tuple[str, str]) -> list[str]:
    """`args` with each occurrence of the two-word `option` (such as "-p", "no:logging") taken out."""
    kept, i = [], 0
    while i < len(args):
        if tuple(args[i:i + 2]) == option:
            i += 2
        else:
            kept.append(args[i])
            i += 1
    return kept


def scratch_copy(scratch: Path, sources: list[str], tests: list[str], reuse: bool, logging: bool = False) -> Path:
    """A copy of the checkout (what git tracks, as it is now) whose [tool.mutmut] mutates `sources` against
    `tests`: mutmut reads its settings from pyproject.toml alone, and this checkout's stay as they are.
    `logging`: pytest's logging plugin left on (tests that read the log through caplog need it)."""
    if not reuse:
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
        for name in filter(None, tracked.decode().split("\0")):
            if (REPO / name).is_file():
                (scratch / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, scratch / name)
        project = (scratch / "pyproject.toml").read_text()
        settings = {"source_paths": sources, "pytest_add_cli_args_test_selection": tests}
        if logging:
            pytest_args = tomllib.loads(project)["tool"]["mutmut"]["pytest_add_cli_args"]
            settings["pytest_add_cli_args"] = without_option(pytest_args, ("-p", "no:logging"))
        for key, value in settings.items():
            project = re.sub(rf"^{key} = .*$", f"{key} = {json.dumps(value)}", project, count=1, flags=re.M)
        (scratch / "pyproject.toml").write_text(project)
        # the tests find ../shared from where mutmut runs them (scratch/mutants), as they do from a checkout
        (scratch / "shared").symlink_to(REPO.parent / "shared")
    return scratch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="mutation.json", help="the results file to write")
    parser.add_argument("--children", type=int, default=2, help="mutants run at once")
    parser.add_argument("--reuse", action="store_true", help="report the last run (in ./mutants or --scratch), run "
                        "nothing")
    parser.add_argument("--sources", nargs="+", help="the files to mutate (default: pyproject.toml's [tool.mutmut])")
    parser.add_argument("--tests", nargs="+", help="the tests that judge them (with --sources)")
    parser.add_argument("--scratch", default="/tmp/vibevoice-onnx-mutation", help="the scratch copy --sources uses")
    parser.add_argument("--logging", action="store_true", help="with --sources: keep pytest's logging plugin (for "
                        "tests that read the log through caplog)")
    args = parser.parse_args()
    if bool(args.sources) != bool(args.tests):
        parser.error("--sources and --tests go together")
    where = scratch_copy(Path(args.scratch), args.sources, args.tests, args.reuse, args.logging) if args.sources else REPO
    if not args.reuse:
        shutil.rmtree(where / "mutants", ignore_errors=True)
        # every mutant is a pytest session of its own: the tiny checkpoints and bundles the tests share are made
        # once for all of them here (tests/conftest.py's shared_dir), as once for all workers in a suite's run
        with tempfile.TemporaryDirectory(prefix="vibevoice-onnx-mutation-fixtures-") as fixtures:
            subprocess.run([*MUTMUT, "run", "--max-children", str(args.children)], cwd=where,
                           stdout=subprocess.DEVNULL, check=True, env={**os.environ, "VIBEVOICE_TEST_SHARED_DIR": fixtures})
    outcomes = results(where)
    counts = Counter(outcomes.values())
    killed, survived = counts.get("killed", 0), counts.get("survived", 0)
    survivors = defaultdict(list)
    for name, outcome in outcomes.items():
        if outcome == "survived":
            survivors[name.rsplit("__mutmut_", 1)[0]].append({"mutant": name, "change": change(name, where)})
    config = tomllib.loads((where / "pyproject.toml").read_text())["tool"]["mutmut"]
    report = {**header(), "paths_mutated": config["source_paths"], "tests": config["pytest_add_cli_args_test_selection"],
              "mutants": len(outcomes), "counts": dict(counts),
              "score": round(killed / max(killed + survived, 1), 4),
              "survivors_by_function": {function: len(found) for function, found in sorted(survivors.items())},
              "triage": triage(survivors),
              "survivors": dict(sorted(survivors.items()))}
    Path(args.out).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps({key: report[key] for key in ("mutants", "counts", "score", "survivors_by_function", "triage")},
                     indent=1))
    return 0


if __name__ == "__main__":
    run(main)
