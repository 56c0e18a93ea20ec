"""Several generation loops run together, so the model calls they make at the same moment are made as one.

Each loop runs unchanged in its own thread, on a backend whose model calls go through a `Batcher`: a call waits
until every member that is running has made one, then the last to arrive runs them all, those of one kind in one
batch (one read of the weights for all streams), and hands each member its part. A member that waits for
something else (streamed text) is `parked` meanwhile and holds nobody up; members join and leave at any call,
so streams come and go frame by frame (continuous batching). With one member every call runs at once: the
single-stream loop is the batch of one.
"""

from __future__ import annotations

import queue
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..errors import VibeVoiceError

ALONE = "alone"  # the kind of calls run one by one, in turn with the batches
# kind -> run(payloads) -> one result per payload, in order
Executor = Callable[[list[Any]], list[Any]]


class StreamCancelled(VibeVoiceError):
    """The stream was cancelled: its loop stops at its next model call and its rows are freed."""


@dataclass(eq=False)
class _Call:
    member: "Member"
    kind: str
    payload: Any
    done: bool = False
    result: Any = None
    error: BaseException | None = None


@dataclass(eq=False)
class Member:
    """One stream's place in the batch: `slot` is a small integer it keeps while it is a member (the row
    block a backend gives it in its shared caches)."""

    slot: int
    cancelled: bool = False
    parked: bool = False


class Batcher:
    """Gathers the model calls of its members and runs them kind by kind (see the module docstring).

    `executors` maps a call's kind to the function that runs a batch of them. `max_members` bounds the slots;
    `batches` counts the batches run of each kind and the calls in them (the bench reports it)."""

    def __init__(self, executors: dict[str, Executor], max_members: int):
        if max_members < 1:
            raise VibeVoiceError(f"a batch needs room for at least one stream, got {max_members}")
        self.executors, self.max_members = executors, max_members
        self._lock = threading.Condition()
        self._members: list[Member] = []
        self._pending: list[_Call] = []
        self.batches: dict[str, list[int]] = {}

    def live(self) -> list[Member]:
        with self._lock:
            return list(self._members)

    def join(self) -> Member:
        """A new member in the lowest free slot; waits for one while all are taken."""
        with self._lock:
            while len(self._members) >= self.max_members:
                self._lock.wait()
            taken = {member.slot for member in self._members}
            member = Member(next(slot for slot in range(self.max_members) if slot not in taken))
            self._members.append(member)
            return member

    def leave(self, member: Member) -> None:
        with self._lock:
            self._members.remove(member)
            self._lock.notify_all()  # a joiner may take the slot
            self._run_if_ready()

    def cancel(self, member: Member) -> None:
        """Stop `member` at its next call (from any thread); its loop raises StreamCancelled."""
        with self._lock:
            member.cancelled = True
            self._lock.notify_all()

    @contextmanager
    def parked(self, member: Member) -> Iterator[None]:
        """Around a wait for something outside the batch: the others' calls run without this member's."""
        with self._lock:
            member.parked = True
            self._run_if_ready()
        try:
            yield
        finally:
            with self._lock:
                member.parked = False

    def call(self, member: Member, kind: str, payload: Any) -> Any:
        """Make a model call of `kind` as part of the next batch; returns this call's result."""
        with self._lock:
            if member.cancelled:
                raise StreamCancelled("the stream was cancelled")
            call = _Call(member, kind, payload)
            self._pending.append(call)
            self._run_if_ready()
            while not call.done:
                self._lock.wait()
        if call.error is not None:
            raise call.error
        return call.result

    def alone(self, member: Member, thunk: Callable[[], Any]) -> Any:
        """`thunk()` in turn with the batches (it may touch what they share), not batched with anything."""
        return self.call(member, ALONE, thunk)

    def _run_if_ready(self) -> None:
        """With the lock held: once every running member has a call pending, this thread runs a round: the calls
        made alone, and the batch of the kind most members wait at. The members at other kinds wait on, so
        streams that drifted apart fall into step again: on a tie the kind a member came to last runs (the
        stream that moves keeps moving until it reaches the others), and while calls are made alone a batch
        runs beside them only for most of the running members (a stream that prefills or decodes alone is
        waited for by the one other stream, not left a call behind it for good)."""
        running = sum(not member.parked for member in self._members)
        waiting = {id(call.member) for call in self._pending}
        if not self._pending or len(waiting) < running:
            return
        counts: dict[str, int] = {}
        latest: dict[str, int] = {}
        for order, call in enumerate(self._pending):
            if call.kind != ALONE:
                counts[call.kind] = counts.get(call.kind, 0) + 1
                latest[call.kind] = order
        chosen = max(counts, key=lambda kind: (counts[kind], latest[kind]), default=None)
        if chosen is not None and 2 * counts[chosen] <= running and any(c.kind == ALONE for c in self._pending):
            chosen = None
        calls = [call for call in self._pending if call.kind in (ALONE, chosen)]
        self._pending = [call for call in self._pending if call.kind not in (ALONE, chosen)]
        self._lock.release()  # the model runs without the lock: members may park, cancel or join meanwhile
        try:
            self._execute(calls)
        finally:
            self._lock.acquire()
        # Done only now, all at once: no member goes on (and touches what the batch shares, such as its cache
        # rows' lengths) while any call of this round still runs.
        for call in calls:
            call.done = True
        self._lock.notify_all()

    def _execute(self, calls: list[_Call]) -> None:
        by_kind: dict[str, list[_Call]] = {}
        for call in calls:
            by_kind.setdefault(call.kind, []).append(call)
        for kind, group in by_kind.items():
            self.batches.setdefault(kind, []).append(len(group))
            try:
                run = self.executors[kind] if kind != ALONE else lambda thunks: [thunk() for thunk in thunks]
                results = run([call.payload for call in group])
                for call, result in zip(group, results, strict=True):
                    call.result = result
            except BaseException as error:  # every member of the batch learns of it, none is left waiting
                for call in group:
                    call.error = error


