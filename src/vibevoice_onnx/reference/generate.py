"""The reference realtime generation loop (fp32 PyTorch), reproducing upstream's streaming `generate`.

Facts sheet 2.3 and 4, as upstream runs them for batch 1: text windows of 5 tokens through the lower LM
(positions continue after the voice prompt) and then the upper LM with the text type embedding; after each
window 6 speech frames, each sampled by DPM-Solver++ with CFG on (positive, negative) conditions, decoded
(scale, then bias) one frame at a time with a conv-state cache, fed back through the connector into the
positive and the negative upper-LM streams with the speech type embedding, then the EOS check on the new
positive hidden state. A text window that would push the positive TTS sequence past max_position_embeddings
is not run; a frame whose feedback would is still emitted, then generation stops (upstream's `>` check).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

from ..sampling import DpmSolverSchedule, NoiseSource, sample_latent
from ..text import SPEECH_WINDOW, text_windows
from ..voices import VoicePrompt
from .modules import ConvState, RealtimeModel, conv_state_specs


@dataclass
class GenerationResult:
    latents: list[np.ndarray] = field(default_factory=list)  # normalised diffusion outputs z, [64] each
    chunks: list[np.ndarray] = field(default_factory=list)  # decoded audio per frame, [hop] each
    eos_logits: list[float] = field(default_factory=list)  # after each fed-back frame
    stop_reason: str = ""  # "eos", "max_length" or "max_frames"

    @property
    def frames(self) -> int:
        return len(self.latents)

    @property
    def eos_frame(self) -> int | None:
        """0-based index of the frame after which EOS fired, or None."""
        return self.frames - 1 if self.stop_reason == "eos" else None

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, dtype=np.float32)


def _cache(layers) -> DynamicCache:
    return DynamicCache(ddp_cache_data=[(torch.from_numpy(np.asarray(k, np.float32)), torch.from_numpy(np.asarray(v, np.float32))) for k, v in layers])


def _positions(start: int, count: int) -> torch.Tensor:
    return torch.arange(start, start + count).unsqueeze(0)


class _Stream:
    """One language-model stream: its KV cache and the next position."""

    def __init__(self, layers):
        self.cache = _cache(layers)
        self.position = layers[0][0].shape[2]

    def step(self, run: Callable, embeds: torch.Tensor) -> torch.Tensor:
        hidden = run(embeds, _positions(self.position, embeds.shape[1]), self.cache)
        self.position += embeds.shape[1]
        return hidden


@torch.no_grad()
def generate(
    model: RealtimeModel,
    prompt: VoicePrompt,
    text_ids: list[int],
    noise: NoiseSource,
    cfg_scale: float = 1.5,
    steps: int = 5,
    max_frames: int | None = None,
) -> GenerationResult:
    result = GenerationResult()
    for _ in iterate(model, prompt, text_ids, noise, cfg_scale, steps, max_frames, result):
        pass
    return result


def iterate(model, prompt, text_ids, noise, cfg_scale, steps, max_frames, result: GenerationResult) -> Iterator[np.ndarray]:
    """Yield each frame's audio chunk as soon as it is decoded; fill `result` as it goes."""
    dims = model.dims
    max_length = dims.tts_lm.max_positions
    schedule = DpmSolverSchedule.create(steps, dims.head.train_steps, dims.head.beta_schedule)
    lm, tts, neg = _Stream(prompt.lm), _Stream(prompt.tts_lm), _Stream(prompt.neg_tts_lm)
    h_pos = torch.from_numpy(np.asarray(prompt.tts_condition, np.float32))[None]
    h_neg = torch.from_numpy(np.asarray(prompt.neg_condition, np.float32))[None]
    decoder_state = ConvState.zeros(conv_state_specs(model.acoustic_decoder))
    text_type, speech_type = model.type_embedding(model.TEXT), model.type_embedding(model.SPEECH)

    def predict(x: np.ndarray, t: float):
        batch = torch.from_numpy(np.stack([x, x]))
        conditions = torch.cat([h_pos, h_neg], dim=0)
        v = model.predict_velocity(batch, torch.full((2,), t, dtype=torch.float32), conditions).numpy()
        return v[0], v[1]

    windows = text_windows(text_ids)
    window_index = 0
    while True:
        if window_index < len(windows):
            window = windows[window_index]
            window_index += 1
            if tts.position + len(window) > max_length:
                result.stop_reason = "max_length"
                return
            embeds = model.embed_text(torch.tensor([window]))
            lm_hidden = lm.step(model.lower_step, embeds)
            h_pos = tts.step(model.upper_step, lm_hidden + text_type)[:, -1]
        for _ in range(SPEECH_WINDOW):
            frame = result.frames
            z = sample_latent(schedule, noise(frame), predict, cfg_scale)
            latent = torch.from_numpy(z)[None, None]
            chunk = model.decode_stream(model.unscale(latent), decoder_state)[0, 0].numpy()
            result.latents.append(z)
            result.chunks.append(chunk)
            yield chunk
            if max_frames is not None and result.frames >= max_frames:
                result.stop_reason = "max_frames"
                return
            feedback = model.connect(latent) + speech_type
            if tts.position + 1 > max_length:
                result.stop_reason = "max_length"
                return
            h_pos = tts.step(model.upper_step, feedback)[:, -1]
            h_neg = neg.step(model.upper_step, feedback)[:, -1]
            logit = float(model.eos_logit(h_pos)[0, 0])
            result.eos_logits.append(logit)
            if torch.sigmoid(torch.tensor(logit)) > 0.5:
                result.stop_reason = "eos"
                return
