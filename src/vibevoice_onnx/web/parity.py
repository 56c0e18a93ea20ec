"""What the browser's parity gates replay: each graph's first call in a real Python generation (its inputs and
outputs), and the wire form arrays cross into the page in ({type, dims, data: base64}, as vibevoice.mjs reads it)."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np

TEXT = "The page speaks as Python does."


def wire(array: np.ndarray) -> dict:
    array = np.ascontiguousarray(array)
    return {"type": str(array.dtype), "dims": list(array.shape), "data": base64.b64encode(array.tobytes()).decode()}


def unwire(value: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(value["data"]), value["type"]).reshape(value["dims"])


def first_calls(bundle: Path, frames: int = 3, text: str = TEXT) -> dict[str, tuple[dict, dict]]:
    """Each graph's first call while the Python runtime speaks `text` (`frames` latents, seed 7, the bundle's first
    voice): {graph: (inputs, outputs)} as host arrays."""
    from ..runtime.device import GraphSession, host
    from ..runtime.speech import open_tts

    calls, run = {}, GraphSession.run

    def recording(self, output_names, feeds, keep=frozenset(), into=None):
        inputs = {name: np.array(host(value)) for name, value in feeds.items()}
        outputs = run(self, output_names, feeds, keep, into)
        if self.name not in calls:
            names = list(output_names) if output_names is not None else [n for n in self.output_names
                                                                         if n not in (into or {})]
            calls[self.name] = (inputs, {n: np.array(host(v)) for n, v in zip(names, outputs)})
        return outputs

    model = open_tts(bundle)
    GraphSession.run = recording
    try:
        model.create(text, voice=model.voices[0], seed=7, max_frames=frames)
    finally:
        GraphSession.run = run
    return calls
