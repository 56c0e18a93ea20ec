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

from ..checkpoints.configs import HeadDims, QwenDims
from ..reference.loading import is_placeholder
from ..reference.modules import ConvState, UpstreamPadding, conv_state_specs
from ..writer.graph import EXTERNAL_DATA_BYTES, OPSET  # noqa: F401 (OPSET: the traced graphs' as the written ones')


def kv_names(layers: int, prefix: str) -> list[str]:
    return [f"{prefix}.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]


# --- attention over a fixed-capacity KV cache: onnxruntime's GroupQueryAttention (com.microsoft) ---------------
#
# The LM graphs attend with one GroupQueryAttention node per layer. It takes the new tokens' keys and values
# (not yet rotated: the kernel rotates queries and keys by each row's positions, from cos/sin tables the graph
# holds), the past cache [B, KV, capacity, D] and each row's length, writes the new keys and values into the
# cache at each row's length and attends over the filled part. When the runtime binds a layer's past and present
# to the same memory, that write is in place: a step costs its attention, not a copy of the whole cache (facts
# sheet 12.12, item 8: a shared buffer is flat in memory). The KV heads are not repeated (in the kernel), rows keep
# lengths of their own (no padding masks), and the causal mask over the new tokens is the kernel's.

@torch.library.custom_op("vibevoice::group_query_attention", mutates_args=())
def group_query_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_key: torch.Tensor,
                          past_value: torch.Tensor, seqlens_k: torch.Tensor, total_sequence_length: torch.Tensor,
                          cos_cache: torch.Tensor, sin_cache: torch.Tensor, num_heads: int, kv_heads: int,
                          scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    raise NotImplementedError("traced for export only: onnxruntime's GroupQueryAttention computes it")


@group_query_attention.register_fake
def _(query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache, num_heads,
      kv_heads, scale):
    return query.new_empty(query.shape), past_key.new_empty(past_key.shape), past_value.new_empty(past_value.shape)


def _group_query_attention_op():
    """onnxscript's handle on the com.microsoft op, with the part of its schema these graphs use."""
    import onnxscript
    from onnx.defs import OpSchema

    formal, attribute = OpSchema.FormalParameter, OpSchema.Attribute
    schema = OpSchema(
        "GroupQueryAttention", "com.microsoft", 1,
        inputs=[formal(n, "T") for n in ("query", "key", "value", "past_key", "past_value")]
        + [formal(n, "M") for n in ("seqlens_k", "total_sequence_length")]
        + [formal(n, "T") for n in ("cos_cache", "sin_cache")],
        outputs=[formal(n, "T") for n in ("output", "present_key", "present_value")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)"], ""), ("M", ["tensor(int32)"], "")],
        attributes=[attribute(name, OpSchema.AttrType.INT, "") for name in ("num_heads", "kv_num_heads", "do_rotary")]
        + [attribute("scale", OpSchema.AttrType.FLOAT, "")])
    return onnxscript.values.Op(onnxscript.values.Opset("com.microsoft", 1), "GroupQueryAttention", schema)


def _translate_group_query_attention(query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
                                     cos_cache, sin_cache, num_heads: int, kv_heads: int, scale: float):
    return _group_query_attention_op()(query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
                                       cos_cache, sin_cache, num_heads=num_heads, kv_num_heads=kv_heads, do_rotary=1,
                                       scale=scale, _outputs=3)


CUSTOM_TRANSLATIONS = {torch.ops.vibevoice.group_query_attention.default: _translate_group_query_attention}


class LanguageModelGraph(nn.Module):
    """One Qwen2 stack over a KV cache of fixed capacity: inputs_embeds [B, S, H] and position_ids [B, S],
    seqlens_k [B] (each row's cached length after this call, minus one: GroupQueryAttention's convention),
    total_sequence_length (the longest row's), past K/V per layer [B, KV, capacity, D]; outputs the hidden
    states and the present K/V (the same capacity: the runtime binds them to the past's memory).

    transformers' layers, written out in the form onnxruntime runs fastest, as its model builder writes Qwen2
    for onnxruntime GenAI: each RMSNorm as the one SimplifiedLayerNormalization it fuses (with the residual
    add before it, SkipSimplifiedLayerNormalization), the rotary embedding inside GroupQueryAttention, and the
    query, key and value projections as one product where they are plain linears holding their weights (a
    BitNet's BitLinears and a skeleton's placeholders stay three). Positions are each row's cache length (the
    kernel's rotary counts them from seqlens_k; the runtime never feeds others), so position_ids only sizes the
    call. The same weights and numbers: verify gates the graph against transformers' model."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        # Only what the graph reads: no token embedding (the host embeds) and no rotary module (tables below).
        self.layers, self.norm = lm.layers, lm.norm
        attention = lm.layers[0].self_attn
        self.heads, self.kv_heads = lm.config.num_attention_heads, lm.config.num_key_value_heads
        self.head_dim, self.scale = attention.head_dim, float(attention.scaling)
        positions = torch.arange(lm.config.max_position_embeddings)[None]
        cos, sin = lm.rotary_emb(torch.zeros((), dtype=torch.float32), positions)
        half = self.head_dim // 2  # the two halves of each row repeat: the kernel takes one
        self.register_buffer("cos_cache", cos[0, :, :half].contiguous(), persistent=False)
        self.register_buffer("sin_cache", sin[0, :, :half].contiguous(), persistent=False)
        self.packed = nn.ModuleList(_stacked([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj])
                                    or nn.Identity() for layer in lm.layers)

    def forward(self, inputs_embeds, position_ids, seqlens_k, total_sequence_length, *past):
        x, present = inputs_embeds, []
        for index, layer in enumerate(self.layers):
            attended, key, value = self._attention(index, layer.self_attn, rms_norm(x, layer.input_layernorm),
                                                   past[2 * index], past[2 * index + 1], seqlens_k, total_sequence_length)
            x = x + attended
            x = x + layer.mlp(rms_norm(x, layer.post_attention_layernorm))
            present += [key, value]
        return (rms_norm(x, self.norm) if hasattr(self.norm, "variance_epsilon") else self.norm(x), *present)

    def _attention(self, index, attention, hidden, past_key, past_value, seqlens_k, total):
        packed = self.packed[index]
        if isinstance(packed, nn.Linear):
            query, key, value = packed(hidden).split([self.heads * self.head_dim, *2 * [self.kv_heads * self.head_dim]], -1)
        else:
            query, key, value = (attention.q_proj(hidden), attention.k_proj(hidden), attention.v_proj(hidden))
        output, present_key, present_value = torch.ops.vibevoice.group_query_attention(
            query, key, value, past_key, past_value, seqlens_k, total, self.cos_cache, self.sin_cache,
            self.heads, self.kv_heads, self.scale)
        return attention.o_proj(output), present_key, present_value


def rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """transformers' RMSNorm written x / sqrt(mean(x²) + eps) · w, the form onnxruntime fuses into one
    SimplifiedLayerNormalization when it loads the graph (the file keeps standard ops); its rsqrt form stays
    seven operators, each over the whole activation."""
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon) * norm.weight


class ChannelsLastUpsampler(nn.Module):
    """transformers' causal transposed conv (kernel 2·stride) on channels-last frames [B, F, C_in] as two
    MatMuls: each frame times the kernel's first half gives its `stride` samples, to which the previous frame
    times the second half adds its overlap; out [B, F·stride, C_out], channels-last with no transpose (the
    weights' columns are ordered sample, channel). A MatMul is what onnxruntime quantizes and runs fast: the
    ConvTranspose kept its weights fp32 and took a sixth of the decoder's time. Stateless (a zero frame in
    front, as the causal conv trims) or with a padding cache, like the original."""

    def __init__(self, upsampler: nn.Module):
        super().__init__()
        conv = upsampler.convtr
        channels_in, channels_out, kernel = conv.weight.shape
        if kernel != 2 * upsampler.stride or conv.groups != 1:
            raise ValueError(f"expected a kernel of twice the stride, got {kernel} for stride {upsampler.stride}")
        self.original, self.stride, self.channels_out = upsampler, upsampler.stride, channels_out
        halves = conv.weight.detach().reshape(channels_in, channels_out, 2, self.stride).permute(2, 0, 3, 1)
        self.current, self.previous = (nn.Parameter(h.reshape(channels_in, self.stride * channels_out).clone(),
                                                    requires_grad=False) for h in halves)
        self.bias = nn.Parameter(conv.bias.detach().clone(), requires_grad=False)

    def forward(self, frames, padding_cache=None):
        if padding_cache is None:
            frames = nn.functional.pad(frames, (0, 0, 1, 0))
        else:
            frames = padding_cache.update_channels_last(frames, self.original.cache_key)
        batch, count = frames.shape[0], frames.shape[1] - 1
        samples = torch.matmul(frames[:, 1:], self.current) + torch.matmul(frames[:, :-1], self.previous)
        return samples.reshape(batch, count * self.stride, self.channels_out) + self.bias


class ChannelsLastStage(nn.Module):
    """A stage of a conv stack (an entry that changes the rate: a conv or an upsampler; then ConvNeXt blocks)
    whose residual stream stays channels-last [B, T, C], the layout of its norms and linears: transformers'
    blocks work channels-first and transpose the whole activation four times a block; here only the depthwise
    conv's input and output are. The same weights and numbers (gated against the reference stacks)."""

    def __init__(self, entry: nn.Module, blocks: nn.ModuleList):
        super().__init__()
        self.entry, self.blocks = entry, blocks

    def forward(self, hidden_states, padding_cache=None):
        x = self.entry(hidden_states, padding_cache=padding_cache)
        for block in self.blocks:
            mixed = block.mixer(rms_norm(x, block.norm).transpose(1, 2), padding_cache=padding_cache)
            x = x + mixed.transpose(1, 2) * block.gamma
            x = x + block.ffn(rms_norm(x, block.ffn_norm)) * block.ffn_gamma
        return x


class ChannelsFirstConv(nn.Module):
    """One of transformers' causal convs (channels-first, as ONNX's Conv is) in a channels-last stack: its input
    and output transposed where the neighbours are channels-last."""

    def __init__(self, conv: nn.Module, channels_last_in: bool, channels_last_out: bool):
        super().__init__()
        self.conv, self.channels_last_in, self.channels_last_out = conv, channels_last_in, channels_last_out

    def forward(self, hidden_states, padding_cache=None):
        if self.channels_last_in:
            hidden_states = hidden_states.transpose(1, 2)
        out = self.conv(hidden_states, padding_cache=padding_cache)
        return out.transpose(1, 2) if self.channels_last_out else out


def _channels_last_view(stack: nn.Module, layer_entry: Callable[[nn.Module], nn.Module]) -> nn.Module:
    """A shallow view of one of transformers' conv stacks (stem, conv_layers, head) whose stages are
    ChannelsLastStage; the stack itself is left as it is. Its input and output stay channels-first, and its
    conv states keep their keys, order and channels-first layout."""
    view = copy.copy(stack)
    view._modules = dict(stack._modules)
    view._modules["stem"] = ChannelsLastStage(ChannelsFirstConv(stack.stem.conv, False, True), stack.stem.stage)
    view._modules["conv_layers"] = nn.ModuleList(ChannelsLastStage(layer_entry(layer), layer.stage)
                                                 for layer in stack.conv_layers)
    view._modules["head"] = ChannelsFirstConv(stack.head, True, False)
    return view


def export_decoder_view(decoder: nn.Module) -> nn.Module:
    """transformers' decoder for export: channels-last stages with MatMul upsamplers (ChannelsLastUpsampler)."""
    return _channels_last_view(decoder, lambda layer: ChannelsLastUpsampler(layer.convtr))


def export_encoder_view(encoder: nn.Module) -> nn.Module:
    """transformers' encoder for export: channels-last stages, each entered by its strided conv."""
    return _channels_last_view(encoder, lambda layer: ChannelsFirstConv(layer.conv, True, True))


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
        self.encoder = export_encoder_view(encoder)

    def forward(self, audio):
        return self.encoder(audio, padding_cache=UpstreamPadding()).latents


def encoder_spec(name: str, encoder: nn.Module, hop: int, generator: torch.Generator) -> GraphSpec:
    """An encoder over audio of any length in one pass (see EncoderGraph), batched."""
    samples = Dim("samples", min=2, max=hop * 4096)
    return GraphSpec(name, EncoderGraph(encoder), (torch.randn(2, 1, hop * 2 + 123, generator=generator) * 0.1,),
                     ["audio"], ["latents"], ({0: BATCH, 2: samples},))


LM_INPUTS = ["inputs_embeds", "position_ids", "seqlens_k", "total_sequence_length"]


def lm_spec(name: str, lm: nn.Module, q: QwenDims, generator: torch.Generator) -> GraphSpec:
    """A Qwen2 stack over a fixed-capacity KV cache, rows of their own lengths (see LanguageModelGraph)."""
    seq = Dim("sequence", min=1, max=q.max_positions)
    capacity = Dim("capacity", min=1, max=q.max_positions)
    example_past = tuple(torch.zeros(2, q.kv_heads, 16, q.head_dim) for _ in range(2 * q.layers))
    return GraphSpec(
        name,
        LanguageModelGraph(lm),
        # two rows taking a 3-token prompt each (onnxruntime's kernel takes several tokens per row only then)
        (torch.randn(2, 3, q.hidden, generator=generator), torch.arange(3)[None].repeat(2, 1),
         torch.tensor([2, 2], dtype=torch.int32), torch.tensor(3, dtype=torch.int32), *example_past),
        [*LM_INPUTS, *kv_names(q.layers, "past_key_values")],
        ["hidden_states", *kv_names(q.layers, "present")],
        ({0: BATCH, 1: seq}, {0: BATCH, 1: seq}, {0: BATCH}, {}, tuple({0: BATCH, 2: capacity} for _ in example_past)),
    )


class HeadConditioningGraph(nn.Module):
    """The diffusion head's part that sees only the timestep and the condition: every adaLN layer's modulation
    linear(act(cond_proj(condition) + timestep_proj(t))), then the final layer's, concatenated [N, (3L+2)·H].
    A frame's sampler runs it once for all its steps and both CFG rows, so these weights (a third of the head's)
    are read once per frame instead of once per step. Every layer applies the same activation to the same
    condition, so their projections are one product (their weights stacked), which needs no Concat."""

    def __init__(self, head: nn.Module):
        super().__init__()  # only the modules it uses: the graph holds no weight it does not read
        self.cond_proj, self.timestep_embedding, self.timestep_proj = head.cond_proj, head.timestep_embedding, head.timestep_proj
        activations = [*(layer.act_fn for layer in head.layers), head.final_layer.act_fn]
        projections = [*(layer.linear for layer in head.layers), head.final_layer.linear_1]
        stacked = _stacked(projections) if len({type(a) for a in activations}) == 1 else None
        if stacked is not None:
            self.activations, self.projections = nn.ModuleList(activations[:1]), nn.ModuleList([stacked])
        else:
            self.activations, self.projections = nn.ModuleList(activations), nn.ModuleList(projections)

    def forward(self, timesteps, condition):
        embedded = self.timestep_proj(self.timestep_embedding(timesteps).to(timesteps.dtype))
        condition = self.cond_proj(condition) + embedded
        if len(self.activations) == 1:
            return self.projections[0](self.activations[0](condition))
        return torch.cat([project(act(condition)) for act, project in zip(self.activations, self.projections)], dim=-1)


def _stacked(linears: list[nn.Module]) -> nn.Linear | None:
    """Linears that read one input as one (their weights and biases stacked, in order), or None where they
    cannot be: not all plain linears holding their weights (a BitNet's BitLinears, a skeleton's placeholders
    whose weights stream from the shards), or some with a bias and some without."""
    if not all(type(linear) is nn.Linear and not is_placeholder(linear.weight) for linear in linears):
        return None
    biased = {linear.bias is not None for linear in linears}
    if len(biased) > 1:
        return None
    stacked = nn.Linear(linears[0].in_features, sum(linear.out_features for linear in linears), bias=biased.pop(),
                        device="meta")
    stacked.weight = nn.Parameter(torch.cat([linear.weight.detach() for linear in linears]), requires_grad=False)
    if stacked.bias is not None:
        stacked.bias = nn.Parameter(torch.cat([linear.bias.detach() for linear in linears]), requires_grad=False)
    return stacked


class _UnitRmsNorm(nn.Module):
    """An RMSNorm without a learnt scale (the head's final layer), as rms_norm takes one: a scale of ones, so the
    graph has the form onnxruntime fuses."""

    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.variance_epsilon = eps
        self.register_buffer("weight", torch.ones(hidden), persistent=False)


class HeadStepGraph(nn.Module):
    """The rest of the head, once per sampler step: the noisy latent through the adaLN layers, modulated by
    HeadConditioningGraph's output for this step's rows: transformers' layers written out with their norms in
    the form onnxruntime fuses (7 operators each in transformers' form)."""

    def __init__(self, head: nn.Module):
        super().__init__()  # only the modules it uses: each layer's norm and MLP, the final projection
        self.noisy_images_proj = head.noisy_images_proj
        self.norms = nn.ModuleList(layer.norm for layer in head.layers)
        self.ffns = nn.ModuleList(layer.ffn for layer in head.layers)
        hidden = head.cond_proj.out_features
        self.final_norm, self.output = _UnitRmsNorm(hidden, head.final_layer.rms_norm_eps), head.final_layer.linear_2
        self.widths = [3 * hidden] * len(head.layers) + [2 * hidden]

    def forward(self, noisy_latents, modulation):
        hidden = self.noisy_images_proj(noisy_latents)
        *per_layer, final = modulation.split(self.widths, dim=-1)
        for norm, ffn, layer_modulation in zip(self.norms, self.ffns, per_layer):
            shift, scale, gate = layer_modulation.chunk(3, dim=-1)
            hidden = hidden + gate * ffn(rms_norm(hidden, norm) * (1 + scale) + shift)
        shift, scale = final.chunk(2, dim=-1)
        return self.output(rms_norm(hidden, self.final_norm) * (1 + scale) + shift)


def head_specs(head: nn.Module, h: HeadDims, generator: torch.Generator) -> list[GraphSpec]:
    """The diffusion head as two graphs (HeadConditioningGraph, HeadStepGraph); the runtime composes them."""
    conditioning = HeadConditioningGraph(head)
    timesteps, condition = torch.tensor([999.0, 999.0, 500.0, 500.0]), torch.randn(4, h.hidden, generator=generator)
    with torch.no_grad():
        modulation = conditioning(timesteps, condition)[:2]
    return [
        GraphSpec("diffusion_head_conditioning", conditioning, (timesteps, condition), ["timesteps", "condition"],
                  ["modulation"], ({0: BATCH}, {0: BATCH})),
        GraphSpec("diffusion_head_step", HeadStepGraph(head), (torch.randn(2, h.latent, generator=generator), modulation),
                  ["noisy_latents", "modulation"], ["velocity"], ({0: BATCH}, {0: BATCH})),
    ]


def connector_spec(name: str, connector: nn.Module, in_dim: int, generator: torch.Generator) -> GraphSpec:
    return GraphSpec(name, connector, (torch.randn(1, 2, in_dim, generator=generator),), ["latents"], ["embeddings"],
                     ({0: BATCH, 1: FRAMES},))


def state_extra(specs) -> dict:
    return {"states": [{"name": key, "channels": c, "length": n} for key, c, n in specs]}


def decoder_specs(decoder: nn.Module, latent: int, generator: torch.Generator, name: str = "acoustic_decoder") -> list[GraphSpec]:
    """The decoder as one streaming graph (conv states as explicit inputs and outputs, MatMul upsamplers): from
    zero states it decodes a whole sequence exactly as the whole-sequence decoder does (its zero padding is
    the zero state; gated by verify), so a bundle holds the decoder's weights once (1.37 GB at full size)."""
    stream = StreamingConvGraph(export_decoder_view(decoder), decoder=True)
    states = tuple(torch.zeros(1, c, n) for _, c, n in stream.specs)
    return [
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
    stream = StreamingConvGraph(export_encoder_view(encoder), decoder=False, pad_to_stride=any_length)
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
            custom_translation_table=CUSTOM_TRANSLATIONS,
            verbose=False,
        )


def fuse_gelus(model) -> int:
    """Replace each erf-GELU the exporter spells out op by op (Div, Erf, Add, Mul, Mul) with onnxruntime's
    fused Gelu kernel (com.microsoft), by onnxscript's own rewrite rule: one pass over the tensor instead of
    five, which matters where tensors are large. Full-size int8 decoder, 3 frames a call, interleaved in one
    process: 56.5 -> 50.5 ms a frame. Fusing the RMSNorms as well gained nothing more, and their fused op
    lives in the standard domain, where the ONNX checker rejects it. Same erf arithmetic in fp32."""
    from onnx_ir.passes.common import RemoveUnusedNodesPass
    from onnxscript.rewriter.ort_fusions.erfgelu import fuse_erfgelu

    count = fuse_erfgelu(model)
    RemoveUnusedNodesPass()(model)  # the constants of the spelt-out form, which onnxruntime warns about at load
    return count


def export_graph(spec: GraphSpec, out_dir: Path, log: Callable[[str], None] = print, fuse: bool = True) -> Path:
    """`fuse`: onnxruntime's fused kernels where they pay (fuse_gelus); off for graphs of standard ops only."""
    path = Path(out_dir) / f"{spec.name}.onnx"
    external = _param_bytes(spec.module) > EXTERNAL_DATA_BYTES
    program = trace(spec)
    if fuse:
        fuse_gelus(program.model)
    program.save(str(path), external_data=external)
    log(f"  exported {spec.name} ({_param_bytes(spec.module) / 1e6:.1f} MB of weights)")
    return path
