"""The documentation: the site builds with `mkdocs build --strict` (a broken link, a missing page or heading, a nav
entry without a file, an unreadable benchmark results file or an API page whose module is gone fails it), and the
README stays a short front page whose relative links all resolve."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
README_LIMIT = 15_000  # bytes: the README is a front page; the manual is docs/


def test_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings_handlers.python")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert not re.search(r"^WARNING", log, re.M), log
    site = tmp_path / "site"
    # the API reference was generated from the docstrings, and the benchmark results were rendered as tables
    assert "RealtimeTTS" in (site / "reference" / "runtime" / "index.html").read_text()
    assert "Settings" in (site / "reference" / "serve" / "index.html").read_text()
    benchmarks = (site / "benchmarks" / "index.html").read_text()
    for results in (REPO / "benchmarks" / "results").glob("*.json"):
        assert results.stem in benchmarks, results.name
    assert "<!-- benchmark-results -->" not in benchmarks


def test_readme_is_short():
    size = README.stat().st_size
    assert size < README_LIMIT, f"README.md is {size} bytes; move detail into docs/ (limit {README_LIMIT})"


def test_readme_links_resolve():
    text = README.read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    broken = []
    for link in links:
        if re.match(r"[a-z][a-z0-9+.-]*:", link) or link.startswith("#"):
            continue
        target = (REPO / link.split("#", 1)[0]).resolve()
        if not target.exists():
            broken.append(link)
    assert not broken, f"README links to files that do not exist: {broken}"


def test_readme_has_ci_commands():
    """The README's developer commands are exactly what CI runs."""
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.startswith(("python3 ", ".venv/", "scripts/"))]
    assert ci
    text = README.read_text()
    for line in ci:
        assert line in text, line
