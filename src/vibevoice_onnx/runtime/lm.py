"""ONNX pieces every kind's runtime shares: a language-model graph with its KV cache, both CFG streams in one
batched call, the diffusion head's two graphs, and a streaming conv stack with its states."""

from __future__ import annotations

from typing import Callable

import numpy as np

from .bundle import Bundle

F32 = np.float32


def flat_cache(layers) -> list[np.ndarray]:
    """(K, V) per layer -> the flat list of float32 arrays the graphs take."""
    return [np.ascontiguousarray(t, dtype=F32) for pair in layers for t in pair]


def empty_cache(bundle: Bundle, name: str, batch: int = 1) -> list[np.ndarray]:
    """A zero-length KV cache for graph `name`, from the shapes its manifest entry records."""
    past = bundle.graph(name)["inputs"][3:]
    return [np.zeros((batch, p["shape"][1], 0, p["shape"][3]), F32) for p in past]


class OnnxLm:
    """One LM graph: inputs_embeds, attention_mask, position_ids and the past K/V -> hidden and present K/V."""

    def __init__(self, bundle: Bundle, name: str):
        self.session = bundle.session(name)
        self.kv_inputs = [i["name"] for i in bundle.graph(name)["inputs"][3:]]

    def run(self, embeds, mask, positions, cache):
        feeds = {"inputs_embeds": np.ascontiguousarray(embeds, dtype=F32), "attention_mask": mask, "position_ids": positions}
        feeds.update(zip(self.kv_inputs, cache))
        hidden, *present = self.session.run(None, feeds)
        return hidden, present

    def unbatched(self, embeds, positions, cache):
        """A batch-1 stream without padding: every cached position is attended to."""
        mask = np.ones((1, cache[0].shape[2] + embeds.shape[1]), np.int64)
        return self.run(embeds, mask, positions, cache)


def _left_pad(cache: np.ndarray, count: int) -> np.ndarray:
    if count == 0:
        return cache
    pad = np.zeros(cache.shape[:2] + (count,) + cache.shape[3:], cache.dtype)
    return np.concatenate([pad, cache], axis=2)


class BatchedGuidedStreams:
    """Both CFG streams of an LM in one batch-2 call per step: the weights are read once.

    Row 0 is the positive stream, row 1 the negative; the shorter cache is left-padded and masked out. A step
    may leave a row inactive: that row gets a masked placeholder position, so both rows keep one cache length
    and the next step batches again. verify gates this against two separate reference streams.
    """

    def __init__(self, lm: OnnxLm, positive: list[np.ndarray], negative: list[np.ndarray]):
        self.lm = lm
        lengths = [positive[0].shape[2], negative[0].shape[2]]
        total = max(lengths)
        self.cache = [np.concatenate([_left_pad(p, total - lengths[0]), _left_pad(n, total - lengths[1])], axis=0)
                      for p, n in zip(positive, negative)]
        self.mask = np.array([[0] * (total - n) + [1] * n for n in lengths], np.int64)
        self.positions = lengths

    @property
    def position(self) -> int:
        return self.positions[0]

    def step(self, embeds: np.ndarray, active: list[int]) -> np.ndarray:
        """Run both rows on `embeds` [2, S, H]; a row with active 0 is computed but leaves no trace."""
        count = embeds.shape[1]
        mask = np.concatenate([self.mask, np.array([[a] * count for a in active], np.int64)], axis=1)
        positions = np.array([np.arange(p, p + count) for p in self.positions], np.int64)
        if sum(active) == 1:
            hidden = self._one_row(active.index(1), embeds, mask, positions)
        else:
            hidden, self.cache = self.lm.run(embeds, mask, positions, self.cache)
        self.mask = mask
        self.positions = [p + count * a for p, a in zip(self.positions, active)]
        return hidden[:, -1]

    def _one_row(self, row: int, embeds, mask, positions) -> np.ndarray:
        """A step only `row` takes (text into the positive stream): run that row alone, for half the compute
        of a batch-2 call (a text window is several tokens, where the quantized kernels are compute-bound);
        the other row gets zero placeholders, masked out like an inactive row's. Its hidden rows stay zero."""
        one = slice(row, row + 1)
        hidden, present = self.lm.run(embeds[one], mask[one], positions[one], [c[one] for c in self.cache])
        count = embeds.shape[1]
        for i, old in enumerate(self.cache):  # layer by layer, each old and present tensor freed once copied
            both = np.zeros(old.shape[:2] + (old.shape[2] + count,) + old.shape[3:], old.dtype)
            both[1 - row, :, : old.shape[2]] = old[1 - row]
            both[row] = present[i][0]
            self.cache[i], present[i] = both, None
        out = np.zeros((2,) + hidden.shape[1:], hidden.dtype)
        out[row] = hidden[0]
        return out

    def forget(self, row: int, steps: int = 1) -> None:
        """Mask out the last `steps` positions of `row` and take back its position counter."""
        self.mask[row, -steps:] = 0
        self.positions[row] -= steps

    def restart(self, row: int) -> None:
        """Forget everything `row` has seen: its next token sits at position 0 and attends to itself only."""
        self.mask[row, :] = 0
        self.positions[row] = 0

    def text(self, embeds):
        return self.step(np.concatenate([embeds, np.zeros_like(embeds)]), [1, 0])[0:1]

    def speech(self, embeds):
        hidden = self.step(np.concatenate([embeds, embeds]), [1, 1])
        return hidden[0:1], hidden[1:2]


