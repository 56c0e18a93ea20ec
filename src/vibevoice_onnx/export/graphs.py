"""Standalone graphs: torch wrappers with flat tensor signatures, the specs every kind shares, and export.

Each wrapper turns one reference component into a function of plain tensors (KV caches and conv states as
explicit inputs/outputs), so onnxruntime can drive it from numpy. Export uses torch.onnx (dynamo).
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.export import Dim
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..checkpoints.configs import HeadDims, QwenDims
from ..reference.modules import ConvState, UpstreamPadding, conv_state_specs

OPSET = 18
EXTERNAL_DATA_BYTES = 64 * 2**20  # graphs with more weights than this keep them in a .onnx.data file


def kv_names(layers: int, prefix: str) -> list[str]:
    return [f"{prefix}.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]


GROUPED_ATTENTION = "vibevoice_grouped"


def grouped_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Grouped-query attention without repeating the KV heads: the query heads that share a KV head are stacked
    as extra query rows. What torch's SDPA exports instead (each KV head expanded to its query heads, then the
    keys transposed) copies the whole cache three times per layer and step: a 7B decode step spent a quarter of
    its time there. Same numbers as SDPA (the gates compare with the SDPA reference)."""
    batch, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    query = (query * scaling).reshape(batch, kv_heads, groups * length, dim)
    scores = torch.matmul(query, key.transpose(-1, -2)).reshape(batch, kv_heads, groups, length, -1)
    # Boolean mask [B, 1, S, P+S]; fully masked rows (left padding) get a uniform softmax, not NaN: unused rows.
    scores = torch.where(attention_mask[:, :, None], scores, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1).reshape(batch, kv_heads, groups * length, -1)
    output = torch.matmul(probs, value).reshape(batch, heads, length, dim)
    return output.transpose(1, 2), None


def _always_masked(**kwargs):
    # A mask even where SDPA could rely on is_causal: grouped_attention always takes one.
    return sdpa_mask(**{**kwargs, "allow_is_causal_skip": False})


AttentionInterface.register(GROUPED_ATTENTION, grouped_attention)
AttentionMaskInterface.register(GROUPED_ATTENTION, _always_masked)


class LanguageModelGraph(nn.Module):
    """One Qwen2 stack with its KV cache as inputs (past length P may be 0) and outputs (length P+S).

    The attention mask [B, P+S] lets the runtime batch the positive and negative CFG streams, the shorter
    one left-padded (mask 0); position ids are explicit because the two streams sit at different positions.
    """

    def __init__(self, lm: nn.Module):
        super().__init__()
        # A shallow view of the model without its token embedding: the host embeds, the graph never does.
        self.lm = copy.copy(lm)
        self.lm._modules = dict(lm._modules)
        self.lm._modules["embed_tokens"] = None
        self.layers = len(lm.layers)

    def forward(self, inputs_embeds, attention_mask, position_ids, *past):
        cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(self.layers)])
        config = self.lm.config  # shared with the reference, which keeps SDPA: switched for this call only
        reference_attention, config._attn_implementation = config._attn_implementation, GROUPED_ATTENTION
        try:
            out = self.lm(inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids,
                          past_key_values=cache, use_cache=True)
        finally:
            config._attn_implementation = reference_attention
        return (out.last_hidden_state, *[t for layer in cache.layers for t in (layer.keys, layer.values)])


class DecoderGraph(nn.Module):
    """Whole-sequence decode: latents [B, T, C] -> audio [B, 1, T·hop]."""

    def __init__(self, decoder: nn.Module):
        super().__init__()
        self.decoder = decoder

    def forward(self, latents):
        return self.decoder(latents.transpose(1, 2)).audio


class StreamingConvGraph(nn.Module):
    """A causal conv stack run on a chunk with every conv's state passed in and returned (facts sheet 4.4).

    A decoder takes latents [1, F, C] and returns audio [1, 1, F·hop]; an encoder takes audio [1, 1, F·hop]
    and returns latents [1, F, C]."""

    def __init__(self, stack: nn.Module, decoder: bool, pad_to_stride: bool = False):
        super().__init__()
        self.stack, self.decoder, self.pad_to_stride = stack, decoder, pad_to_stride
        self.specs = conv_state_specs(stack)

    def forward(self, chunk, *states):
        state = ConvState({key: s for (key, _, _), s in zip(self.specs, states)}, self.pad_to_stride)
        if self.decoder:
            out = self.stack(chunk.transpose(1, 2), padding_cache=state).audio
        else:
            out = self.stack(chunk, padding_cache=state).latents
        return (out, *[state.tensors[key] for key, _, _ in self.specs])


@dataclass
class GraphSpec:
    """What to export: a wrapper, example inputs, names and dynamic axes."""

    name: str
    module: nn.Module
    example: tuple
    inputs: list[str]
    outputs: list[str]
    dynamic: tuple  # torch.export dynamic_shapes, one entry per forward parameter (varargs: one tuple)
    extra: dict = field(default_factory=dict)  # manifest additions (e.g. state specs)


BATCH = Dim("batch", min=1, max=64)
FRAMES = Dim("frames", min=1, max=4096)


