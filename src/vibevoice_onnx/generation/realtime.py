"""The realtime generation loop, written once and run on two backends (numpy in, numpy out, no torch).

The PyTorch reference (reference/realtime.py) and the onnxruntime runtime (runtime/realtime.py) each supply
a backend that evaluates the components; this module owns the algorithm of upstream's streaming `generate`
(facts sheet 2.3 and 4, batch 1):

* text windows of 5 tokens go through the lower LM (positions continue after the voice prompt), then the
  upper LM with the text type embedding added to the lower LM's un-normed output;
* after each window, 6 speech frames: DPM-Solver++ with CFG on (positive, negative) conditions, the
  latent decoded one frame at a time (divide by the scale, then subtract the bias), then fed back through the
  connector with the speech type embedding into the positive and then the negative upper-LM stream;
* EOS is checked on the new positive hidden state after each fed-back frame (sigmoid > 0.5); the frame
  that triggered it is kept, and stopping at once gives upstream's audio (with `stop_on_eos=False` the
  decision is recorded but not acted on, so a run has a fixed length whatever a random model decides);
* a text window that would push the positive upper-LM sequence past max_position_embeddings is not run;
  a frame whose feedback would is still emitted, then generation stops (upstream's strict `>` check);
* once the text is used up, speech windows continue until EOS or the length limit; text that streams in
  (text.TextFeed) gives its windows as they complete, and the loop waits for each, so it runs as on the
  whole text;
* a latent or audio chunk holding NaN or infinity stops generation with an error naming the frame, before
  the chunk is handed out (one isfinite per frame).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Protocol

import numpy as np

from ..errors import VibeVoiceError
from ..sampling import DpmSolverSchedule, NoiseSource
from ..text import SPEECH_WINDOW, TEXT_WINDOW, text_windows
from ..voices import VoicePrompt
from .common import LmStream, SpeechResult, Steering, decode_latents, emitted_latent, record_conditions, sample_next

TEXT_TYPE, SPEECH_TYPE = 1, 0  # rows of tts_input_types (trap 4)


class RealtimeBackend(Protocol):
    """What the loop needs from an implementation. Arrays are float32 numpy; caches are opaque."""

    max_positions: int  # of the upper LM
    train_steps: int  # of the diffusion schedule (1000)

    def embed_text(self, ids: list[int]) -> np.ndarray: ...  # [1, S, H]
    def type_embedding(self, index: int) -> np.ndarray: ...  # [H]
    # `planned`: the positions a run will add past the prompt, where known (a backend may size its caches for it)
    def text_stream(self, layers, planned: int | None = None) -> "LmStream": ...  # the lower LM from the prompt's cache
    def guided_streams(self, positive, negative, planned: int | None = None) -> "GuidedStreams": ...  # upper LM, both CFG streams
    def velocity(self, noisy: np.ndarray, timesteps: np.ndarray, conditions: np.ndarray) -> np.ndarray: ...
    # velocity(noisy, t) for these conditions [rows, H] at any of these sampler timesteps:
    def head_at(self, conditions: np.ndarray, timesteps: np.ndarray) -> Callable[[np.ndarray, float], np.ndarray]: ...
    def connect(self, latent: np.ndarray) -> np.ndarray: ...  # [1, 1, 64] -> [1, 1, H]
    def eos_logit(self, hidden: np.ndarray) -> float: ...  # [1, H]
    def new_decoder_state(self) -> Any: ...
    def decode_frames(self, latents: np.ndarray, state: Any) -> tuple[np.ndarray, Any]: ...  # unscaled [1, F, 64] -> [F·3200]
    def unscale(self, latent: np.ndarray) -> np.ndarray: ...


class GuidedStreams:
    """The positive and negative upper-LM streams of CFG: text goes to the positive one only, every speech
    frame to both (positive first). This plain form runs them one after the other; a backend may batch."""

    def __init__(self, positive: LmStream, negative: LmStream):
        self.positive, self.negative = positive, negative

    @property
    def position(self) -> int:
        return self.positive.position

    def text(self, embeds: np.ndarray) -> np.ndarray:
        return self.positive.step(embeds)[:, -1]

    def speech(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.positive.step(embeds)[:, -1], self.negative.step(embeds)[:, -1]


POSITIONS_PER_TOKEN = 1 + SPEECH_WINDOW / TEXT_WINDOW  # upper-LM positions per text token while text lasts
TAIL_FRAMES = 60  # frames a text's speech is allowed past its last window (8 s), when planning positions


@dataclass
class GenerationResult(SpeechResult):
    """Stop reasons: "eos", "max_length" or "max_frames"."""

    eos_logits: list[float] = field(default_factory=list)  # one per fed-back frame

    @property
    def eos_frame(self) -> int | None:
        """0-based index of the first frame after which EOS fired (acted on or not), or None."""
        return next((i for i, logit in enumerate(self.eos_logits) if eos_fires(logit)), None)


def eos_fires(logit: float) -> bool:
    return bool(sigmoid(logit) > 0.5)


def sigmoid(x: float) -> np.float32:
    """fp32 logistic, stable for large |x| (upstream compares torch.sigmoid(logit) > 0.5)."""
    x = np.float32(x)
    if x >= 0:
        return np.float32(1) / (np.float32(1) + np.exp(-x))
    e = np.exp(x)
    return e / (np.float32(1) + e)


class FrameDecoder:
    """Decodes latents as the loop makes them: the first frame alone (for early first audio), the later ones
    in groups of `group` through the streaming decoder, whose weights are then read once per group; streamed
    decoding in groups gives the same audio as frame by frame within float rounding (gated by verify). A group
    never spans two speech windows, so a window's audio is out before the loop waits for streamed text, and
    whole and streamed texts are decoded in the same groups (the same samples, bit for bit)."""

    def __init__(self, backend: RealtimeBackend, result: GenerationResult, group: int):
        if group < 1:
            raise VibeVoiceError(f"decode group must be at least 1, got {group}")
        self.backend, self.result, self.group = backend, result, group
        self.state, self.pending = backend.new_decoder_state(), []

    def add(self, z: np.ndarray) -> list[np.ndarray]:
        self.result.latents.append(z)
        self.pending.append(z)
        frames = len(self.result.latents)
        due = frames == 1 or len(self.pending) >= self.group or frames % SPEECH_WINDOW == 0
        return self.flush() if due else []

    def flush(self) -> list[np.ndarray]:
        if not self.pending:
            return []
        first = len(self.result.latents) - len(self.pending)
        chunks, self.state = decode_latents(self.backend, self.pending, self.state, first)
        self.result.keep(chunks)
        self.pending = []
        return chunks


@dataclass(frozen=True)
class TextSegments:
    """A text longer than the model's context, as segments (their token ids), each spoken from the voice prompt
    afresh, one after the other: the latents' noise, the frame count and the decoder's state run on across
    them, so the audio streams on without a seam."""

    segments: tuple[list[int], ...]


def planned_positions(tokens: int, max_frames: int | None, frames_done: int) -> tuple[int, int]:
    """The positions a segment of `tokens` text tokens adds past the voice prompt: the lower LM its tokens, the
    upper LM its tokens and frames (what `max_frames` leaves, else the text's windows and a tail to EOS)."""
    if max_frames is not None:
        frames = max_frames - frames_done
    else:
        frames = -(-tokens // TEXT_WINDOW) * SPEECH_WINDOW + TAIL_FRAMES
    return tokens, tokens + frames


def realtime_frames(
    backend: RealtimeBackend,
    prompt: VoicePrompt,
    text_ids: list[int] | Iterable[list[int]] | TextSegments,
    noise: NoiseSource,
    cfg_scale: float,
    steps: int,
    max_frames: int | None,
    result: GenerationResult,
    stop_on_eos: bool = True,
    decode_group: int = 1,
    steering: Steering | None = None,
) -> Iterator[np.ndarray]:
    """Yield audio chunks (one per frame) as they are decoded, filling `result` as it goes; see FrameDecoder
    for `decode_group`, and Steering for `steering` (verify's hook: one that fixes the length runs that many
    frames, EOS recorded, not acted on).
    `text_ids` is the whole text's ids, its windows as they come (a text.TextFeed), or TextSegments (each
    segment ends as a whole text would, at EOS or the context's end, and the next one starts)."""
    pieces = text_ids.segments if isinstance(text_ids, TextSegments) else (text_ids,)
    decoder = FrameDecoder(backend, result, decode_group)
    if steering is not None and steering.frames is not None:
        max_frames, stop_on_eos = steering.frames, False
    for piece in pieces:
        if len(pieces) > 1:
            result.segments.append(result.frames)
        streamed = not isinstance(piece, (list, tuple))
        windows = iter(piece) if streamed else iter(text_windows(piece))
        plan = (None, None) if streamed else planned_positions(len(piece), max_frames, result.frames)
        for z in _latents(backend, prompt, windows, noise, cfg_scale, steps, max_frames, result, stop_on_eos, steering,
                          plan):
            yield from decoder.add(z)
        if result.stop_reason == "max_frames":
            break
    yield from decoder.flush()


def _latents(backend: RealtimeBackend, prompt: VoicePrompt, windows: Iterator[list[int]], noise: NoiseSource, cfg_scale: float,
             steps: int, max_frames: int | None, result: GenerationResult, stop_on_eos: bool,
             steering: Steering | None, plan: tuple[int | None, int | None]) -> Iterator[np.ndarray]:
    """The latents z in order; the caller records each before the next is made."""
    if max_frames is not None and max_frames < 1:
        raise VibeVoiceError(f"max_frames must be at least 1, got {max_frames}")
    schedule = DpmSolverSchedule.create(steps, backend.train_steps)
    lm = backend.text_stream(prompt.lm, plan[0])
    tts = backend.guided_streams(prompt.tts_lm, prompt.neg_tts_lm, plan[1])
    h_pos = np.asarray(prompt.tts_condition, np.float32)[None]
    h_neg = np.asarray(prompt.neg_condition, np.float32)[None]
    text_type, speech_type = backend.type_embedding(TEXT_TYPE), backend.type_embedding(SPEECH_TYPE)

    text_left = True
    while True:
        window = next(windows, None) if text_left else None
        text_left = window is not None
        if window is not None:
            if tts.position + len(window) > backend.max_positions:
                result.stop_reason = "max_length"
                return
            lm_hidden = lm.step(backend.embed_text(window))
            h_pos = tts.text(lm_hidden + text_type)
        for _ in range(SPEECH_WINDOW):
            record_conditions(result, h_pos, h_neg)
            z = emitted_latent(sample_next(backend, schedule, noise, h_pos, h_neg, cfg_scale, result.frames), result,
                               steering)
            yield z
            if result.reached(max_frames):
                return
            feedback = backend.connect(z[None, None]) + speech_type
            if tts.position + 1 > backend.max_positions:
                result.stop_reason = "max_length"
                return
            h_pos, h_neg = tts.speech(feedback)
            logit = backend.eos_logit(h_pos)
            if steering is not None:
                logit = steering.eos_logit(logit, len(result.eos_logits))
            result.eos_logits.append(logit)
            if stop_on_eos and eos_fires(logit):
                result.stop_reason = "eos"
                return
