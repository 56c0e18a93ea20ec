"""The pieces every kind's graphs are written from, in the operators and order of the traced export
(export/graphs.py), so onnxruntime fuses them the same way: Qwen2 stacks over GroupQueryAttention, the
diffusion head's two graphs, connectors, and σ-VAE conv stacks with their streaming states.

A `Weights` reads the checkpoint one tensor at a time, under one prefix (bf16 and fp16 widen to fp32
exactly); a block takes the names it needs from it, so nothing is loaded that a graph does not hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..checkpoints.configs import ConvStackDims, HeadDims, QwenDims
from .graph import INT64_MAX, MS_DOMAIN, GraphWriter

F32 = np.float32


@dataclass(frozen=True)
class Weights:
    """The checkpoint's stored tensors under `prefix`, read one at a time as fp32, by their upstream names: where
    the checkpoint stores others (transformers' layout), `stored` maps each upstream name to the stored one."""

    files: object  # checkpoints.files.CheckpointFiles
    prefix: str = ""
    stored: dict | None = None

    def __call__(self, name: str) -> np.ndarray:
        return np.asarray(self.files.read(self._stored(self.prefix + name))).astype(F32)

    def _stored(self, name: str) -> str:
        return name if self.stored is None else self.stored[name]

    def under(self, prefix: str) -> "Weights":
        return Weights(self.files, self.prefix + prefix, self.stored)

    def nbytes(self, names=None) -> int:
        """fp32 bytes of the tensors under the prefix (or of `names`)."""
        upstream = self.files.tensors if self.stored is None else self.stored
        wanted = [self.prefix + n for n in names] if names is not None else \
            [n for n in upstream if n.startswith(self.prefix)]
        return sum(4 * math.prod(self.files.tensors[self._stored(n)].shape) for n in wanted)


# --- shared operators -------------------------------------------------------------------------------------------

def rms_norm(g: GraphWriter, x: str, weight: str, eps: float) -> str:
    """x / sqrt(mean(x²) + eps) · w: the form onnxruntime fuses into SimplifiedLayerNormalization."""
    mean = g.op("ReduceMean", g.op("Pow", x, g.const(2.0)), g.const([-1], np.int64), keepdims=1)
    return g.op("Mul", g.op("Div", x, g.op("Sqrt", g.op("Add", mean, g.const(eps)))), weight)


def linear(g: GraphWriter, x: str, w: Weights, name: str, bias: bool = True, where: tuple[int, str] | None = None) -> str:
    """A linear layer on activations of rank 3 or more: its stored weight transposed (quantized as the graph's
    scheme says), then its bias."""
    out = g.product(x, w(f"{name}.weight").T, f"{name}.weight.T", where)
    return g.op("Add", out, g.weight(f"{name}.bias", w(f"{name}.bias"))) if bias else out


def gemm(g: GraphWriter, x: str, w: Weights, name: str, bias: bool = False, stored: np.ndarray | None = None) -> str:
    """A linear layer on rows [N, in]: Gemm with the stored [out, in] weight (transB), as the exporter writes it;
    in a quantized graph the product and the bias, as the quantizers rewrite a Gemm (export.precision)."""
    weight = w(f"{name}.weight") if stored is None else stored
    if g.scheme is not None:
        out = g.product(x, weight.T, f"{name}.weight.T")
        return g.op("Add", out, g.weight(f"{name}.bias", w(f"{name}.bias"))) if bias else out
    inputs = [x, g.weight(f"{name}.weight", weight)] + ([g.weight(f"{name}.bias", w(f"{name}.bias"))] if bias else [])
    return g.op("Gemm", *inputs, alpha=1.0, beta=1.0, transA=0, transB=1)


def silu(g: GraphWriter, x: str) -> str:
    return g.op("Mul", x, g.op("Sigmoid", x))


def speech_host_tensors(files) -> dict[str, np.ndarray]:
    """What every TTS bundle's host reads itself: the token embedding in its stored dtype (the host looks its rows up
    one by one), the latent scale and bias in fp32 (export/realtime.py's and export/tts15b.py's)."""
    weights = Weights(files)
    return {"embed_tokens": files.read("model.language_model.embed_tokens.weight"),
            "speech_scaling_factor": weights("model.speech_scaling_factor"),
            "speech_bias_factor": weights("model.speech_bias_factor")}


def lm_weight_bytes(w: Weights) -> int:
    """fp32 bytes of an LM graph's weights: all under `w` but the token embedding, which stays on the host."""
    return w.nbytes() - w.nbytes(["embed_tokens.weight"])


def speech_connector(g: GraphWriter, w: Weights, width: int, hidden: int) -> None:
    """A connector as its own graph: latents [B, F, width] in, embeddings [B, F, hidden] out."""
    x = g.input("latents", F32, ["batch", "frames", width])
    g.output(connector(g, x, w), "embeddings", F32, ["batch", "frames", hidden])


def connector(g: GraphWriter, x: str, w: Weights) -> str:
    """A speech connector: fc2(RMSNorm(fc1(x))), the norm in transformers' rsqrt form as the export keeps it."""
    hidden = linear(g, x, w, "fc1")
    mean = g.op("ReduceMean", g.op("Pow", hidden, g.const(2.0)), g.const([-1], np.int64), keepdims=1)
    inverse = g.op("Reciprocal", g.op("Sqrt", g.op("Add", mean, g.const(1e-6))))
    normed = g.op("Mul", g.weight("norm.weight", w("norm.weight")), g.op("Mul", hidden, inverse))
    return linear(g, normed, w, "fc2")


# --- Qwen2 stacks --------------------------------------------------------------------------------------------------

LM_INPUTS = ["inputs_embeds", "position_ids", "seqlens_k", "total_sequence_length"]


def rotary_tables(q: QwenDims) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of every position's rotary angles, one half of each row (GroupQueryAttention's tables): the
    angles in fp32 as transformers computes them, their cos and sin rounded from float64 (torch's fp32 kernels
    may differ from that by an ulp)."""
    inverse = 1.0 / (q.rope_theta ** (np.arange(0, q.head_dim, 2, dtype=np.int64).astype(F32) / q.head_dim))
    angles = (np.arange(q.max_positions, dtype=F32)[:, None] * inverse.astype(F32)[None, :]).astype(np.float64)
    return np.cos(angles).astype(F32), np.sin(angles).astype(F32)


def qkv_weights(w: Weights, layer: str) -> tuple[np.ndarray, np.ndarray]:
    """A layer's query, key and value projections as one product: their weights stacked, transposed."""
    parts = [f"{layer}.self_attn.{p}_proj" for p in "qkv"]
    return (np.concatenate([w(f"{p}.weight") for p in parts]).T,
            np.concatenate([w(f"{p}.bias") for p in parts]))


