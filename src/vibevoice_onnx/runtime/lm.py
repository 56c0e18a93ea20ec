"""ONNX pieces every kind's runtime shares: a language-model graph with its KV cache, both CFG streams in one
batched call, the diffusion head's two graphs, and a streaming conv stack with its states."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import VibeVoiceError
from .bundle import Bundle
from .device import Placement, Region, host, shape_of

F32 = np.float32


def flat_cache(layers) -> list[np.ndarray]:
    """(K, V) per layer -> the flat list of float32 arrays the graphs take."""
    return [np.ascontiguousarray(t, dtype=F32) for pair in layers for t in pair]


ALL_ROWS, POSITIVE, NEGATIVE = slice(None), slice(0, 1), slice(1, 2)
MIN_CAPACITY = 256  # positions a cache starts with; it doubles when a step would pass it


class KvCache:
    """The KV cache of one LM graph for `rows` streams, each of its own length, in one buffer per layer's K and
    V of a fixed capacity [rows, KV, capacity, D]. Row r holds its positions [0, lengths[r]); what lies beyond
    is never read. In place (the runtime's form), the graph writes each step's keys and values into these
    buffers (past and present bound to the same memory), so a step costs its attention over the filled part
    and no copy of what came before; the capacity doubles (one copy) only when a step would pass it. Not in
    place (`in_place=False`, the growing form verify gates it against), every call returns a longer copy, as
    the graphs' caches grew before. Zeroed buffers cost memory only where written, unless `resident`:
    a run that knows its length sizes its cache for it and writes it all at once, so its memory is taken before
    its first step (a run that cannot fit fails at its start, not minutes in) and stays flat to its end."""

    def __init__(self, lm: "OnnxLm", rows: int = 1, capacity: int = MIN_CAPACITY, in_place: bool = True,
                 resident: bool = False):
        self.lm, self.in_place = lm, in_place
        # in place, the buffers live where the graph runs (device memory on CUDA, runtime.device); growing, on the host
        self.placement = lm.placement if in_place else Placement(bound=False)
        self.lengths = np.zeros(rows, np.int64)
        self.buffers = [self.placement.zeros((rows, heads, capacity if in_place else 0, dim)) for heads, dim in lm.kv_shapes]
        if resident and not self.placement.device_buffers:
            for buffer in self.buffers:
                buffer.fill(0)  # np.zeros maps its pages lazily; writing them makes them the process's now

    @classmethod
    def planned(cls, lm: "OnnxLm", rows: int, length: int, planned: int | None, limit: int,
                in_place: bool = True) -> "KvCache":
        """A cache for rows that will hold `length` positions and then `planned` more, at most `limit` in all
        (resident), or, where `planned` is None (a run of unknown length), room for twice `length`, grown as
        needed."""
        if planned is None or not in_place:
            return cls(lm, rows, max(MIN_CAPACITY, 2 * length) if in_place else 0, in_place)
        return cls(lm, rows, max(length, min(limit, length + planned)), in_place, resident=True)

    @classmethod
    def of_streams(cls, lm: "OnnxLm", streams: list[list[np.ndarray]], in_place: bool = True,
                   planned: int | None = None, limit: int = 0) -> "KvCache":
        """A cache whose row r starts as stream r's flat K/V list ([1, KV, P_r, D] each; a voice preset's),
        sized as `planned` asks (see `planned`)."""
        longest = max(stream[0].shape[2] for stream in streams)
        cache = cls.planned(lm, len(streams), longest, planned, limit, in_place)
        for row, stream in enumerate(streams):
            cache.load(row, stream)
        return cache

    def load(self, row: int, stream: list[np.ndarray]) -> None:
        """Row `row` starts afresh as `stream`, a flat K/V list [1, KV, P, D] each."""
        length = stream[0].shape[2]
        self.reserve(length)
        for buffer, tensor in zip(self.buffers, stream):
            self.placement.write(buffer, (row, slice(None), slice(0, length)), tensor[0])
        self.lengths[row] = length

    @property
    def capacity(self) -> int:
        return shape_of(self.buffers[0])[2]

    def reserve(self, length: int) -> None:
        if length <= self.capacity:
            return
        grown = max(length, 2 * self.capacity) if self.in_place else length
        for i, old in enumerate(self.buffers):  # one layer at a time, each old buffer freed once copied
            old = host(old)
            new = np.zeros(old.shape[:2] + (grown,) + old.shape[3:], F32)
            new[:, :, : old.shape[2]] = old
            self.buffers[i] = self.placement.upload(new)

    def filled(self, row: int = 0) -> list[np.ndarray]:
        """Row `row`'s cached K/V, [1, KV, length, D] each (views of host buffers; copies of device ones)."""
        return [host(buffer)[row : row + 1, :, : self.lengths[row]] for buffer in self.buffers]

    def forget(self, row: int, steps: int = 1) -> None:
        """Take back the last `steps` positions of `row`: the next step overwrites them."""
        self.lengths[row] -= steps

    def truncated(self, row: int, length: int) -> "KvCache":
        """The cache with `row` holding its first `length` positions only (LmStream's `truncate`)."""
        if not 0 <= length <= self.lengths[row]:
            raise VibeVoiceError(f"row {row} holds {self.lengths[row]} positions, so it cannot keep {length}")
        self.lengths[row] = length
        return self

    def restart(self, row: int) -> None:
        """Forget everything `row` has seen: its next token sits at position 0 and attends to itself only."""
        self.lengths[row] = 0


