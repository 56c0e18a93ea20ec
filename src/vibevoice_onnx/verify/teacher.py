"""Gates without torch, shared by every kind: a quantized bundle judged against its teacher (the fp32 bundle
written from the same checkpoint), the two never both resident. Each phase opens the bundle it runs and closes it
when it ends; what one phase hands the next is arrays (inputs, outputs, trajectories), never a session."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable

import numpy as np

from ..runtime.bundle import Bundle
from ..runtime.device import host
from .judge import Gate, Tolerance, compare


class Resident:
    """A reference or runtime kept resident throughout (PyTorch's model, or a backend), held as Phased is."""

    def __init__(self, backend):
        self.backend = backend

    @contextlib.contextmanager
    def whole(self):
        yield self.backend


class Phased:
    """A bundle opened for each phase (`whole`) as `backend(bundle)`, and closed when the phase ends."""

    def __init__(self, path: Path, backend: Callable):
        self.path, self.backend = Path(path), backend

    def whole(self):
        return held(self.backend(Bundle(self.path)))


@contextlib.contextmanager
def held(backend):
    """`backend` (a bundle's) for a phase, its bundle closed at the end however the caller still refers to it."""
    try:
        yield backend
    finally:
        backend.bundle.close()
        released()


def released() -> None:
    """The memory a closed bundle's weights held goes back to the system now: `Bundle.close` drops each session,
    which frees it by its reference count, but glibc keeps freed heap for reuse unless trimmed, and a student
    released that way still held 0.8 GB of the next phase's budget (full-size int8 realtime). No `gc.collect()`:
    no session waits on the collector (test_writer's phase test counts them), and a full collection in a process
    that has traced with torch walks millions of objects: 0.3 s a phase, 7 s of a tiny bundle's 8 s verify."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its allocator keeps its own counsel
        pass


def against_teacher(teacher: Phased, student: Phased, inputs: Callable, calls: Callable, tolerance: Tolerance) -> list[Gate]:
    """Each graph of the student against the teacher's on the same inputs: `inputs(teacher_backend)` draws them
    (realistic ones: hidden states from the teacher's LM), `calls(backend, inputs)` gives {gate name: outputs},
    run in the teacher's phase and then in the student's."""
    with teacher.whole() as backend:
        drawn = inputs(backend)
        theirs = calls(backend, drawn)
    with student.whole() as backend:
        ours = calls(backend, drawn)
    return [compare(f"{name}: against the teacher's graph", ours[name], theirs[name], tolerance) for name in theirs]


def decode_each(backend, latents: np.ndarray) -> list[np.ndarray]:
    """Latents [1, F, C] decoded one frame a call from zero states (`backend`'s decoder, a TTS kind's): the audio,
    then the last states."""
    state, audio = backend.new_decoder_state(), []
    for i in range(latents.shape[1]):
        samples, state = backend.decode_frames(latents[:, i:i + 1], state)
        audio.append(np.ravel(samples))
    return [np.concatenate(audio), *[np.asarray(host(s)) for s in state]]
