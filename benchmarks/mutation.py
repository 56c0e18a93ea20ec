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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="mutation.json", help="the results file to write")
    parser.add_argument("--children", type=int, default=2, help="mutants run at once")
    args = parser.parse_args()
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
              "survivors": dict(sorted(survivors.items()))}
    Path(args.out).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps({key: report[key] for key in ("mutants", "counts", "score", "survivors_by_function")}, indent=1))
    return 0


if __name__ == "__main__":
    run(main)
