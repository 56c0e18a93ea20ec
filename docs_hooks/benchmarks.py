"""MkDocs hook: the benchmarks page's `<!-- benchmark-results -->` marker becomes one section per results file.

Each `benchmarks/results/*.json` (a dated record a benchmark script wrote: its command, commit and CPU) is
rendered as it is, at build time: its timed phases as one table, each list of records (a soak's minutes) as a
table and a small line plot per measured column, the rest as a table of fields. Nothing is computed or rounded
beyond what the file holds, so the page can only show what was measured. A file that cannot be read is a
warning, which `mkdocs build --strict` turns into a failed build.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.benchmarks")
MARKER = "<!-- benchmark-results -->"
HEADER = ("date", "cpu", "commit", "command")


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    results = Path(config["config_file_path"]).parent / "benchmarks" / "results"
    sections = []
    for path in sorted(results.glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            log.warning("benchmarks/results/%s cannot be rendered: %s", path.name, error)
            continue
        sections.append(render(path.name, record))
    if not sections:
        log.warning("no results files in %s", results)
    return markdown.replace(MARKER, "\n\n".join(sections))


def render(name: str, record: dict) -> str:
    lines = [f"### {name.removesuffix('.json')}", ""]
    lines += [f"- **{key}**: `{record[key]}`" for key in HEADER if key in record]
    lines += [f"- **file**: `benchmarks/results/{name}`", ""]
    phases = {key: value for key, value in record.items() if isinstance(value, dict) and "seconds" in value}
    series = {key: value for key, value in record.items()
              if isinstance(value, list) and value and all(isinstance(item, dict) for item in value)}
    rest = {key: value for key, value in record.items() if key not in (*HEADER, *phases, *series)}
    if phases:
        lines += table("phase", phases) + [""]
    for key, rows in series.items():
        lines += [f"**{key}**", ""] + table(None, rows) + [""] + plots(key, rows) + [""]
    if rest:
        lines += ["| field | value |", "|---|---|"]
        lines += [f"| {key} | {cell(value)} |" for key, value in rest.items()] + [""]
    return "\n".join(lines)


def flat(row: dict) -> dict:
    """One level of nested records as `outer.inner` columns; logs (lists of text) left out."""
    out = {}
    for key, value in row.items():
        if isinstance(value, dict) and len(value) <= 4 and all(not isinstance(v, (dict, list)) for v in value.values()):
            out.update({f"{key}.{inner}": v for inner, v in value.items()})
        elif not (isinstance(value, list) and value and all(isinstance(v, str) for v in value) and key == "log"):
            out[key] = value
    return out


def table(first: str | None, rows) -> list[str]:
    named = list(rows.items()) if isinstance(rows, dict) else [(None, row) for row in rows]
    flats = [(name, flat(row)) for name, row in named]
    columns = list(dict.fromkeys(column for _, row in flats for column in row))
    head = ([first] if first else []) + columns
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in flats:
        cells = ([f"`{name}`"] if first else []) + [cell(row.get(column, "")) for column in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def cell(value) -> str:
    if isinstance(value, dict):
        text = ", ".join(f"{key}: {cell(v)}" for key, v in value.items())
    elif isinstance(value, list):
        text = ", ".join(cell(v) for v in value) if value else "none"
    elif value is None:
        text = "—"
    else:
        text = str(value)
    # brackets escaped: a mutant's code (`peaks['int8']`) would read as a link reference, which the strict build refuses
    return text.replace("|", "\\|").replace("[", "\\[").replace("]", "\\]").replace("\n", " ")


def plots(key: str, rows: list[dict]) -> list[str]:
    """A small inline SVG line per numeric column over the rows (the first column is the x axis)."""
    if len(rows) < 5:
        return []
    first = next(iter(rows[0]))
    columns = [c for c, v in rows[0].items() if c != first and isinstance(v, (int, float)) and not isinstance(v, bool)]
    out = []
    for column in columns:
        values = [row.get(column) for row in rows]
        if not all(isinstance(v, (int, float)) for v in values):
            continue
        low, high = min(values), max(values)
        span = (high - low) or 1.0
        width, height, pad = 320, 80, 4
        points = " ".join(f"{pad + i * (width - 2 * pad) / (len(values) - 1):.1f},"
                          f"{height - pad - (v - low) / span * (height - 2 * pad):.1f}" for i, v in enumerate(values))
        out.append(f'<figure markdown="0" style="display:inline-block;margin:0 1em 1em 0">'
                   f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
                   f'aria-label="{column} by {first}"><rect width="{width}" height="{height}" fill="none" '
                   f'stroke="#ccc"/><polyline fill="none" stroke="#3f51b5" stroke-width="1.5" points="{points}"/></svg>'
                   f"<figcaption><code>{column}</code> by {first}: {low} to {high}</figcaption></figure>")
    return out