class OnnxDiffusionHead:
    """The diffusion head as the bundle splits it: a conditioning graph (timestep and condition -> every layer's
    modulation) and a step graph (noisy latent and modulation -> velocity). A frame's conditioning runs once for
    all its sampler steps, so its weights are read once per frame, not once per step."""

    def __init__(self, bundle: Bundle):
        self.conditioning = bundle.session("diffusion_head_conditioning")
        self.step = bundle.session("diffusion_head_step")

    def modulation(self, timesteps: np.ndarray, conditions: np.ndarray) -> np.ndarray:
        feeds = {"timesteps": np.ascontiguousarray(timesteps, dtype=F32), "condition": np.ascontiguousarray(conditions, dtype=F32)}
        return self.conditioning.run(None, feeds)[0]

    def run_step(self, noisy: np.ndarray, modulation: np.ndarray) -> np.ndarray:
        return self.step.run(None, {"noisy_latents": np.ascontiguousarray(noisy, dtype=F32), "modulation": modulation})[0]

    def velocity(self, noisy, timesteps, conditions):
        """The whole head on one batch, each row at its own timestep."""
        return self.run_step(noisy, self.modulation(timesteps, conditions))

    def at(self, conditions: np.ndarray, timesteps: np.ndarray) -> Callable[[np.ndarray, float], np.ndarray]:
        """velocity(noisy, t) for the rows of `conditions` at each of `timesteps`, conditioned in one call."""
        rows = len(conditions)
        modulation = self.modulation(np.repeat(timesteps, rows), np.tile(conditions, (len(timesteps), 1)))
        step_of = {float(t): k for k, t in enumerate(timesteps)}

        def velocity(noisy: np.ndarray, t: float) -> np.ndarray:
            k = step_of[float(t)]
            return self.run_step(noisy, modulation[k * rows : (k + 1) * rows])

        return velocity


class StreamingConv:
    """A streaming conv-stack graph (decoder or encoder) and its list of conv states."""

    def __init__(self, bundle: Bundle, name: str):
        self.session = bundle.session(name)
        self.states = bundle.graph(name)["states"]
        self.input = bundle.graph(name)["inputs"][0]["name"]

    def new_state(self) -> list[np.ndarray]:
        return [np.zeros((1, s["channels"], s["length"]), F32) for s in self.states]

    def run(self, chunk: np.ndarray, state: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        feeds = {self.input: np.ascontiguousarray(chunk, dtype=F32)}
        feeds.update((f"state.{s['name']}", value) for s, value in zip(self.states, state))
        out, *new_state = self.session.run(None, feeds)
        return out, new_state

    def whole(self, chunk: np.ndarray) -> np.ndarray:
        """A whole sequence in one call: from zero states, as the non-streaming stack with its zero padding."""
        return self.run(chunk, self.new_state())[0]
