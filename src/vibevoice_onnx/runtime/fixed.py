"""Running graphs of the fixed-shape profile (export/fixed.py): LMs over host-held caches of a fixed capacity,
and a decoder of a fixed frame count carried across tiles. Every call has the same shapes."""

from __future__ import annotations

import numpy as np

from ..errors import VibeVoiceError

F32 = np.float32
# The attention bias where a row may not look: softmax zeroes it in fp32 and fp16 alike (fp16's max is 65504).
MASKED = F32(-1e4)


def attention_bias(lengths: list[int], tokens: int, capacity: int) -> np.ndarray:
    """[rows, 1, tokens, capacity + tokens]: each row sees its filled past and the new tokens up to itself."""
    bias = np.full((len(lengths), 1, tokens, capacity + tokens), MASKED, F32)
    for row, length in enumerate(lengths):
        bias[row, 0, :, :length] = 0
    bias[:, 0, :, capacity:][:, np.tril(np.ones((tokens, tokens), bool))] = 0
    return bias


class FixedCache:
    """K and V of every layer for `rows` streams, [rows, KV, capacity, D] each, and each row's filled length."""

    def __init__(self, prompts: list[list[tuple[np.ndarray, np.ndarray]]], capacity: int, what: str):
        lengths = [layers[0][0].shape[2] for layers in prompts]
        if max(lengths) >= capacity:
            raise VibeVoiceError(f"{what} takes {max(lengths)} positions and this fixed bundle's caches hold "
                                 f"{capacity}: use a shorter voice prompt, or build with a larger --cache")
        kv_heads, dim = prompts[0][0][0].shape[1], prompts[0][0][0].shape[3]
        self.capacity, self.lengths = capacity, lengths
        self.tensors = [np.zeros((len(prompts), kv_heads, capacity, dim), F32) for _ in range(2 * len(prompts[0]))]
        for row, layers in enumerate(prompts):
            for layer, (key, value) in enumerate(layers):
                self.tensors[2 * layer][row, :, :lengths[row]] = key[0]
                self.tensors[2 * layer + 1][row, :, :lengths[row]] = value[0]

    def write(self, row: int, new: list[np.ndarray], count: int) -> None:
        """The first `count` of a call's new keys and values [1, KV, S, D] of one row, at its length."""
        start = self.lengths[row]
        if start + count > self.capacity:
            raise VibeVoiceError(f"the fixed cache of {self.capacity} positions is full")
        for tensor, fresh in zip(self.tensors, new):
            tensor[row, :, start:start + count] = fresh[0, :, :count]
        self.lengths[row] += count


class FixedLm:
    """One fixed LM graph: `rows` streams of `tokens` new positions a call over a FixedCache's rows."""

    def __init__(self, bundle, name: str):
        self.session, self.name = bundle.session(name), name
        shape = bundle.graph(name)["fixed"]
        self.rows, self.tokens, self.capacity = shape["rows"], shape["tokens"], shape["capacity"]

    def run(self, embeds: np.ndarray, cache: FixedCache, rows: list[int]) -> np.ndarray:
        """Hidden states [len(rows), count, H] for `embeds` [len(rows), count, H] (count <= tokens: the rest is
        padding, never written), the rows' new keys and values written into `cache`."""
        count = embeds.shape[1]
        if len(rows) != self.rows or count > self.tokens:
            raise VibeVoiceError(f"{self.name} takes {self.rows} row(s) of at most {self.tokens} token(s) a call")
        lengths = [cache.lengths[row] for row in rows]
        padded = np.zeros((self.rows, self.tokens, embeds.shape[2]), F32)
        padded[:, :count] = embeds
        feeds = {"inputs_embeds": padded,
                 "position_ids": (np.asarray(lengths)[:, None] + np.arange(self.tokens)).astype(np.int64),
                 "attention_bias": attention_bias(lengths, self.tokens, self.capacity)}
        picked = slice(rows[0], rows[0] + 1) if self.rows == 1 else slice(None)  # a contiguous view: no copy
        for k, tensor in enumerate(cache.tensors):
            feeds[f"past_key_values.{k // 2}.{'key' if k % 2 == 0 else 'value'}"] = tensor[picked]
        hidden, *new = self.session.run(None, feeds)
        for index, row in enumerate(rows):
            cache.write(row, [fresh[index:index + 1] for fresh in new], count)
        return hidden[:, :count]


class FixedLmStream:
    """generation.common.LmStream's interface over one row of a FixedCache, windows of up to `lm.tokens`."""

    def __init__(self, lm: FixedLm, cache: FixedCache, row: int = 0):
        self.lm, self.cache, self.row = lm, cache, row

    @property
    def position(self) -> int:
        return self.cache.lengths[self.row]

    def step(self, embeds: np.ndarray) -> np.ndarray:
        return self.lm.run(embeds, self.cache, [self.row])


class FixedGuidedStreams:
    """The CFG streams as rows 0 (positive) and 1 (negative) of one cache: text through the text-window graph
    on row 0, each speech frame through the step graph on both rows in one call."""

    def __init__(self, text: FixedLm, step: FixedLm, cache: FixedCache):
        self.text_lm, self.step_lm, self.cache = text, step, cache

    @property
    def position(self) -> int:
        return self.cache.lengths[0]

    def text(self, embeds: np.ndarray) -> np.ndarray:
        return self.text_lm.run(embeds, self.cache, [0])[:, -1]

    def speech(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        hidden = self.step_lm.run(np.concatenate([embeds, embeds]), self.cache, [0, 1])[:, -1]
        return hidden[:1], hidden[1:]


class TileDecoder:
    """The decoder graph of T frames a call. Whole tiles carry the conv states on; a last partial tile is
    decoded padded (causal: its real frames' audio does not see the padding), its states thrown away, and its
    latents carried into the next call, which decodes them again from the states before them and hands out
    only the new frames' audio. So any grouping gives the audio of one decode of all latents."""

    def __init__(self, bundle, name: str = "acoustic_decoder_tile"):
        graph = bundle.graph(name)
        self.session, self.frames = bundle.session(name), graph["fixed"]["frames"]
        self.state_names = [f"state.{s['name']}" for s in graph["states"]]
        self.state_shapes = [(1, s["channels"], s["length"]) for s in graph["states"]]

    def new_state(self):
        return [np.zeros(shape, F32) for shape in self.state_shapes], np.zeros((0, 0), F32)

    def _tile(self, latents: np.ndarray, states: list[np.ndarray]):
        audio, *new_states = self.session.run(None, {"latents": latents[None], **dict(zip(self.state_names, states))})
        return audio[0, 0], new_states

    def run(self, latents: np.ndarray, state) -> tuple[np.ndarray, tuple]:
        """Unscaled latents [1, F, C] -> audio [F·hop] and the state to carry."""
        states, carried = state
        frames = latents[0] if not carried.size else np.concatenate([carried, latents[0]])
        repeated, pieces = len(carried), []
        whole = len(frames) - len(frames) % self.frames
        for start in range(0, whole, self.frames):
            audio, states = self._tile(frames[start:start + self.frames], states)
            pieces.append(audio)
        rest = frames[whole:]
        if len(rest):
            padded = np.zeros((self.frames, frames.shape[1]), F32)
            padded[:len(rest)] = rest
            audio, _ = self._tile(padded, states)
            pieces.append(audio[:len(audio) * len(rest) // self.frames])
        audio = np.concatenate(pieces)
        hop = len(audio) // len(frames)
        return audio[repeated * hop:], (states, rest.copy())
