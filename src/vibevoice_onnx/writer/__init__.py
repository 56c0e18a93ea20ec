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
                log: Callable[[str], None], scheme=None) -> tuple[Path, dict]:
    """Write one graph with `body`, its linear layers' weights quantized as they are written where `scheme`
    (export.precision's) says; returns its path and its manifest additions (what `body` returns, and what the
    scheme made of it)."""
    g = GraphWriter(name, directory, external=weight_bytes > EXTERNAL_DATA_BYTES, scheme=scheme)
    try:
        extra = body(g) or {}
    except BaseException:
        g.abandon()
        raise
    path = g.save()
    precision = g.describe_precision()
    if precision is None:
        log(f"  wrote {name} ({g.weight_bytes / 1e6:.1f} MB of weights)")
    else:
        log(f"  wrote {name}: {precision['scheme']}, {g.fp32_bytes / 1e6:.1f} -> {g.weight_bytes / 1e6:.1f} MB")
    return path, {**extra, **({"precision": precision} if precision else {})}
