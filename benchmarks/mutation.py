"""A mutation score of the code that decides what ships: mutmut makes small changes to verify's judging code (a
`>=` turned into `>`, a constant nudged, an argument dropped) and runs the tests that cover each changed function
(pyproject.toml's [tool.mutmut]: the paths mutated, the tests run); a mutant no test notices survives.

    .venv/bin/python benchmarks/mutation.py --out benchmarks/results/DATE-mutation-verify.json     # about 7 minutes

Needs `pip install mutmut` (3.x). It works in ./mutants (removed first). The results: the counts by outcome, the
score (killed / (killed + survived): the mutants some test covers), and every survivor with its change, grouped by
function, for triage. Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

from phases import header, run

REPO = Path(__file__).resolve().parents[1]
MUTMUT = [str(Path(sys.executable).parent / "mutmut")]


def results() -> dict[str, str]:
    """Every mutant's outcome, by name (mutmut's own words: killed, survived, no tests, timeout, ...)."""
    listing = subprocess.run([*MUTMUT, "results", "--all", "true"], cwd=REPO, capture_output=True, text=True, check=True)
    return dict(line.strip().rsplit(": ", 1) for line in listing.stdout.splitlines() if ": " in line)


def change(name: str) -> str:
    """The mutant's change, as the lines it removes and adds."""
    shown = subprocess.run([*MUTMUT, "show", name], cwd=REPO, capture_output=True, text=True).stdout
    return "\n".join(line for line in shown.splitlines() if re.match(r"^[-+] ", line))


# How a survivor is read: by what its change leaves different, once the parts that cannot matter are set aside.
STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
DTYPES = re.compile(r"(asarray\([^,()]*(?:\([^()]*\))?)(?:, *(?:None|np\.float64|F32|np\.float32)?)?\)|astype\((?:None|np\.float64)\)")


def _same(minus: str, plus: str, normalise) -> bool:
    return normalise(minus) == normalise(plus)


TRIAGE = (
    ("equivalent: float('INF') is float('inf')", lambda line: line.replace('"INF"', '"inf"')),
    ("equivalent: a float array cast to float32 or float64 as it already is, or not at all",
     lambda line: DTYPES.sub(lambda m: (m.group(1) + ")") if m.group(1) else "astype()", line)),
    ("equivalent in practice: < for <= (or > for >=) between floats measured from data, equal with probability 0",
     lambda line: line.replace("<=", "<").replace(">=", ">")),
    ("wording: only the text of a message or a record's key", lambda line: STRINGS.sub('""', line)),
)


def triage(survivors: dict[str, list[dict]]) -> dict[str, int]:
    """Each survivor's reading (TRIAGE; "open": a test could kill it), counted."""
    counts: Counter = Counter()
    for found in survivors.values():
        for mutant in found:
            lines = mutant["change"].splitlines()
            minus = " ".join(line[2:].strip() for line in lines if line.startswith("- "))
            plus = " ".join(line[2:].strip() for line in lines if line.startswith("+ "))
            mutant["triage"] = next((why for why, normalise in TRIAGE if _same(minus, plus, normalise)), "open")
            counts[mutant["triage"]] += 1
    return dict(counts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="mutation.json", help="the results file to write")
    parser.add_argument("--children", type=int, default=2, help="mutants run at once")
    parser.add_argument("--reuse", action="store_true", help="report the last run in ./mutants, run nothing")
    args = parser.parse_args()
    if not args.reuse:
        shutil.rmtree(REPO / "mutants", ignore_errors=True)
        subprocess.run([*MUTMUT, "run", "--max-children", str(args.children)], cwd=REPO, stdout=subprocess.DEVNULL,
                       check=True)
    outcomes = results()
    counts = Counter(outcomes.values())
    killed, survived = counts.get("killed", 0), counts.get("survived", 0)
    survivors = defaultdict(list)
    for name, outcome in outcomes.items():
        if outcome == "survived":
            survivors[name.rsplit("__mutmut_", 1)[0]].append({"mutant": name, "change": change(name)})
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]
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
