"""Synthetic realtime voice presets, written in upstream's exact pickle format.

A preset caches the four prompt streams of a realtime model. For a synthetic checkpoint we compute them with
the reference itself: a short text prompt through the lower LM; the same positions (text type) followed by a
few random speech frames (speech type) through the upper LM; one `<|image_pad|>` position for each negative
stream. The file is then written as upstream's are (torch zip pickle, bf16, `cuda:0` storage location,
transformers' BaseModelOutputWithPast holding a legacy DynamicCache, K/V as non-contiguous views), so tests
exercise the real import path.
"""

from __future__ import annotations

import copyreg
import io
import zipfile
from pathlib import Path

import torch
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast

from ..voices import VoicePrompt
from .realtime import RealtimeModel

PROMPT_TEXT = "Hello, this is a synthetic voice prompt.\n"
PROMPT_SPEECH_FRAMES = 8


class _LegacyDynamicCache:
    """Pickles as the pre-4.56 DynamicCache: NEWOBJ of transformers' class, state = the three legacy fields."""

    def __init__(self, cache: DynamicCache):
        # Upstream's K/V are [B, H, S, D] views of a [B, S, H, D] buffer: keep that non-contiguity.
        def strided(t):
            return t.to(torch.bfloat16).transpose(1, 2).contiguous().transpose(1, 2)

        self.state = {
            "_seen_tokens": cache.get_seq_length(),
            "key_cache": [strided(layer.keys) for layer in cache.layers],
            "value_cache": [strided(layer.values) for layer in cache.layers],
        }

    @property
    def __class__(self):  # pickle's NEWOBJ check compares args[0] with obj.__class__
        return DynamicCache

    def __reduce__(self):
        return copyreg.__newobj__, (DynamicCache,), self.state


def _output(hidden: torch.Tensor, cache: DynamicCache) -> BaseModelOutputWithPast:
    return BaseModelOutputWithPast(last_hidden_state=hidden.to(torch.bfloat16), past_key_values=_LegacyDynamicCache(cache))


@torch.no_grad()
def compute_prompt(model: RealtimeModel, prompt_ids: list[int], pad_id: int, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    text = model.embed_text(torch.tensor([prompt_ids]))
    lm_cache, tts_cache = DynamicCache(), DynamicCache()
    positions = torch.arange(len(prompt_ids))[None]
    lm_hidden = model.lower_step(text, positions, lm_cache)
    latents = torch.randn(1, PROMPT_SPEECH_FRAMES, model.dims.head.latent, generator=generator)
    tts_inputs = torch.cat(
        [lm_hidden + model.type_embedding(model.TEXT), model.connect(latents) + model.type_embedding(model.SPEECH)], dim=1
    )
    tts_hidden = model.upper_step(tts_inputs, torch.arange(tts_inputs.shape[1])[None], tts_cache)

    pad = model.embed_text(torch.tensor([[pad_id]]))
    neg_lm_cache, neg_tts_cache = DynamicCache(), DynamicCache()
    neg_lm_hidden = model.lower_step(pad, torch.zeros(1, 1, dtype=torch.long), neg_lm_cache)
    neg_tts_hidden = model.upper_step(pad + model.type_embedding(model.SPEECH), torch.zeros(1, 1, dtype=torch.long), neg_tts_cache)
    return {
        "lm": _output(lm_hidden, lm_cache),
        "tts_lm": _output(tts_hidden, tts_cache),
        "neg_lm": _output(neg_lm_hidden, neg_lm_cache),
        "neg_tts_lm": _output(neg_tts_hidden, neg_tts_cache),
    }


def as_voice_prompt(prompt: dict) -> VoicePrompt:
    """The computed prompt as the loop consumes it (what importing its saved preset would give)."""

    def layers(name: str):
        state = prompt[name].past_key_values.state
        return [(k.float().numpy(), v.float().numpy()) for k, v in zip(state["key_cache"], state["value_cache"])]

    return VoicePrompt(
        lm=layers("lm"),
        tts_lm=layers("tts_lm"),
        neg_tts_lm=layers("neg_tts_lm"),
        neg_condition=prompt["neg_tts_lm"].last_hidden_state[0, -1].float().numpy(),
        tts_condition=prompt["tts_lm"].last_hidden_state[0, -1].float().numpy(),
    )


def save_upstream_preset(prompt: dict, path: Path) -> None:
    """torch.save, then mark every storage as saved on cuda:0, as in upstream's files."""
    buffer = io.BytesIO()
    torch.save(prompt, buffer)
    source = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    archive_root = Path(path).stem
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as out:
        for info in source.infolist():
            data = source.read(info.filename)
            if info.filename.endswith("/data.pkl"):
                data = data.replace(b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0")
            out.writestr(archive_root + "/" + info.filename.split("/", 1)[1], data)


def prompt_from_text(model: RealtimeModel, tokenizer, text: str = PROMPT_TEXT, seed: int = 0) -> dict:
    """compute_prompt on a text prompt, negative streams seeded with `<|image_pad|>` as upstream's are."""
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return compute_prompt(model, ids, tokenizer.token_to_id("<|image_pad|>"), seed)


def write_synthetic_preset(model: RealtimeModel, tokenizer, path: Path, seed: int = 0) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_upstream_preset(prompt_from_text(model, tokenizer, seed=seed), path)
    return path