class OnnxLm:
    """One LM graph over a KvCache: inputs_embeds, position_ids, seqlens_k, total_sequence_length and the past
    K/V -> hidden states and the present K/V (see export.graphs.LanguageModelGraph)."""

    def __init__(self, bundle: Bundle, name: str):
        self.name, self.session, self.placement = name, bundle.session(name), bundle.placement
        inputs, outputs = bundle.graph(name)["inputs"], bundle.graph(name)["outputs"]
        if [i["name"] for i in inputs[:2]] != ["inputs_embeds", "position_ids"] or inputs[2]["name"] != "seqlens_k":
            raise VibeVoiceError(f"{bundle.path}: graph {name} is not an LM over a fixed-capacity cache; rebuild the bundle")
        self.past = [i["name"] for i in inputs[4:]]
        self.present = [o["name"] for o in outputs[1:]]
        self.kv_shapes = [(i["shape"][1], i["shape"][3]) for i in inputs[4:]]

    def run(self, embeds: np.ndarray, cache: KvCache, rows: slice = ALL_ROWS) -> np.ndarray:
        """The rows `rows` of `cache` take `embeds` [rows, S, H] at their next positions: hidden [rows, S, H].
        Several rows take one token each; a row alone takes any number (onnxruntime's kernel allows no more)."""
        count, lengths = embeds.shape[1], cache.lengths[rows]
        if count > 1 and len(lengths) > 1 and lengths.any():
            raise VibeVoiceError(f"{self.name}: {len(lengths)} rows with a cache take one token each, not {count}")
        total = int(lengths.max()) + count
        cache.reserve(total)
        feeds = {"inputs_embeds": np.ascontiguousarray(embeds, dtype=F32),
                 "position_ids": (lengths[:, None] + np.arange(count)).astype(np.int64),
                 "seqlens_k": (lengths + count - 1).astype(np.int32),
                 "total_sequence_length": np.array(total, np.int32)}
        hidden = self._in_place(feeds, cache, rows) if cache.in_place else self._growing(feeds, cache, rows, total)
        cache.lengths[rows] += count
        return hidden

    def step_rows(self, rows: list[int], embeds: np.ndarray, cache: KvCache) -> np.ndarray:
        """One token for each of `rows` (any rows of the cache, in any order; embeds [len(rows), 1, H]) in one
        call: hidden [len(rows), H]. The graph runs over the block of rows up to the highest; a row of the block
        that is not in `rows` takes a zero token, whose keys land past its length and are never read, and keeps
        its length (its next step overwrites them)."""
        block = max(rows) + 1
        padded = np.zeros((block,) + embeds.shape[1:], F32)
        padded[rows] = embeds
        lengths = cache.lengths[:block].copy()
        hidden = self.run(padded, cache, slice(0, block))
        idle = np.setdiff1d(np.arange(block), rows)
        cache.lengths[idle] = lengths[idle]
        return hidden[rows, -1]

    def _in_place(self, feeds: dict, cache: KvCache, rows: slice) -> np.ndarray:
        blocks = [Region.rows(buffer, rows) for buffer in cache.buffers]  # rows are the outermost axis: contiguous
        feeds.update(zip(self.past, blocks))
        return self.session.run(["hidden_states"], feeds, into=dict(zip(self.present, blocks)))[0]

    def _growing(self, feeds: dict, cache: KvCache, rows: slice, total: int) -> np.ndarray:
        feeds.update(zip(self.past, (buffer[rows] for buffer in cache.buffers)))
        hidden, *present = self.session.run(None, feeds)
        cache.reserve(total)
        for buffer, new in zip(cache.buffers, present):
            buffer[rows, :, : new.shape[2]] = new
        return hidden

    def unbatched(self, embeds, positions, cache: KvCache):
        """generation.common.LmStream's `run`: a one-row cache, written in place (positions are its length)."""
        if positions[0, 0] != cache.lengths[0]:
            raise VibeVoiceError(f"{self.name}: position {positions[0, 0]} is not the cache's length {cache.lengths[0]}")
        return self.run(embeds, cache), cache


