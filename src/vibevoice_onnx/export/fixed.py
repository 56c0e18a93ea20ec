"""The fixed-shape realtime profile (`build --profile fixed`): every graph with static shapes and standard ops
only, for engines that compile a graph once for its shapes (onnxruntime's CoreML, NNAPI and QNN providers,
static TensorRT profiles).

* LMs over caches of a fixed capacity N: a graph takes the past [B, KV, N, D] of each layer as it is, an additive
  attention bias [B, 1, S, N + S] (0 where a row may look: its filled past and the new tokens up to itself; a
  large negative number elsewhere) and returns the hidden states and only the S new keys and values, which the
  host writes into its cache at the row's length. Attention scores the past and the new tokens apart and joins
  only the scores, so no call copies the cache; there is no scatter, no dynamic slice and no custom op.
  Three graphs: the lower and upper LM over a 5-token text window (batch 1; a shorter window is padded and its
  padding never written), and the upper LM's one-token step with both CFG rows (batch 2).
* The diffusion head whole at noisy [2, 64], t [2], condition [2, H] (the cond and uncond rows of one step).
* The connector at [1, 1, 64]; the acoustic decoder at [1, T, 64] with its conv states in and out.
* The EOS classifier runs on the host (two small matrix products from the host tensors).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import AttentionInterface

from ..checkpoints.configs import QwenDims
from ..errors import VibeVoiceError
from ..reference.realtime import RealtimeModel
from ..text import TEXT_WINDOW
from .graphs import GraphSpec, StreamingConvGraph, kv_names, state_extra, export_decoder_view
from .realtime import host_tensors as dynamic_host_tensors
from .realtime import load_model

FIXED_ATTENTION = "vibevoice_fixed_cache"
DEFAULT_CACHE = 1024
DEFAULT_DECODER_FRAMES = 3  # the runtime's decode group: after the first window, every call is one whole tile


class _FixedCache:
    """What one traced call gives the layers' attention: each layer's past, and the new keys and values it keeps."""

    active: list["_FixedCache"] = []

    def __init__(self, past):
        self.past, self.present = past, {}

    def update(self, key, value, layer_idx, *args, **kwargs):
        return key, value

    def get_seq_length(self, *args, **kwargs) -> int:
        return 0  # positions are explicit inputs


def fixed_cache_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """q [B, H, S, D] against the layer's past [B, KV, N, D] and the new k, v [B, KV, S, D] (rotated), the groups
    of query heads sharing a KV head broadcast (no repeat), `attention_mask` the additive bias [B, 1, S, N + S]."""
    cache, layer = _FixedCache.active[-1], module.layer_idx
    past_key, past_value = cache.past[2 * layer], cache.past[2 * layer + 1]
    batch, heads, length, dim = query.shape
    kv_heads, capacity = key.shape[1], past_key.shape[2]
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, length, dim)
    scores = torch.cat([torch.matmul(grouped, past_key.unsqueeze(2).transpose(-1, -2)),
                        torch.matmul(grouped, key.unsqueeze(2).transpose(-1, -2))], dim=-1) * scaling
    probs = torch.softmax(scores + attention_mask.unsqueeze(1), dim=-1)
    output = (torch.matmul(probs[..., :capacity], past_value.unsqueeze(2))
              + torch.matmul(probs[..., capacity:], value.unsqueeze(2)))
    cache.present[layer] = (key, value)
    return output.reshape(batch, heads, length, dim).transpose(1, 2), None


AttentionInterface.register(FIXED_ATTENTION, fixed_cache_attention)


class FixedLanguageModelGraph(nn.Module):
    """One Qwen2 stack over caches of fixed capacity (see the module's notes): inputs_embeds [B, S, H],
    position_ids [B, S], attention_bias [B, 1, S, N + S], past K/V per layer [B, KV, N, D]; outputs the hidden
    states [B, S, H] and each layer's new K/V [B, KV, S, D]."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = copy.copy(lm)  # a shallow view without the token embedding: the host embeds
        self.lm._modules = dict(lm._modules)
        self.lm._modules["embed_tokens"] = None
        self.layers = len(lm.layers)

    def forward(self, inputs_embeds, position_ids, attention_bias, *past):
        cache = _FixedCache(past)
        config = self.lm.config  # shared with the reference, which keeps SDPA: switched for this call only
        reference_attention, config._attn_implementation = config._attn_implementation, FIXED_ATTENTION
        _FixedCache.active.append(cache)
        try:
            out = self.lm(inputs_embeds=inputs_embeds, attention_mask={"full_attention": attention_bias},
                          position_ids=position_ids, past_key_values=cache, use_cache=True)
        finally:
            config._attn_implementation = reference_attention
            _FixedCache.active.pop()
        return (out.last_hidden_state, *[t for layer in range(self.layers) for t in cache.present[layer]])


LM_INPUTS = ["inputs_embeds", "position_ids", "attention_bias"]


def fixed_lm_spec(name: str, lm: nn.Module, q: QwenDims, rows: int, tokens: int, capacity: int,
                  generator: torch.Generator) -> GraphSpec:
    past = tuple(torch.randn(rows, q.kv_heads, capacity, q.head_dim, generator=generator) for _ in range(2 * q.layers))
    bias = torch.zeros(rows, 1, tokens, capacity + tokens)
    return GraphSpec(
        name, FixedLanguageModelGraph(lm),
        (torch.randn(rows, tokens, q.hidden, generator=generator), torch.arange(tokens)[None].repeat(rows, 1),
         bias, *past),
        [*LM_INPUTS, *kv_names(q.layers, "past_key_values")], ["hidden_states", *kv_names(q.layers, "new")],
        None, extra={"fixed": {"rows": rows, "tokens": tokens, "capacity": capacity}})


class WholeHeadGraph(nn.Module):
    def __init__(self, head: nn.Module):
        super().__init__()
        self.head = head

    def forward(self, noisy_latents, timesteps, condition):
        return self.head(noisy_latents, timesteps, condition)


def graph_specs(model: RealtimeModel, capacity: int = DEFAULT_CACHE,
                decoder_frames: int = DEFAULT_DECODER_FRAMES) -> list[GraphSpec]:
    dims = model.dims
    hidden, latent = dims.lm.hidden, dims.head.latent
    g = torch.Generator().manual_seed(0)
    decoder = StreamingConvGraph(export_decoder_view(model.acoustic_decoder), decoder=True)
    states = tuple(torch.zeros(1, c, n) for _, c, n in decoder.specs)
    return [
        fixed_lm_spec("lower_lm_text", model.language_model, dims.lm, 1, TEXT_WINDOW, capacity, g),
        fixed_lm_spec("upper_lm_text", model.tts_language_model, dims.tts_lm, 1, TEXT_WINDOW, capacity, g),
        fixed_lm_spec("upper_lm_step", model.tts_language_model, dims.tts_lm, 2, 1, capacity, g),
        GraphSpec("diffusion_head", WholeHeadGraph(model.diffusion_head),
                  (torch.randn(2, latent, generator=g), torch.tensor([999.0, 999.0]), torch.randn(2, hidden, generator=g)),
                  ["noisy_latents", "timesteps", "condition"], ["velocity"], None),
        GraphSpec("acoustic_connector", model.acoustic_connector, (torch.randn(1, 1, latent, generator=g),),
                  ["latents"], ["embeddings"], None),
        GraphSpec("acoustic_decoder_tile", decoder, (torch.randn(1, decoder_frames, latent, generator=g), *states),
                  ["latents", *[f"state.{key}" for key, _, _ in decoder.specs]],
                  ["audio", *[f"new_state.{key}" for key, _, _ in decoder.specs]], None,
                  extra={**state_extra(decoder.specs), "fixed": {"frames": decoder_frames}}),
    ]


def host_tensors(files, model: RealtimeModel) -> dict[str, np.ndarray]:
    """The dynamic bundle's host tensors and the EOS classifier's weights (it runs on the host here)."""
    eos = model.eos_classifier
    return {**dynamic_host_tensors(files, model),
            **{f"eos_classifier.{name}": p.detach().float().numpy() for name, p in eos.named_parameters()}}


@dataclass(frozen=True)
class FixedProfile:
    """`build --profile fixed`'s choices; the build asks it for the exporter, the bundle's folder suffix, the
    precision policy and the checks written into the manifest."""

    cache: int = DEFAULT_CACHE
    decoder_frames: int = DEFAULT_DECODER_FRAMES
    ort_format: bool = False
    name: str = "fixed"

    @classmethod
    def from_options(cls, cache: int | None, decoder_frames: int | None, ort_format: bool = False) -> "FixedProfile":
        cache = DEFAULT_CACHE if cache is None else cache
        frames = DEFAULT_DECODER_FRAMES if decoder_frames is None else decoder_frames
        if not 16 <= cache <= 32768:
            raise VibeVoiceError(f"--cache {cache}: give a capacity from 16 to 32768 positions")
        if not 1 <= frames <= 256:
            raise VibeVoiceError(f"--decoder-frames {frames}: give 1 to 256 frames a decoder call")
        return cls(cache, frames, ort_format)

    suffix = "_fixed"
    policy = "export.precision:REALTIME_FIXED_POLICY"  # its graphs' schemes (see families.Family.policy)

    def check_kind(self, kind: str) -> None:
        if kind != "realtime":
            raise VibeVoiceError(f"--profile fixed builds realtime checkpoints only; this one is {kind}")

    def exporter(self):
        profile = self

        class Exporter:
            fuse_ops = False  # standard ops only: no com.microsoft Gelu
            load_model = staticmethod(load_model)
            host_tensors = staticmethod(host_tensors)

            @staticmethod
            def graph_specs(model):
                return graph_specs(model, profile.cache, profile.decoder_frames)

        return Exporter

    def manifest(self) -> dict:
        return {"name": self.name, "cache": self.cache, "decoder_frames": self.decoder_frames}

    def finish(self, folder: Path, graphs: dict, log) -> dict:
        """Every graph's shapes checked static (the build fails otherwise), onnxruntime's mobile usability
        report for NNAPI and CoreML per graph, and the ORT-format copies when asked: the manifest's record."""
        from .mobile import ort_format, static_shapes_and_usability

        report = {}
        for name, graph in graphs.items():
            symbolic, usability = static_shapes_and_usability(folder / graph["file"])
            if symbolic:
                raise VibeVoiceError(f"{name}: not every shape is static ({', '.join(symbolic[:5])}); "
                                     "a fixed bundle must have none")
            graph["mobile"] = usability
            if self.ort_format:
                graph["ort_file"] = ort_format(folder / graph["file"])
            report[name] = usability
            log(f"  {name}: static shapes; NNAPI {usability['nnapi']['supported_nodes']}/{usability['nnapi']['nodes']} "
                f"nodes in {usability['nnapi']['partitions']} partition(s), CoreML "
                f"{usability['coreml']['supported_nodes']}/{usability['coreml']['nodes']} in "
                f"{usability['coreml']['partitions']}")
        return {**self.manifest(), "static_shapes": True}