AHEAD = 8  # items a member may make before its reader takes them (a frame each: about a second of audio)


def member_frames(batcher: Batcher, frames_of: Callable[[Member], Iterator[Any]]) -> Iterator[Any]:
    """What the loop `frames_of(member)` yields, the loop run in a thread of its own as a member of `batcher`.

    The member joins when the first item is asked for (so a stream made but never read holds nobody up) and
    leaves when its loop ends. It runs at most AHEAD items ahead of its reader and waits parked beyond that, so
    a slow reader slows only its own stream and holds no unbounded audio. Closing the iterator cancels the loop
    at its next model call (or its next wait for the reader); an error in the loop is raised here."""
    member = batcher.join()
    items: queue.SimpleQueue = queue.SimpleQueue()
    room = threading.Semaphore(AHEAD)

    def wait_for_room() -> None:
        if room.acquire(blocking=False):
            return
        with batcher.parked(member):
            while not room.acquire(timeout=0.05):
                if member.cancelled:
                    raise StreamCancelled("the stream was cancelled")

    def work() -> None:
        error = None
        try:
            for item in frames_of(member):
                wait_for_room()
                items.put((True, item))
        except BaseException as exception:  # handed to the reader
            error = exception
        finally:
            batcher.leave(member)
            items.put((False, error))

    threading.Thread(target=work, name=f"stream-{member.slot}", daemon=True).start()
    try:
        while True:
            more, item = items.get()
            if not more:
                if item is not None:
                    raise item
                return
            room.release()
            yield item
    finally:
        batcher.cancel(member)


def parked_iteration(batcher: Batcher, member: Member, items) -> Iterator[Any]:
    """`items`, each waited for as a parked member (text streamed in: the batch runs on without it)."""
    iterator = iter(items)
    while True:
        with batcher.parked(member):
            item = next(iterator, _END)
        if item is _END:
            return
        yield item


_END = object()


def read_together(streams: list[Iterator[Any]], late: int | None = None, after: int = 0,
                  timeout: float | None = 600, on_item: Callable[[int], None] | None = None) -> None:
    """Read every stream to its end, each in its own thread, calling `on_item(stream index)` as each item
    arrives; stream `late` is first read once stream 0 has given `after` items (a stream that joins a running
    batch). Raises the first error a stream raised, or one if a stream is not done within `timeout` s."""
    first_items, errors = threading.Event(), []

    def read(index: int, stream: Iterator[Any]) -> None:
        try:
            if index == late:
                first_items.wait(timeout)
            for count, _ in enumerate(stream, 1):
                if on_item is not None:
                    on_item(index)
                if index == 0 and count == after:
                    first_items.set()
        except BaseException as error:  # raised in the caller's thread
            errors.append(error)
        finally:
            if index == 0:
                first_items.set()

    threads = [threading.Thread(target=read, args=pair, daemon=True) for pair in enumerate(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        if thread.is_alive():
            raise VibeVoiceError(f"a batched stream did not finish within {timeout:g} s")
    if errors:
        raise errors[0]