class BatchedGuidedStreams:
    """Both CFG streams of an LM in one batch-2 call per speech step (the weights are read once): row `row` of the
    cache is the positive stream, the next row the negative, each at its own length. Text goes to the positive
    row alone. verify gates this against the two streams run separately."""

    def __init__(self, lm: OnnxLm, cache: KvCache, row: int = 0):
        self.lm, self.cache, self.row = lm, cache, row

    @property
    def position(self) -> int:
        return int(self.cache.lengths[self.row])

    def text(self, embeds):
        return self.lm.run(embeds, self.cache, slice(self.row, self.row + 1))[:, -1]

    def negative(self, embeds):
        return self.lm.run(embeds, self.cache, slice(self.row + 1, self.row + 2))[:, -1]

    def speech(self, embeds):
        hidden = self.lm.run(np.concatenate([embeds, embeds]), self.cache, slice(self.row, self.row + 2))[:, -1]
        return hidden[0:1], hidden[1:2]

    def forget(self, stream: int, steps: int = 1) -> None:
        """Take back `stream`'s (0 positive, 1 negative) last `steps` positions."""
        self.cache.forget(self.row + stream, steps)

    def restart(self, stream: int) -> None:
        self.cache.restart(self.row + stream)


class OnnxDiffusionHead:
    """The diffusion head as the bundle splits it: a conditioning graph (timestep and condition -> every layer's
    modulation) and a step graph (noisy latent and modulation -> velocity). A frame's conditioning runs once for
    all its sampler steps, so its weights are read once per frame, not once per step."""

    def __init__(self, bundle: Bundle):
        self.conditioning = bundle.session("diffusion_head_conditioning")
        self.step = bundle.session("diffusion_head_step")

    def modulation(self, timesteps: np.ndarray, conditions: np.ndarray):
        """Every layer's modulation for (timestep, condition) rows: kept where the step graph runs (the device)."""
        feeds = {"timesteps": np.ascontiguousarray(timesteps, dtype=F32), "condition": np.ascontiguousarray(conditions, dtype=F32)}
        return self.conditioning.run(["modulation"], feeds, keep={"modulation"})[0]

    def run_step(self, noisy: np.ndarray, modulation) -> np.ndarray:
        return self.step.run(None, {"noisy_latents": np.ascontiguousarray(noisy, dtype=F32), "modulation": modulation})[0]

    def velocity(self, noisy, timesteps, conditions):
        """The whole head on one batch, each row at its own timestep."""
        return self.run_step(noisy, self.modulation(timesteps, conditions))

    def at(self, conditions: np.ndarray, timesteps: np.ndarray) -> Callable[[np.ndarray, float], np.ndarray]:
        """velocity(noisy, t) for the rows of `conditions` at each of `timesteps`, conditioned in one call."""
        modulation = self.modulation(*conditioning_rows(conditions, timesteps))
        return head_stepper(modulation, len(conditions), timesteps, self.run_step)


def conditioning_rows(conditions: np.ndarray, timesteps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The conditioning graph's rows for every (timestep, condition) pair: timestep-major."""
    return np.repeat(timesteps, len(conditions)), np.tile(conditions, (len(timesteps), 1))


def head_stepper(modulation, rows: int, timesteps: np.ndarray,
                 run_step: Callable[[np.ndarray, object], np.ndarray]) -> Callable[[np.ndarray, float], np.ndarray]:
    """velocity(noisy, t) from the modulation of `conditioning_rows` (`rows` conditions per timestep), each
    step's rows read in place where the modulation lies (runtime.device.Region)."""
    step_of = {float(t): k for k, t in enumerate(timesteps)}

    def velocity(noisy: np.ndarray, t: float) -> np.ndarray:
        k = step_of[float(t)]
        return run_step(noisy, Region(modulation, k * rows, (k + 1) * rows))

    return velocity


class StreamingConv:
    """A streaming conv-stack graph (decoder or encoder) and its list of conv states."""

    def __init__(self, bundle: Bundle, name: str):
        self.session = bundle.session(name)
        self.states = bundle.graph(name)["states"]
        self.input = bundle.graph(name)["inputs"][0]["name"]
        self.state_names = [f"state.{s['name']}" for s in self.states]
        self.state_outputs = frozenset(self.session.output_names[1:])  # kept where the graph runs

    def new_state(self) -> list[np.ndarray]:
        return [np.zeros((1, s["channels"], s["length"]), F32) for s in self.states]

    def run(self, chunk: np.ndarray, state: list) -> tuple[np.ndarray, list]:
        """Output for `chunk` and the new states, which stay where the graph runs (the device) for the next call."""
        feeds = {self.input: np.ascontiguousarray(chunk, dtype=F32)}
        feeds.update(zip(self.state_names, state))
        out, *new_state = self.session.run(None, feeds, keep=self.state_outputs)
        return out, new_state

    def whole(self, chunk: np.ndarray) -> np.ndarray:
        """A whole sequence in one call: from zero states, as the non-streaming stack with its zero padding."""
        return self.run(chunk, self.new_state())[0]
