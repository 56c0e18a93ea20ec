"""Graphs written from a checkpoint's config and safetensors without PyTorch: the torch-free builder.

`graph.GraphWriter` writes one graph node by node with its weights streamed to disk; `blocks` holds the pieces
every kind is made of; each kind that has a writer names its module in its family record (`writer`), which
gives `graphs(checkpoint, directory, log)` and `host_tensors(checkpoint)`. The graphs are the traced export's
(export/graphs.py) operator for operator, proven equal to it in tests/test_writer.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .graph import EXTERNAL_DATA_BYTES, GraphWriter


def write_graph(name: str, directory: Path, weight_bytes: int, body: Callable[[GraphWriter], dict | None],
                log: Callable[[str], None]) -> tuple[Path, dict]:
    """Write one graph with `body`; returns its path and its manifest additions (what `body` returns)."""
    g = GraphWriter(name, directory, external=weight_bytes > EXTERNAL_DATA_BYTES)
    try:
        extra = body(g) or {}
    except BaseException:
        g.abandon()
        raise
    path = g.save()
    log(f"  wrote {name} ({g.weight_bytes / 1e6:.1f} MB of weights)")
    return path, extra
