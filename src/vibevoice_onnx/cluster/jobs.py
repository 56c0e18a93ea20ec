"""`vibevoice-onnx batch synthesize|transcribe`: a job of many items as a Ray Data pipeline.

The items (cluster.items) that are not complete yet go through one `map_batches` stage whose callable class
(cluster.workers) opens the bundle once per worker, in an actor pool of `workers`; each worker writes its
items' outputs and rows itself, so results stream to disk as they are made. Ray restarts a worker that dies and
resubmits its item, which then replaces its own half-made output (never written: a temporary name) and row.
When the stage is done, the manifest is written from the rows, one per item. A file system that runs out of
room stops the job at the first item that finds none (one sentence; that item and those after are made by the
next run), instead of failing every item after it. Without an address, a local cluster is started for the
job and stopped after it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

from ..errors import StorageFull, VibeVoiceError
from ..outputs import remove_stale_partials
from .items import STOPPED, JobFolder, read_items
from .ray_cluster import connect
from .workers import WORKERS

PROGRESS_EVERY = 10  # items between progress lines


def check_bundle(task: str, bundle: Path, force: bool) -> None:
    """Stop before any cluster starts if the bundle is missing, of the wrong kind, or not usable."""
    from ..families import kinds_that
    from ..runtime.bundle import Bundle

    opened = Bundle(Path(bundle))
    kinds = kinds_that(speaks=True) if task == "synthesize" else kinds_that(transcribes=True, streams=False)
    if opened.kind not in kinds:
        wanted = "a TTS" if task == "synthesize" else "an ASR"
        raise VibeVoiceError(f"{bundle}: is a {opened.kind} bundle; batch {task} needs {wanted} bundle")
    if not force:
        opened.require_usable()


def run_job(task: str, bundle: Path, items_path: Path, out: Path, address: str | None = None, workers: int = 1,
            threads_per_worker: int | None = None, force: bool = False, log: Callable[[str], None] = print,
            worker_class=None, defaults: dict | None = None) -> dict:
    """Run the job to its end and write its manifest; returns counts. `defaults`: fields every item has
    unless it gives its own (a folder's recordings have none). `worker_class` replaces the task's worker
    (tests make one that dies)."""
    if workers < 1:
        raise VibeVoiceError(f"--workers must be at least 1, got {workers}")
    check_bundle(task, bundle, force)
    items = [{**(defaults or {}), **item} for item in read_items(items_path, task)]
    folder = JobFolder(out, task)
    folder.prepare()
    sweep(folder)
    done = folder.complete()
    pending = [item for item in items if item["id"] not in done]
    log(f"{len(items)} items: {len(done)} already complete, {len(pending)} to make with {workers} worker(s)")
    start = time.perf_counter()
    if pending:
        threads = threads_per_worker or max(1, (os.cpu_count() or 1) // workers)
        try:
            _run_pipeline(pending, worker_class or WORKERS[task], dict(bundle=str(Path(bundle).resolve()),
                          out=str(Path(out).resolve()), threads=threads, force=force), address, workers, log, start)
        except StorageFull as e:  # no item's fault: every item after would fail the same way
            complete = len(folder.complete() & {item["id"] for item in items})
            raise StorageFull(f"{e}; the job stopped with {complete} of {len(items)} items complete (run it again "
                              "once there is room, and it makes the rest)") from None
        finally:
            sweep(folder)  # what a worker that died mid-item had begun writing (Ray made the item again)
    rows = folder.write_manifest([item["id"] for item in items])
    failed = [row for row in rows if row.status != "ok"]
    wall = time.perf_counter() - start
    audio = sum(row.audio_seconds or 0 for row in rows if row.id not in done)
    log(f"done: {len(rows) - len(failed)} complete, {len(failed)} failed, {len(pending)} made in {wall:.1f} s; "
        f"manifest {folder.out / 'manifest.jsonl'}")
    return {"items": len(items), "skipped": len(done), "made": len(pending), "failed": len(failed),
            "wall_seconds": wall, "audio_seconds": audio, "rows": rows}


def sweep(folder: JobFolder) -> None:
    """Remove the half-written outputs and rows of processes that are gone (a killed worker's, or a killed run's)."""
    for stale in (folder.outputs, folder.rows):
        remove_stale_partials(stale)


def _run_pipeline(pending: list[dict], worker_class, worker_options: dict, address: str | None, workers: int,
                  log: Callable[[str], None], start: float) -> None:
    import ray
    import ray.data

    # logical CPUs beyond the cores, so the read tasks are not starved by the workers (which mostly wait in ONNX)
    started_here = connect(address, cpus=max(2 * (os.cpu_count() or 1), workers + 2))
    try:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # our own lines below say items, failures and audio per second
        dataset = ray.data.from_items([{"id": item["id"], "item": json.dumps(item)} for item in pending])
        rows = dataset.map_batches(worker_class, batch_size=1, fn_constructor_kwargs=worker_options,
                                   compute=ray.data.ActorPoolStrategy(size=workers), num_cpus=1)
        made = failed = 0
        audio = 0.0
        for row in rows.iter_rows():
            if row["status"] == STOPPED:
                raise StorageFull(row["error"])
            made += 1
            failed += row["status"] != "ok"
            audio += row["audio_seconds"] or 0.0
            if made % PROGRESS_EVERY == 0 or made == len(pending):
                wall = time.perf_counter() - start
                log(f"{made}/{len(pending)} items, {failed} failed, {audio / wall:.2f} s of audio per wall second")
    finally:
        if started_here:
            ray.shutdown()