# --- BitNet's ternary projections (reference/asr_bitnet.py's BitLinear) --------------------------------------------

BITNET_EPS, ACTIVATION_LEVELS = 1e-5, 127.0


def ternarize(weight: np.ndarray) -> tuple[np.ndarray, F32]:
    """(codes, s): the weight's codes {-1, 0, 1} and its one scale s = 1 / max(mean|W|, 1e-5), as BitLinear makes
    them at load (the mean accumulated in float64 and rounded once; round half to even, as torch.round)."""
    scale = F32(1.0) / max(F32(np.abs(weight, dtype=np.float64).mean()), F32(BITNET_EPS))
    return np.clip(np.round(weight * scale), -1, 1).astype(F32), scale


class Int8Activations:
    """x quantized per token as BitLinear quantizes it (a = 127 / max(max|x|, 1e-5), x_q = clip(round(x·a), -128,
    127)), once for every ternary product that reads x, and x_q headed by 127s once for their packed form."""

    def __init__(self, g: GraphWriter, x: str):
        peak = g.op("ReduceMax", g.op("Abs", x), g.const([-1], np.int64), keepdims=1)
        # 127 / m as torch computes a scalar over a tensor: its reciprocal times the scalar (two roundings)
        self.g, self.scale = g, g.op("Mul", g.op("Reciprocal", g.op("Max", peak, g.const(BITNET_EPS))),
                                     g.const(ACTIVATION_LEVELS))
        self.codes = g.op("Clip", g.op("Round", g.op("Mul", x, self.scale)), g.const(-128.0), g.const(127.0))
        self._headed = None

    def headed(self, width: int) -> str:
        from ..export.precision import headed_inputs

        if self._headed is None:
            nodes, constants = headed_inputs("x", "headed", width)
            names = {"x": self.codes, **{name: self.g.const(value, value.dtype) for name, value in constants}}
            self._headed = self.g._splice(nodes, names, "headed")
        return self._headed