class EncoderGraph(nn.Module):
    """Whole-sequence encode with upstream's non-streaming padding: audio [B, 1, N] -> means [B, ceil(N/hop), C]."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, audio):
        return self.encoder(audio, padding_cache=UpstreamPadding()).latents


def encoder_spec(name: str, encoder: nn.Module, hop: int, generator: torch.Generator) -> GraphSpec:
    """An encoder over audio of any length in one pass (see EncoderGraph), batched."""
    samples = Dim("samples", min=2, max=hop * 4096)
    return GraphSpec(name, EncoderGraph(encoder), (torch.randn(2, 1, hop * 2 + 123, generator=generator) * 0.1,),
                     ["audio"], ["latents"], ({0: BATCH, 2: samples},))


def lm_spec(name: str, lm: nn.Module, q: QwenDims, generator: torch.Generator) -> GraphSpec:
    """A Qwen2 stack with KV cache, batched rows of their own positions and mask (see LanguageModelGraph)."""
    seq = Dim("sequence", min=1, max=q.max_positions)
    past = Dim("past_sequence", min=0, max=q.max_positions)
    example_past = tuple(torch.randn(2, q.kv_heads, 5, q.head_dim, generator=generator) for _ in range(2 * q.layers))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :2] = 0
    return GraphSpec(
        name,
        LanguageModelGraph(lm),
        (torch.randn(2, 3, q.hidden, generator=generator), mask, torch.arange(5, 8)[None].repeat(2, 1), *example_past),
        ["inputs_embeds", "attention_mask", "position_ids", *kv_names(q.layers, "past_key_values")],
        ["hidden_states", *kv_names(q.layers, "present")],
        ({0: BATCH, 1: seq}, {0: BATCH, 1: Dim.AUTO}, {0: BATCH, 1: seq}, tuple({0: BATCH, 2: past} for _ in example_past)),
    )


def head_spec(head: nn.Module, h: HeadDims, generator: torch.Generator) -> GraphSpec:
    return GraphSpec(
        "diffusion_head",
        head,
        (torch.randn(2, h.latent, generator=generator), torch.tensor([999.0, 999.0]), torch.randn(2, h.hidden, generator=generator)),
        ["noisy_latents", "timesteps", "condition"],
        ["velocity"],
        ({0: BATCH}, {0: BATCH}, {0: BATCH}),
    )


def connector_spec(name: str, connector: nn.Module, in_dim: int, generator: torch.Generator) -> GraphSpec:
    return GraphSpec(name, connector, (torch.randn(1, 2, in_dim, generator=generator),), ["latents"], ["embeddings"],
                     ({0: BATCH, 1: FRAMES},))


def state_extra(specs) -> dict:
    return {"states": [{"name": key, "channels": c, "length": n} for key, c, n in specs]}


def decoder_specs(decoder: nn.Module, latent: int, generator: torch.Generator, name: str = "acoustic_decoder") -> list[GraphSpec]:
    """The whole-sequence decoder and its streaming twin (conv states as explicit inputs and outputs)."""
    stream = StreamingConvGraph(decoder, decoder=True)
    states = tuple(torch.zeros(1, c, n) for _, c, n in stream.specs)
    return [
        GraphSpec(name, DecoderGraph(decoder), (torch.randn(1, 3, latent, generator=generator),), ["latents"], ["audio"],
                  ({1: FRAMES},)),
        GraphSpec(
            f"{name}_stream",
            stream,
            (torch.randn(1, 2, latent, generator=generator), *states),
            ["latents", *[f"state.{key}" for key, _, _ in stream.specs]],
            ["audio", *[f"new_state.{key}" for key, _, _ in stream.specs]],
            ({1: FRAMES}, tuple({} for _ in states)),
            extra=state_extra(stream.specs),
        ),
    ]


def streaming_encoder_spec(name: str, encoder: nn.Module, hop: int, generator: torch.Generator,
                           any_length: bool = False) -> GraphSpec:
    """An encoder fed whole frames of audio [1, 1, F·hop] with its conv states in and out: F latent frames.
    `any_length`: a chunk of any length, the last one padded as upstream pads a long recording's final
    segment (see ConvState's pad_to_stride); whole-frame chunks are unchanged by that."""
    stream = StreamingConvGraph(encoder, decoder=False, pad_to_stride=any_length)
    states = tuple(torch.zeros(1, c, n) for _, c, n in stream.specs)
    samples = Dim("samples", min=2, max=hop * 4096) if any_length else hop * FRAMES
    return GraphSpec(
        name,
        stream,
        (torch.randn(1, 1, 2 * hop + (123 if any_length else 0), generator=generator) * 0.1, *states),
        ["audio", *[f"state.{key}" for key, _, _ in stream.specs]],
        ["latents", *[f"new_state.{key}" for key, _, _ in stream.specs]],
        ({2: samples}, tuple({} for _ in states)),
        extra=state_extra(stream.specs),
    )


def _param_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def trace(spec: GraphSpec, optimize: bool = True):
    """torch.onnx (dynamo) on the spec's wrapper: the ONNXProgram, not yet saved."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        return torch.onnx.export(
            spec.module.eval(),
            spec.example,
            dynamo=True,
            input_names=spec.inputs,
            output_names=spec.outputs,
            dynamic_shapes=spec.dynamic,
            opset_version=OPSET,
            optimize=optimize,
            verbose=False,
        )


def export_graph(spec: GraphSpec, out_dir: Path, log: Callable[[str], None] = print) -> Path:
    path = Path(out_dir) / f"{spec.name}.onnx"
    external = _param_bytes(spec.module) > EXTERNAL_DATA_BYTES
    trace(spec).save(str(path), external_data=external)
    log(f"  exported {spec.name} ({_param_bytes(spec.module) / 1e6:.1f} MB of weights)")
    return path
