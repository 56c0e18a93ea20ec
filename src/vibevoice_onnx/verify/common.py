"""The PyTorch reference's side of the gates every kind shares (prefilled caches, per-module gates, the decoder's
streaming gates); what judges and records them, torch-free, is verify/judge.py, re-exported here.

Every comparison is judged in direction and in size (Tolerance: cosine, gain, relative error) by its precision's
limits (LIMITS), or by max|Δ| <= 1e-4 where the reference output is near silent. The record (thresholds, every
gate's numbers, the closed loop's settings) goes into the bundle's manifest.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

from ..reference.modules import ConvState, as_tensor, conv_state_specs
from ..runtime.device import host
from ..runtime.lm import KvCache, OnnxLm, StreamingConv, flat_cache
from .judge import (  # noqa: F401 (re-exported: the kinds' gate modules import them from here)
    BATCHED, BATCH_LATE_AFTER, F32, FP32, Gate, LIMITS, LOOP_REASONS, Limits, Probe, RANDOM_WEIGHTS_CAVEAT,
    SAME_ARITHMETIC, SEED, SILENT_MAX_ABS, SILENT_RMS, Tolerance, batched_and_alone, bound_gate, compare, cosine,
    exact_on_cpu, forced_gates, format_table, frames_gate, gain, gates_of, limits_for, lm_self_gates,
    relative_error, streamed_decode_gate, replay_gate,
    resolve_checkpoint, rms, verify_bundle, worst_gain,
)


def cache_layers(cache: DynamicCache) -> list[tuple[np.ndarray, np.ndarray]]:
    """A transformers cache as (K, V) arrays per layer, copied (the cache keeps growing in place)."""
    return [(layer.keys.numpy().copy(), layer.values.numpy().copy()) for layer in cache.layers]


def prefilled(lm, probe: Probe, count: int) -> DynamicCache:
    """A transformers cache of `lm` (a PyTorch Qwen2 stack) after `count` of the probe's random tokens."""
    cache = DynamicCache()
    lm_step(lm, probe.tokens(count), np.arange(count)[None], cache)
    return cache


def cfg_steps(ours, reference, probe: Probe) -> tuple[list, list]:
    """Two sets of CFG streams given the same inputs: speech, a 3-token text window (positive only), then speech
    twice; their outputs side by side."""
    outputs, references = [], []
    for step in range(4):
        if step == 1:
            embeds = probe.tokens(3)
            outputs.append(ours.text(embeds))
            references.append(reference.text(embeds))
        else:
            embeds = probe.tokens(1)
            outputs += ours.speech(embeds)
            references += reference.speech(embeds)
    return outputs, references


def lm_step(lm, embeds: np.ndarray, positions: np.ndarray, cache: DynamicCache) -> np.ndarray:
    """A reference Qwen2 stack on `embeds` at `positions`, extending `cache` in place: hidden [B, S, H]."""
    out = lm(inputs_embeds=as_tensor(embeds), position_ids=torch.from_numpy(np.asarray(positions, np.int64)),
             past_key_values=cache, use_cache=True)
    return out.last_hidden_state.numpy()


def lm_gates(name: str, lm, onnx_lm: OnnxLm, probe: Probe, limits: Limits,
             steps: tuple[tuple[int, int], ...] = ((11, 5), (16, 1))) -> list[Gate]:
    """An LM graph against its reference on (past, new) token counts, its own KV incremental == prefill, and
    its fixed-capacity cache written in place == the same graph's growing cache."""
    gates = []
    for past, new in steps:
        cache = prefilled(lm, probe, past)
        ours = KvCache.of_streams(onnx_lm, [flat_cache(cache_layers(cache))])
        embeds, positions = probe.tokens(new), np.arange(past, past + new, dtype=np.int64)[None]
        reference = lm_step(lm, embeds, positions, cache)
        hidden = onnx_lm.run(embeds, ours)
        gates.append(compare(f"{name} (past {past}, new {new})", [hidden, *ours.filled()],
                             [reference, *flat_cache(cache_layers(cache))], limits.graph))
    return gates + lm_self_gates(name, onnx_lm, probe, limits)


def head_gate(head, velocity: Callable, conditions: np.ndarray, probe: Probe, tolerance: Tolerance) -> Gate:
    noisy = probe.normal(len(conditions), head.noisy_images_proj.in_features)
    timesteps = np.linspace(999, 100, len(conditions)).round().astype(F32)
    reference = head(as_tensor(noisy), as_tensor(timesteps), as_tensor(conditions)).numpy()
    return compare("diffusion_head", [velocity(noisy, timesteps, conditions)], [reference], tolerance)


def module_gate(name: str, module, run: Callable, inputs: np.ndarray, tolerance: Tolerance) -> Gate:
    return compare(name, [run(inputs)], [module(as_tensor(inputs)).numpy()], tolerance)


def decoder_gates(decoder, stream: StreamingConv, latents: np.ndarray, limits: Limits) -> list[Gate]:
    """Decoder input latents [1, T >= 8, C]: the streaming graph on a whole sequence from zero states (as
    `decode` runs it) against the reference's whole-sequence decode, frame by frame with its states against
    the reference's streaming decode, and the streamed frames against the whole decode."""
    reference = decoder(as_tensor(latents[:, :6]).transpose(1, 2)).audio.numpy()
    gates = [compare("acoustic_decoder (6 frames, one call from zero states)", [stream.whole(latents[:, :6])],
                     [reference], limits.graph)]
    state, ours_state, outputs, references = ConvState.zeros(conv_state_specs(decoder)), stream.new_state(), [], []
    for i in range(3):  # the first frame starts from zeros, the later ones from a carried state
        ours, ours_state = stream.run(latents[:, i : i + 1], ours_state)
        outputs.append(ours)
        references.append(decoder(as_tensor(latents[:, i : i + 1]).transpose(1, 2), padding_cache=state).audio.numpy())
    outputs += [host(value) for value in ours_state]
    references += [state.tensors[s["name"]].numpy() for s in stream.states]
    gates.append(compare("acoustic_decoder_stream (3 frames, states)", outputs, references, limits.graph))
    return gates + [streamed_decode_gate(stream, latents, limits)]