def bit_linear(g: GraphWriter, x: Int8Activations, w: Weights, name: str, bias: bool) -> str:
    """BitLinear: (x_q · Wtᵀ) / (a · s) + bias, the ternary product packed as 2-bit MatMulNBits over x_q headed by
    127s (export.precision.pack_ternary's form: the same integers, exactly)."""
    from ..export.precision import headed_rows, ternary_matmul_nbits

    codes, scale = ternarize(w(f"{name}.weight"))
    attributes, tensors = ternary_matmul_nbits(headed_rows(codes.T), f"{name}.weight.T")
    inputs = [g.weight(t, array, fp32_bytes=codes.nbytes // len(tensors)) for t, array in tensors]
    g.quantized += 1
    product = g.op("MatMulNBits", x.headed(codes.shape[1]), *inputs, domain=MS_DOMAIN, **attributes)
    out = g.op("Div", product, g.op("Mul", x.scale, g.const(scale)))
    return g.op("Add", out, g.weight(f"{name}.bias", w(f"{name}.bias"))) if bias else out


def ternary_precision(g: GraphWriter) -> dict:
    """The manifest's record of an LM whose projections are ternary (export.precision.pack_ternary's)."""
    from ..export.precision import TERNARY, TERNARY_SCHEME

    return {**TERNARY.describe(), "scheme": TERNARY_SCHEME, "matmuls": g.quantized, "weight_bytes_before": g.fp32_bytes,
            "weight_bytes_after": g.weight_bytes}


def language_model(g: GraphWriter, w: Weights, q: QwenDims, final_norm: bool, ternary: bool = False) -> dict | None:
    """A Qwen2 stack over a fixed-capacity KV cache (export.graphs.LanguageModelGraph, the same inputs, outputs
    and operators): `w` holds layers.N.* and norm.weight of the checkpoint's LM. `ternary`: its seven projections
    BitNet's BitLinear (three for q, k and v), and the record of their packing returned."""
    batch, seq, capacity = "batch", "sequence", "capacity"
    x = g.input("inputs_embeds", F32, [batch, seq, q.hidden])
    g.input("position_ids", np.int64, [batch, seq])
    seqlens = g.input("seqlens_k", np.int32, [batch])
    total = g.input("total_sequence_length", np.int32, [])
    cos, sin = (g.weight(name, table) for name, table in zip(("cos_cache", "sin_cache"), rotary_tables(q)))
    kv = [(g.input(f"past_key_values.{i}.key", F32, [batch, q.kv_heads, capacity, q.head_dim]),
           g.input(f"past_key_values.{i}.value", F32, [batch, q.kv_heads, capacity, q.head_dim])) for i in range(q.layers)]
    presents, g.layers = [], q.layers
    for i in range(q.layers):
        layer = f"layers.{i}"
        normed = rms_norm(g, x, g.weight(f"{layer}.input_layernorm.weight", w(f"{layer}.input_layernorm.weight")), q.rms_eps)
        if ternary:
            quantized = Int8Activations(g, normed)
            query, key, value = (bit_linear(g, quantized, w, f"{layer}.self_attn.{p}_proj", bias=True) for p in "qkv")
        else:
            weight, bias = qkv_weights(w, layer)
            packed = g.op("Add", g.product(normed, weight, f"{layer}.qkv.weight.T", (i, "qkv")),
                          g.weight(f"{layer}.qkv.bias", bias))
            widths = g.const([q.heads * q.head_dim, q.kv_heads * q.head_dim, q.kv_heads * q.head_dim], np.int64)
            query, key, value = g.op("Split", packed, widths, outputs=3, axis=2)
        attended, present_key, present_value = g.op(
            "GroupQueryAttention", query, key, value, *kv[i], seqlens, total, cos, sin, outputs=3, domain=MS_DOMAIN,
            num_heads=q.heads, kv_num_heads=q.kv_heads, do_rotary=1, scale=float(q.head_dim ** -0.5))
        presents += [present_key, present_value]

        def project(value: str, name: str, where: str, shared: Int8Activations | None = None) -> str:
            if not ternary:
                return linear(g, value, w, f"{layer}.{name}", bias=False, where=(i, where))
            return bit_linear(g, shared or Int8Activations(g, value), w, f"{layer}.{name}", bias=False)

        x = g.op("Add", x, project(attended, "self_attn.o_proj", "o"))
        normed = rms_norm(g, x, g.weight(f"{layer}.post_attention_layernorm.weight",
                                         w(f"{layer}.post_attention_layernorm.weight")), q.rms_eps)
        shared = Int8Activations(g, normed) if ternary else None
        gate = silu(g, project(normed, "mlp.gate_proj", "gate", shared))
        up = project(normed, "mlp.up_proj", "up", shared)
        x = g.op("Add", x, project(g.op("Mul", gate, up), "mlp.down_proj", "down"))
    if final_norm:
        x = rms_norm(g, x, g.weight("norm.weight", w("norm.weight")), q.rms_eps)
    g.output(x, "hidden_states", F32, [batch, seq, q.hidden])
    for i in range(q.layers):
        for kind, value in zip(("key", "value"), presents[2 * i: 2 * i + 2]):
            g.output(value, f"present.{i}.{kind}", F32, [batch, q.kv_heads, capacity, q.head_dim])
    return {"precision": ternary_precision(g)} if ternary else None


# --- the diffusion head ----------------------------------------------------------------------------------------

def timestep_frequencies(size: int) -> np.ndarray:
    """The sinusoid's frequencies, exp(-ln(10000) · i / half): the exponent in fp32 as transformers computes it,
    the exp rounded from float64."""
    half = size // 2
    exponent = F32(-math.log(10000)) * np.arange(half, dtype=F32) / F32(half)
    return np.exp(exponent.astype(np.float64)).astype(F32)[None]


def head_conditioning(g: GraphWriter, w: Weights, h: HeadDims) -> None:
    """Every adaLN layer's modulation from the timestep and condition (export.graphs.HeadConditioningGraph): their
    projections stacked into one product. `w` holds the checkpoint's prediction_head.*."""
    timesteps = g.input("timesteps", F32, ["batch"])
    condition = g.input("condition", F32, ["batch", h.hidden])
    frequency_size = w.files.tensors[w.prefix + "t_embedder.mlp.0.weight"].shape[1]
    angles = g.op("Mul", g.op("Unsqueeze", timesteps, g.const([1], np.int64)),
                  g.weight("timestep_frequencies", timestep_frequencies(frequency_size)))
    embedded = g.op("Concat", g.op("Cos", angles), g.op("Sin", angles), axis=-1)
    embedded = gemm(g, silu(g, gemm(g, embedded, w, "t_embedder.mlp.0")), w, "t_embedder.mlp.2")
    condition = g.op("Add", gemm(g, condition, w, "cond_proj"), embedded)
    stacked = np.concatenate([w(f"layers.{i}.adaLN_modulation.1.weight") for i in range(h.layers)]
                             + [w("final_layer.adaLN_modulation.1.weight")])
    modulation = gemm(g, silu(g, condition), w, "modulation", stored=stacked)
    g.output(modulation, "modulation", F32, ["batch", (3 * h.layers + 2) * h.hidden])


def _modulated(g: GraphWriter, x: str, weight: str, shift: str, scale: str, eps: float) -> str:
    return g.op("Add", g.op("Mul", rms_norm(g, x, weight, eps), g.op("Add", scale, g.const(1.0))), shift)


def head_step(g: GraphWriter, w: Weights, h: HeadDims) -> None:
    """One sampler step of the head on the noisy latents with their rows' modulation
    (export.graphs.HeadStepGraph)."""
    noisy = g.input("noisy_latents", F32, ["batch", h.latent])
    modulation = g.input("modulation", F32, ["batch", (3 * h.layers + 2) * h.hidden])
    hidden = gemm(g, noisy, w, "noisy_images_proj")
    parts = g.op("Split", modulation, g.const([3 * h.hidden] * h.layers + [2 * h.hidden], np.int64),
                 outputs=h.layers + 1, axis=1)
    for i in range(h.layers):
        shift, scale, gate = g.op("Split", parts[i], outputs=3, axis=1, num_outputs=3)
        norm = g.weight(f"layers.{i}.norm.weight", w(f"layers.{i}.norm.weight"))
        x = _modulated(g, hidden, norm, shift, scale, h.eps)
        ffn = w.under(f"layers.{i}.ffn.")
        product = g.op("Mul", silu(g, gemm(g, x, ffn, "gate_proj")), gemm(g, x, ffn, "up_proj"))
        hidden = g.op("Add", hidden, g.op("Mul", gate, gemm(g, product, ffn, "down_proj")))
    shift, scale = g.op("Split", parts[-1], outputs=2, axis=1, num_outputs=2)
    x = _modulated(g, hidden, g.weight("final_norm.weight", np.ones(h.hidden, F32)), shift, scale, h.eps)
    g.output(gemm(g, x, w, "final_layer.linear"), "velocity", F32, ["batch", h.latent])


# --- σ-VAE conv stacks, streamed ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ConvStateSpec:
    """A causal conv's streaming state: the past input samples it keeps (channels-first [1, C, kept])."""

    key: str
    channels: int
    kept: int


class ConvStack:
    """A σ-VAE conv stack written as one graph, channels-last between its convs (export.graphs'
    ChannelsLastStage), in the order and under the cache keys of transformers' modules. `streamed`:
    every causal conv reads [its state, the new input] and hands on the last samples as its new state; with
    `pad_to_stride`, a strided conv's input is also zero-padded on the right to whole strides (ConvState's, for a
    chunk of any length). Whole-sequence (not streamed): upstream's non-streaming padding (UpstreamPadding), zeros
    on the left and, for a strided conv, on the right to whole strides, over a batch."""

    def __init__(self, g: GraphWriter, w: Weights, eps: float, streamed: bool = True, pad_to_stride: bool = False):
        self.g, self.w, self.eps = g, w, eps
        self.streamed, self.pad_to_stride = streamed, pad_to_stride
        self.states: list[ConvStateSpec] = []
        self._new: dict[str, str] = {}

    def _state(self, key: str, channels: int, kept: int) -> str:
        self.states.append(ConvStateSpec(key, channels, kept))
        return self.g.input(f"state.{key}", F32, [1, channels, kept])

    def _to_whole_strides(self, x: str, new: str, stride: int, left: int = 0) -> str:
        """x zero-padded by `left` samples in front and, behind, by what brings `new`'s length to whole strides."""
        g = self.g
        length = g.op("Slice", g.op("Shape", new), g.const([2], np.int64), g.const([3], np.int64))
        right = g.op("Mod", g.op("Neg", length), g.const([stride], np.int64), fmod=0)
        pads = g.op("Concat", g.const([0, 0, left, 0, 0], np.int64), right, axis=0)
        return g.op("Pad", x, pads, mode="constant")

    def causal_conv(self, x: str, name: str, key: str, weight: np.ndarray, stride: int = 1, groups: int = 1) -> str:
        """A causal conv on channels-first input: what it keeps of the past (a state, or zeros) in front of x."""
        g = self.g
        kept, pads = weight.shape[-1] - stride, [0, 0]
        if self.streamed:
            full = g.op("Concat", self._state(key, weight.shape[1] * groups, kept), x, axis=-1)
            self._new[key] = g.op("Slice", full, g.const([-kept], np.int64), g.const([INT64_MAX], np.int64),
                                  g.const([2], np.int64))
            if self.pad_to_stride and stride > 1:
                full = self._to_whole_strides(full, x, stride)
        elif stride > 1:
            full = self._to_whole_strides(x, x, stride, left=kept)
        else:
            full, pads = x, [kept, 0]
        return g.op("Conv", full, g.weight(f"{name}.weight", weight), g.weight(f"{name}.bias", self.w(f"{name}.bias")),
                    group=groups, kernel_shape=[weight.shape[-1]], pads=pads, strides=[stride], dilations=[1])

    def block(self, x: str, name: str, key: str, channels: int) -> str:
        """One ConvNeXt block on channels-last frames: the depthwise mixer, then the FFN, each scaled and added."""
        g, w = self.g, self.w.under(name + ".")
        normed = rms_norm(g, x, g.weight(f"{name}.norm.weight", w("norm.weight")), self.eps)
        mixed = self.causal_conv(g.op("Transpose", normed, perm=[0, 2, 1]), f"{name}.mixer.conv.conv.conv",
                                 key, self.w(f"{name}.mixer.conv.conv.conv.weight"), groups=channels)
        x = g.op("Add", x, g.op("Mul", g.op("Transpose", mixed, perm=[0, 2, 1]), g.weight(f"{name}.gamma", w("gamma"))))
        normed = rms_norm(g, x, g.weight(f"{name}.ffn_norm.weight", w("ffn_norm.weight")), self.eps)
        hidden = g.op("Gelu", linear(g, normed, w, "ffn.linear1"), domain=MS_DOMAIN)
        scaled = g.op("Mul", linear(g, hidden, w, "ffn.linear2"), g.weight(f"{name}.ffn_gamma", w("ffn_gamma")))
        return g.op("Add", x, scaled)

    def upsample(self, x: str, name: str, key: str) -> str:
        """A causal transposed conv (kernel 2·stride) on channels-last frames as two MatMuls (export.graphs'
        ChannelsLastUpsampler): each frame times the kernel's first half, plus the previous frame times the
        second half; its state is the previous frame."""
        g = self.g
        weight = self.w(f"{name}.weight")
        channels_in, channels_out, kernel = weight.shape
        stride = kernel // 2
        current, previous = weight.reshape(channels_in, channels_out, 2, stride).transpose(2, 0, 3, 1).reshape(
            2, channels_in, stride * channels_out)
        state = g.op("Transpose", self._state(key, channels_in, 1), perm=[0, 2, 1])
        full = g.op("Concat", state, x, axis=1)
        one, end, time = g.const([1], np.int64), g.const([INT64_MAX], np.int64), g.const([1], np.int64)
        self._new[key] = g.op("Transpose", g.op("Slice", full, g.const([-1], np.int64), end, time), perm=[0, 2, 1])
        samples = g.op("Add", g.product(g.op("Slice", full, one, end, time), current, f"{name}.current"),
                       g.product(g.op("Slice", full, g.const([0], np.int64), g.const([-1], np.int64), time), previous,
                                 f"{name}.previous"))
        frames = g.op("Reshape", samples, g.const([1, -1, channels_out], np.int64), allowzero=1)
        return g.op("Add", frames, g.weight(f"{name}.bias", self.w(f"{name}.bias")))

    def stage(self, x: str, index: int, depth: int, first_block: int, channels: int) -> str:
        for j in range(depth):
            x = self.block(x, f"stages.{index}.{j}", f"convnext_layer_{first_block + j}", channels)
        return x

    def write_states(self) -> None:
        for spec in self.states:
            self.g.output(self._new[spec.key], f"new_state.{spec.key}", F32, [1, spec.channels, spec.kept])

    def manifest_extra(self) -> dict:
        return {"states": [{"name": s.key, "channels": s.channels, "length": s.kept} for s in self.states]}


def conv_stack(stack: ConvStack, x: str, d: ConvStackDims, side: str) -> str:
    """transformers' encoder or decoder (`side`) on channels-first input: its stem conv and stage, then each
    layer (a strided conv or an upsampler) with its stage, then its head conv; channels-first out."""
    g, w = stack.g, stack.w
    transpose = lambda y: g.op("Transpose", y, perm=[0, 2, 1])  # noqa: E731
    layers, channels = ("upsample_layers", d.decoder_channels()) if side == "decoder" else \
        ("downsample_layers", d.encoder_channels())
    x = stack.causal_conv(x, f"{layers}.0.0.conv.conv", f"{side}_stem", w(f"{layers}.0.0.conv.conv.weight"))
    x = stack.stage(transpose(x), 0, d.depths[0], 1, channels[0])
    first_block = d.depths[0] + 1
    for i in range(1, len(d.depths)):
        if side == "decoder":
            x = stack.upsample(x, f"{layers}.{i}.0.convtr.convtr", f"decoder_layer_{i - 1}")
        else:
            name = f"{layers}.{i}.0.conv.conv"
            x = transpose(stack.causal_conv(transpose(x), name, f"encoder_layer_{i - 1}", w(f"{name}.weight"),
                                            stride=d.ratios[i - 1]))
        x = stack.stage(x, i, d.depths[i], first_block + 1, channels[i])
        first_block += d.depths[i] + 1
    return stack.causal_conv(transpose(x), "head.conv.conv", f"{side}_head", w("head.conv.conv.weight"))


def decoder_stream(g: GraphWriter, w: Weights, d: ConvStackDims) -> dict:
    """The acoustic decoder as one streaming graph: latents [1, F, vae] and every conv's state in, audio
    [1, 1, F·hop] and the new states out (export.graphs.decoder_specs). `w` holds the checkpoint's decoder.*
    (upstream names); returns the manifest's state list."""
    stack = ConvStack(g, w, d.eps)
    latents = g.input("latents", F32, [1, "frames", d.vae_dim])
    audio = conv_stack(stack, g.op("Transpose", latents, perm=[0, 2, 1]), d, "decoder")
    g.output(audio, "audio", F32, [1, 1, f"{d.hop}*frames"])
    stack.write_states()
    return stack.manifest_extra()


def encoder_stream(g: GraphWriter, w: Weights, d: ConvStackDims, any_length: bool = False) -> dict:
    """An encoder fed audio [1, 1, samples] with every conv's state in, latents [1, F, vae] and the new states out
    (export.graphs.streaming_encoder_spec): whole frames, or with `any_length` a chunk of any length padded to
    whole strides as upstream pads a recording's last segment. Returns the manifest's state list."""
    stack = ConvStack(g, w, d.eps, pad_to_stride=any_length)
    audio = g.input("audio", F32, [1, 1, "samples" if any_length else f"{d.hop}*frames"])
    latents = g.op("Transpose", conv_stack(stack, audio, d, "encoder"), perm=[0, 2, 1])
    g.output(latents, "latents", F32, [1, "latent_frames" if any_length else "frames", d.vae_dim])
    stack.write_states()
    return stack.manifest_extra()


def encoder(g: GraphWriter, w: Weights, d: ConvStackDims) -> None:
    """An encoder over a batch of audio of any length in one pass with upstream's padding (export.graphs'
    EncoderGraph): audio [B, 1, N] -> latents [B, ceil(N / hop), vae]."""
    audio = g.input("audio", F32, ["batch", 1, "samples"])
    latents = conv_stack(ConvStack(g, w, d.eps, streamed=False), audio, d, "encoder")
    g.output(g.op("Transpose", latents, perm=[0, 2, 1]), "latents", F32, ["batch", "latent_frames", d.vae_dim])
