"""Several generations on one bundle at once, batched call by call: what every kind's batch shares.

Each generation runs its kind's unchanged loop in a thread of its own on a `MemberBackend`, whose model calls
go through the batch's `Batcher` (generation.batching): the LM steps of all running streams are one call over
rows of one shared KV cache (`rows_per_stream` rows each: the two CFG rows of a TTS stream, one for ASR), the
diffusion head's conditioning and sampler steps one call each, and what a kind adds (connectors, EOS, the LM
head) one call each. What cannot be batched (a prompt's prefill, text windows, the streaming decoders and
encoders, whose conv states are exported for one stream) runs alone, in turn with the batches. A stream that
stops frees its rows at once; up to `max_streams` run, more wait for a free place.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from ..generation.batching import Batcher, Member, member_frames, parked_iteration
from ..options import check
from .device import host
from .lm import BatchedGuidedStreams, KvCache, OnnxLm, conditioning_rows, head_stepper

F32 = np.float32
BATCH_CAPACITY = 1024  # positions a batch's shared cache starts with (a voice prompt and a minute of speech)


def split_rows(array: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    return np.split(array, np.cumsum(sizes)[:-1])


def row_executor(run: Callable[[np.ndarray], np.ndarray]) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """A Batcher executor for a graph whose rows are independent: the payloads' rows in one call, split back."""
    return lambda arrays: split_rows(run(np.concatenate(arrays)), [len(array) for array in arrays])


class StreamBatch:
    """The batch of one bundle (see the module docstring). A kind's subclass names its member backend and the
    executors it adds; `run_loop(backend)` is the generation a stream runs (see `frames`).

        batch = model.batch(max_streams=4)
        speeches = [model.stream(..., batch=batch) for ...]  # read each from any thread
    """

    member_backend: type["MemberBackend"]

    def __init__(self, backend, lm: OnnxLm, max_streams: int, rows_per_stream: int, capacity: int,
                 executors: dict[str, Callable] | None = None):
        self.backend, self.lm, self.rows_per_stream = backend, lm, rows_per_stream
        # Taken at once (first-touching fresh pages mid-stream cost 0.3-0.4 s a stream on these VMs) and doubled,
        # one copy, only when the longest stream needs it: memory follows the longest stream, not the context.
        self.cache = KvCache(lm, rows_per_stream * check("max_streams", max_streams), capacity, resident=True)
        self.batcher = Batcher({"lm_step": self._lm_step, "conditioning": self._conditioning,
                                "head_step": self._head_step, **(executors or {})}, max_streams)

    def rows(self, member: Member) -> list[int]:
        """The shared cache's rows of `member` (its positive row first, for a CFG pair)."""
        first = self.rows_per_stream * member.slot
        return list(range(first, first + self.rows_per_stream))

    def describe(self) -> dict:
        """The batch's room, its streams now, and its LM steps so far: those that served several streams at
        once, and the most streams one served."""
        sizes = self.batcher.batches.get("lm_step", [])
        return {"max_streams": self.batcher.max_members, "streams": len(self.batcher.live()),
                "shared_steps": sum(size > 1 for size in sizes), "largest_batch": max(sizes, default=0)}

    def frames(self, run_loop: Callable[[Any], Iterator[Any]]) -> Iterator[Any]:
        """What `run_loop(backend)` yields, run as a member of the batch on the member's backend."""
        return member_frames(self.batcher, lambda member: run_loop(self.member_backend(self, member)))

    def _lm_step(self, payloads):
        """(rows, embeds [len(rows), 1, H]) per stream -> hidden [len(rows), H] per stream, in one LM call."""
        live = {row for member in self.batcher.live() for row in self.rows(member)}
        stale = [row for row in range(len(self.cache.lengths)) if row not in live]
        self.cache.lengths[stale] = 0  # rows of a stream that left: nothing of theirs is attended to again
        rows = [row for stream_rows, _ in payloads for row in stream_rows]
        hidden = self.lm.step_rows(rows, np.concatenate([embeds for _, embeds in payloads]), self.cache)
        return split_rows(hidden, [len(stream_rows) for stream_rows, _ in payloads])

    def _conditioning(self, payloads):
        pairs = [conditioning_rows(conditions, timesteps) for conditions, timesteps in payloads]
        # on the host: each frame a batch step gathers rows of several streams' modulations, which no one
        # block of device memory holds (a stream alone keeps its own on the device)
        modulation = host(self.backend.head.modulation(np.concatenate([t for t, _ in pairs]),
                                                       np.concatenate([c for _, c in pairs])))
        return split_rows(modulation, [len(t) for t, _ in pairs])

    def _head_step(self, payloads):
        velocity = self.backend.head.run_step(np.concatenate([n for n, _ in payloads]),
                                              np.concatenate([host(m) for _, m in payloads]))
        return split_rows(velocity, [len(n) for n, _ in payloads])


class MemberBackend:
    """One stream's backend in a StreamBatch: the lone backend's methods, those that run a model made through
    the batcher: batched where a subclass says how, else (the names in `alone_calls`) one by one in turn with
    the batches. What needs no model (embeddings, scaling, fresh states) is the lone backend's as it is."""

    alone_calls: frozenset[str] = frozenset({"velocity"})

    def __init__(self, batch: StreamBatch, member: Member):
        self.base, self.batch, self.member = batch.backend, batch, member

    def __getattr__(self, name):
        attribute = getattr(self.base, name)
        if name in self.alone_calls:
            return lambda *args: self._alone(lambda: attribute(*args))
        return attribute

    def _call(self, kind: str, payload):
        return self.batch.batcher.call(self.member, kind, payload)

    def _alone(self, thunk):
        return self.batch.batcher.alone(self.member, thunk)

    @property
    def rows(self) -> list[int]:
        return self.batch.rows(self.member)

    def waited(self, items):
        """`items` (text streamed in), each waited for parked: the batch runs on without this stream meanwhile."""
        return parked_iteration(self.batch.batcher, self.member, items)

    def head_at(self, conditions, timesteps):
        modulation = self._call("conditioning", (conditions, timesteps))
        return head_stepper(modulation, len(conditions), timesteps,
                            lambda noisy, modulation: self._call("head_step", (noisy, modulation)))


class MemberGuidedStreams(BatchedGuidedStreams):
    """A member's two CFG rows of the shared cache: speech steps batched with the other streams', text and a
    lone negative step in turn with the batches."""

    def __init__(self, backend: MemberBackend):
        super().__init__(backend.batch.lm, backend.batch.cache, backend.rows[0])
        self.backend = backend

    def text(self, embeds):
        return self.backend._alone(lambda: BatchedGuidedStreams.text(self, embeds))

    def negative(self, embeds):
        return self.backend._alone(lambda: BatchedGuidedStreams.negative(self, embeds))

    def speech(self, embeds):
        hidden = self.backend._call("lm_step", (self.backend.rows, np.concatenate([embeds, embeds])))
        return hidden[0:1], hidden[1:2]
