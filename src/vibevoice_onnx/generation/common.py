"""Pieces every generation loop shares: a language-model stream and the per-frame finiteness check."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import VibeVoiceError


class LmStream:
    """One language-model stream: its KV cache and its next position.

    `run(embeds, positions, cache) -> (hidden, cache)` evaluates the model; positions continue after the
    cached prompt, consecutively (facts sheet 2.3 bookkeeping).
    """

    def __init__(self, run: Callable, cache: Any, length: int):
        self.run, self.cache, self.position = run, cache, length

    def step(self, embeds: np.ndarray) -> np.ndarray:
        count = embeds.shape[1]
        positions = np.arange(self.position, self.position + count, dtype=np.int64)[None]
        hidden, self.cache = self.run(embeds, positions, self.cache)
        self.position += count
        return hidden


def require_finite(array: np.ndarray, what: str, where: str) -> None:
    """Stop with a sentence naming `where` (e.g. "frame 3") if `array` holds NaN or infinity."""
    if not np.isfinite(array).all():
        raise VibeVoiceError(
            f"{where}: the {what} holds NaN or infinity, so it was not used or written "
            "(the model or its options produce invalid values; `vibevoice-onnx verify` checks the bundle)"
        )
