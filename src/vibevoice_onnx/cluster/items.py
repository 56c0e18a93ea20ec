"""The items of a batch job and where their results go: one output and one manifest row per item id.

Everything here is plain Python (no Ray): the job's driver reads the items and the finished rows, the workers
write each item's output and row, each through a temporary name renamed when complete, so a worker that dies
mid-item leaves nothing half-written and a redone item replaces its row instead of adding one.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import VibeVoiceError
from ..outputs import atomic_file, file_error, write_if_changed

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")  # a file name on every system, never a path
AUDIO_SUFFIXES = {".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".aiff", ".aif"}
TASKS = {"synthesize": ("audio", ".wav"), "transcribe": ("transcripts", ".json")}
STOPPED = "stopped"  # a worker's answer when the file system had no room: never written, the job stops on it


@dataclass
class Row:
    """An item's line of the manifest."""

    id: str
    status: str  # "ok" or "error" (or STOPPED, handed back but never written)
    output: str | None
    audio_seconds: float | None
    tokens: int | None
    seconds: float
    error: str | None = None
    worker: str | None = None  # the node and process that made it (a job spread over nodes shows here)


class JobFolder:
    """OUT: outputs in OUT/audio or OUT/transcripts, one row per item in OUT/rows/ID.json, the manifest beside."""

    def __init__(self, out: Path, task: str):
        self.out, self.task = Path(out), task
        folder, self.suffix = TASKS[task]
        self.outputs, self.rows = self.out / folder, self.out / "rows"

    def prepare(self) -> None:
        try:
            for folder in (self.outputs, self.rows):
                folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise file_error(e, "creating the output folders", self.out) from None

    def output(self, item_id: str) -> Path:
        return self.outputs / f"{item_id}{self.suffix}"

    def write_row(self, row: Row) -> None:
        with atomic_file(self.rows / f"{row.id}.json", "writing the manifest row") as partial:
            partial.write_text(json.dumps(asdict(row)), encoding="utf-8")

    def read_rows(self) -> dict[str, Row]:
        """The rows written so far, by id (a row file that cannot be read counts as not written)."""
        rows = {}
        for path in sorted(self.rows.glob("*.json")) if self.rows.is_dir() else ():
            try:
                row = Row(**json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError, TypeError):
                continue
            rows[row.id] = row
        return rows

    def complete(self) -> set[str]:
        """Ids done for good: their row says ok and their output is there (what a rerun skips)."""
        return {row.id for row in self.read_rows().values()
                if row.status == "ok" and row.output and Path(row.output).is_file()}

    def write_manifest(self, ids: list[str]) -> list[Row]:
        """OUT/manifest.jsonl and OUT/manifest.parquet: one row per item id, in the items' order. A manifest that
        already says this is left untouched, so a rerun of a finished job changes no file."""
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = self.read_rows()
        ordered = [rows[item_id] for item_id in ids if item_id in rows]
        lines = "".join(json.dumps(asdict(row)) + "\n" for row in ordered).encode("utf-8")
        write_if_changed(self.out / "manifest.jsonl", lines, "writing the manifest")
        table = pa.Table.from_pylist([asdict(row) for row in ordered], schema=pa.schema([
            ("id", pa.string()), ("status", pa.string()), ("output", pa.string()), ("audio_seconds", pa.float64()),
            ("tokens", pa.int64()), ("seconds", pa.float64()), ("error", pa.string()),
            ("worker", pa.string())]))
        parquet = io.BytesIO()
        pq.write_table(table, parquet)
        write_if_changed(self.out / "manifest.parquet", parquet.getvalue(), "writing the manifest")
        return ordered


def read_items(path: Path, task: str) -> list[dict]:
    """The items of a job: a JSONL file (one object with an "id" a line), or for transcription a folder of
    audio files (id: the file's name without its suffix). Stops with one sentence on anything that would make
    the job ambiguous (no id, a repeated id, an id that is not a plain file name) or unreadable."""
    path = Path(path)
    if task == "transcribe" and path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file())
        if not files:
            raise VibeVoiceError(f"{path}: holds no audio files ({', '.join(sorted(AUDIO_SUFFIXES))})")
        items = [{"id": p.stem, "audio": str(p)} for p in files]
    else:
        items = _jsonl(path)
        if task == "transcribe":
            for item in items:
                if "audio" in item and "id" not in item:
                    item["id"] = Path(str(item["audio"])).stem
                if isinstance(item.get("audio"), str) and not Path(item["audio"]).is_absolute():
                    item["audio"] = str(path.parent / item["audio"])  # relative to the manifest, as a user writes it
    seen: set[str] = set()
    for number, item in enumerate(items, 1):
        item_id = item.get("id")
        if not isinstance(item_id, str) or not ID_PATTERN.fullmatch(item_id):
            raise VibeVoiceError(f"{path}: item {number} has no usable id ({item_id!r}): give each a string of letters, "
                                 "digits, '.', '_' or '-', as it names the item's output file")
        if item_id in seen:
            raise VibeVoiceError(f"{path}: the id '{item_id}' is given twice; every item needs its own")
        seen.add(item_id)
    return items


def _jsonl(path: Path) -> list[dict]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else e
        raise VibeVoiceError(f"{path}: cannot read the items file ({reason})") from None
    items = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as e:
            raise VibeVoiceError(f"{path}: line {number} is not JSON ({e})") from None
        if not isinstance(item, dict):
            raise VibeVoiceError(f"{path}: line {number} is not a JSON object")
        items.append(item)
    if not items:
        raise VibeVoiceError(f"{path}: holds no items")
    return items
