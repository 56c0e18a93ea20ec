"""Precision variants of exported graphs: int8 and int4 with onnxruntime's own quantizers, per a per-component
policy, and fp16 with onnxruntime's own converter (for GPU providers).

Every MatMul (and Gemm) whose weight is a constant is quantized by one of two schemes (see `Scheme`):
dynamic int8 (8-bit weights per output channel, activations quantized per call) or MatMulNBits (blockwise
8 or 4 bits). Which graph gets which scheme is a policy per model kind, chosen by measurement and recorded in
the manifest: the small graphs on the feedback path (connector, EOS classifier) stay fp32, because a
component that passes its own gate can still ruin generation once its error feeds back (the closed loop
judges that). The same functions serve any model kind: quantization lives here only.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import VibeVoiceError
from ..families import family, load


@dataclass(frozen=True)
class Scheme:
    """How one graph's MatMul weights are stored. "blockwise": onnxruntime's MatMulNBits (one scale and zero
    point per block of `block_size` input rows of each output column), activations float or, at accuracy
    level 4, int8 inside the dot products. "dynamic": onnxruntime's dynamic quantization, 8-bit weights per
    output channel (int8 in 7 bits: see DECODER_INT8) and activations quantized per call, run by its int8
    GEMM kernels."""

    bits: int
    method: str = "blockwise"
    block_size: int = 32
    symmetric: bool = False
    accuracy_level: int = 4

    @property
    def name(self) -> str:
        return f"int{self.bits}" + (" dynamic" if self.method == "dynamic" else "")

    def describe(self) -> dict:
        if self.method == "dynamic":
            return {"scheme": "dynamic int8 (MatMulInteger), int8 weights in 7 bits per output channel", "bits": 8,
                    "method": "dynamic"}
        return {"scheme": f"MatMulNBits int{self.bits}", **asdict(self)}


PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")  # a Qwen2 layer's weight MatMuls, in graph order
# ... where the graph computes the query, key and value projections as one product (export.graphs.LanguageModelGraph)
PACKED_PROJECTIONS = ("qkv", "o", "gate", "up", "down")


@dataclass(frozen=True)
class LayerRule:
    """Which MatMuls of an LM graph a scheme takes: projections of the first or last `count` decoder layers,
    or of every layer (`where` "all")."""

    scheme: Scheme
    where: str = "all"  # "all", "first" or "last"
    count: int = 0
    projections: tuple[str, ...] = PROJECTIONS

    def matches(self, layer: int, layers: int, projection: str) -> bool:
        inside = {"all": True, "first": layer < self.count, "last": layer >= layers - self.count}[self.where]
        return inside and projection in self.projections

    def describe(self) -> dict:
        return {"scheme": self.scheme.describe(), "layers": self.where if self.where == "all" else f"{self.where} {self.count}",
                "projections": list(self.projections)}


@dataclass(frozen=True)
class Mixed:
    """Several blockwise schemes in one LM graph: each weight MatMul takes the first rule that matches its
    layer and projection, else `base`. Where 4 bits cost too much accuracy (measured in the teacher-forced
    loop), the layers or projections that matter keep 8."""

    base: Scheme
    rules: tuple[LayerRule, ...]
    method: str = "mixed"

    @property
    def name(self) -> str:
        return f"{self.base.name} mixed"

    def describe(self) -> dict:
        return {"scheme": f"mixed: MatMulNBits int{self.base.bits} except where a rule says otherwise", "bits": self.base.bits,
                "method": "mixed", "base": self.base.describe(), "rules": [r.describe() for r in self.rules]}

    def pick(self, layer: int, layers: int, projection: str) -> Scheme:
        if projection == "qkv":  # one product: the rules must give q, k and v one scheme
            picked = {self.pick(layer, layers, part) for part in "qkv"}
            if len(picked) > 1:
                raise VibeVoiceError(f"layer {layer}: the rules give q, k and v different bits, but the graph computes "
                                     "them in one product; give them one rule")
            return picked.pop()
        return next((r.scheme for r in self.rules if r.matches(layer, layers, projection)), self.base)

    def assign(self, layers: int, arrangement: tuple[str, ...] = PROJECTIONS) -> list[Scheme]:
        """The scheme of each weight MatMul, in graph order, for an LM of `layers` decoder layers whose weight
        MatMuls are `arrangement` per layer."""
        return [self.pick(layer, layers, projection) for layer in range(layers) for projection in arrangement]

    def of_weight(self, name: str, layers: int) -> Scheme:
        """The scheme of a Qwen2 weight named by its parameter name (a streamed export quantizes by name)."""
        match = _QWEN_WEIGHT.search(name)
        if not match:
            raise VibeVoiceError(f"{name}: a mixed scheme applies to a Qwen2 layer's projection weights only")
        return self.pick(int(match[1]), layers, match[2])


_QWEN_WEIGHT = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(q|k|v|o|gate|up|down)_proj\.weight$")


def layer_count(names) -> int:
    """Decoder layers of an LM, from its weights' parameter names."""
    return 1 + max((int(m[1]) for m in map(_QWEN_WEIGHT.search, names) if m), default=-1)


def lm_weight_matmuls(model: onnx.ModelProto) -> tuple[list[onnx.NodeProto], tuple[str, ...]]:
    """An exported Qwen2 stack's weight MatMuls in graph order and their arrangement per layer, checked to be
    q, k, v, o, gate, up, down (q, k and v read one input; gate and up another) or, with q, k and v packed into
    one product, qkv, o, gate, up, down, so a rule can name a layer's projection."""
    constants = {t.name for t in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in constants]
    for arrangement in (PROJECTIONS, PACKED_PROJECTIONS):
        per, gate = len(arrangement), arrangement.index("gate")
        layers = [nodes[i : i + per] for i in range(0, len(nodes), per)]
        shared = arrangement.index("o")  # the projections before o read the layer's normed input
        if nodes and not len(nodes) % per and all(
                len({n.input[0] for n in layer[:shared]}) == 1 and layer[gate].input[0] == layer[gate + 1].input[0]
                and layer[shared].input[0] != layer[0].input[0] for layer in layers):
            return nodes, arrangement
    raise VibeVoiceError(f"a mixed scheme needs a Qwen2 stack's weight MatMuls per layer in order ({', '.join(PROJECTIONS)}, "
                         f"or {', '.join(PACKED_PROJECTIONS)}); this graph has {len(nodes)} weight MatMuls in another arrangement")


# On a 2-core AVX2 CPU without VNNI (this project's reference machine), for a [2, 896] x [896, 4864] product:
# fp32 1.23 ms, MatMulNBits int8 0.95 ms, int4 0.65 ms, dynamic int8 per channel 0.60 ms (cosine 0.99994).
INT8, INT4, DYNAMIC_INT8 = Scheme(8), Scheme(4), Scheme(8, method="dynamic")
# int8 in blocks of 128 rather than 32: at 8 bits the block hardly matters for accuracy (cosine 0.99996 vs
# 0.99997 on one product), but every block carries a scale and, once onnxruntime prepacks it, a block sum.
# On the full-size realtime bundle: 47 MB fewer bytes read per frame and ~100 MB less peak memory, gates
# still passing (LM graphs >= 0.99955, closed-loop first window 0.990). ASR keeps blocks of 32, which its
# full-size gates were measured with.
INT8_WIDE = Scheme(8, block_size=128)

# Per precision: graph -> scheme (each kind's record in families.py names its policy); a graph not listed stays
# fp32. Chosen by measurement on the full-size synthetic realtime checkpoint: dynamic int8 is the fastest scheme
# here, but its per-tensor activation scales cost the graphs on the feedback path (LMs, diffusion head) enough
# accuracy to fail the closed loop (first-window cosine 0.89); blockwise int8 there passes (0.98). The decoder is off the feedback
# path (its output is only heard), so it takes the fast scheme.
HEAD_INT8 = {"diffusion_head_conditioning": INT8_WIDE, "diffusion_head_step": INT8_WIDE}
# Its weights are signed (onnxruntime's u8s8 GEMM kernels; its u8u8 ones widen to 16 bits first): the full-size
# realtime decoder, 3 frames a call on 2 cores of an AMD EPYC with AVX-512 VNNI, 23.0-23.8 ms a frame against
# 27.3-31.4 with uint8 weights. In 7 bits (reduce_range), because without VNNI the u8s8 kernels add pairs of
# products in 16 bits, which 8-bit weights can saturate and 7-bit ones cannot (graph against fp32: 0.99858,
# uint8 weights 0.99917).
DECODER_INT8 = {"acoustic_decoder_stream": DYNAMIC_INT8}
#
# int4-mixed: 4 bits only where the teacher-forced and first-window gates showed them harmless. Measured one
# component at a time on the full-size synthetic checkpoint (verify's gates, the rest of the bundle int8; the
# Precisions section of docs/models.md has the table): on the feedback path every 4-bit graph tried left the
# reference's trajectory within the first window (min cosine against 0.85): upper LM in all 20 layers 0.69,
# blocks of 16 0.67, v and down kept 8-bit 0.75, first and last 2 layers kept 8-bit 0.72, only the middle 6
# layers 0.78; lower LM 0.845 (blocks of 32) and 0.73 (16); the diffusion head 0.64. One step of it is
# already 0.96-0.98 in the teacher-forced conditions, where int8's is 0.9995. The decoder is off the feedback
# path (only heard): in blocks of 32 its graph and forced audio gave 0.978 and 0.980 against 0.98, in blocks
# of 16 0.984 and 0.985 (273 MB against 348 MB in dynamic int8; on these CPUs 1.6x slower than dynamic int8).
DECODER_INT4 = {"acoustic_decoder_stream": Scheme(4, block_size=16)}
ENCODERS_INT8 = {"semantic_encoder_stream": INT8_WIDE, "acoustic_encoder": INT8_WIDE}
REALTIME_POLICY = {
    "int8": {"lower_lm": INT8_WIDE, "upper_lm": INT8_WIDE, **HEAD_INT8, **DECODER_INT8},
    "int4": {"lower_lm": INT4, "upper_lm": INT4, **HEAD_INT8, **DECODER_INT8},
    "int4-mixed": {"lower_lm": INT8_WIDE, "upper_lm": INT8_WIDE, **HEAD_INT8, **DECODER_INT4},
    # onnxruntime-web's WASM has no fast 8-bit MatMulNBits (full-size upper LM, 5 tokens, 2 threads of an AMD EPYC
    # in Chromium: 496 ms at int8 against 79 at fp32; the head 45 against 4.4 ms a step), but its dynamic int8
    # decoder is as fast as fp32's (113 against 119 ms a frame) at a quarter of the bytes to download and hold.
    "int8-decoder": DECODER_INT8,
}
# VibeVoice-1.5B: every latent reads the LM (both CFG streams in one call), the head, the decoder and the
# semantic encoder, whose features of the decoded audio feed back into the LM: the decoder is on the
# feedback path here, so it takes blockwise int8, not realtime's dynamic int8 (per-tensor activation
# scales). Measured one graph at a time on the tiny checkpoint saved by Microsoft's code (the rest fp32,
# verify's teacher-forced conditions / sampled latents against 0.995 / 0.97): the dynamic int8 decoder alone
# 0.9915 / 0.982, the whole of int8's loss (LM alone 0.99956 / 0.9988, every other graph >= 0.99995);
# blockwise int8 in blocks of 128 0.9978 / 0.988. The acoustic encoder runs once per voice, into the
# prompt. The connectors (small, on the feedback path) stay fp32 as realtime's do. VibeVoice-Large: the 1.5B's
# components at 7B widths, the same feedback path; its LM is quantized as it streams.
LONG_FORM_POLICY = {
    "int8": {"lm": INT8_WIDE, **HEAD_INT8, "acoustic_decoder_stream": INT8_WIDE, **ENCODERS_INT8},
    "int4": {"lm": INT4, **HEAD_INT8, "acoustic_decoder_stream": INT8_WIDE, **ENCODERS_INT8},
}
# ASR: the LM and its head hold nearly all the weights (7B); encoders and connectors stay fp32. int4-mixed
# keeps the head and the LM's first and last 7 of 28 layers at 8 bits, measured on the full-size synthetic
# checkpoint (verify's teacher-forced logits against 0.98): int4 everywhere 0.91 (LM graph 0.980); head and
# first and last 2 layers at 8 bits 0.955 (LM 0.988); first and last 7 at 8 bits 0.982 (LM 0.994): passes. Both layouts (asr, asr-hf).
ASR_POLICY = {"int8": {"lm": INT8, "lm_head": INT8}, "int4": {"lm": INT4, "lm_head": INT4},
              "int4-mixed": {"lm": Mixed(INT4, (LayerRule(INT8, "first", 7), LayerRule(INT8, "last", 7))), "lm_head": INT8}}
# ASR-Streaming encodes every 3.47 s window anew (both encoders, cold), then decodes ~10-20 tokens: on 2 cores of
# an AMD EPYC (AVX-512 VNNI) the full-size 1.5B int8 bundle with fp32 encoders and ASR's blocks of 32 took 4.2 s
# a 2.93 s chunk (encoders 2.6 s, 17 LM steps at 79 ms, the head 11 ms a pick). Blocks of 128 and 8-bit encoders
# (their MatMuls; one window's latents against fp32: cosine 0.99988 and 0.99989): encoders 1.9 s, LM 64 ms a step,
# head 8.4 ms. Streamed 4-bit LM as ASR's, with the same layer rules for int4-mixed.
_STREAMING_8BIT = {"lm_head": INT8_WIDE, "acoustic_encoder_stream": INT8_WIDE, "semantic_encoder_stream": INT8_WIDE}
STREAMING_ASR_POLICY = {"int8": {"lm": INT8_WIDE, **_STREAMING_8BIT}, "int4": {"lm": INT4, **_STREAMING_8BIT},
                        "int4-mixed": {"lm": ASR_POLICY["int4-mixed"]["lm"], **_STREAMING_8BIT}}
# ASR-BitNet: its LM's ternary products are exact at every precision (packed as it is exported, export.asr_bitnet);
# int8 takes what else a transcription reads: the tied head (933 MB a token in fp32 at full size: 29 ms of a 110 ms
# token) in blocks of 128, and both encoders in dynamic int8, their FFN products over many frames compute-bound,
# where onnxruntime's int8 GEMM beats MatMulNBits: one full-size acoustic encoder, 12 s of audio in pieces of 10
# frames, 2 cores of an Intel Xeon (AVX-512 VNNI, AMX): fp32 2.11 s, MatMulNBits int8 2.36 s, dynamic int8 1.26 s;
# one piece's latents against fp32, cosine 0.99992 and 0.99971 (scratch timing; verify gates the bundle).
BITNET_POLICY = {"int8": {"lm_head": INT8_WIDE, "acoustic_encoder_stream": DYNAMIC_INT8,
                          "semantic_encoder_stream": DYNAMIC_INT8}}
# The fixed-shape realtime profile: its graphs, the same schemes as the default profile's for the same weights.
REALTIME_FIXED_POLICY = {"int8": {"lower_lm_text": INT8_WIDE, "upper_lm_text": INT8_WIDE, "upper_lm_step": INT8_WIDE,
                                  "diffusion_head": INT8_WIDE, "acoustic_decoder_tile": DYNAMIC_INT8}}


def policy(kind: str, precision: str, profile=None) -> dict[str, Scheme]:
    """The schemes of a kind's bundle at `precision`: its family's policy, or its build profile's (which names
    one as `policy`, e.g. export.fixed.FixedProfile)."""
    if precision in ("fp32", "fp16"):
        return {}
    named = family(kind).policy if profile is None else profile.policy
    schemes = load(named).get(precision) if named else None
    if schemes is None:
        label = kind if profile is None else f"{kind}-{profile.name}"
        raise VibeVoiceError(f"no {precision} policy for {label} bundles yet")
    return schemes


def _gemm_to_matmul(model: onnx.ModelProto) -> int:
    """Rewrite Gemm(A, W, C) with a constant W as MatMul(A, W') + C, which the quantizer understands."""
    initializers = {t.name: t for t in model.graph.initializer}
    nodes, rewritten = [], 0
    for node in model.graph.node:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        simple = attributes.get("alpha", 1.0) == 1.0 and attributes.get("beta", 1.0) == 1.0 and not attributes.get("transA", 0)
        if node.op_type != "Gemm" or node.input[1] not in initializers or not simple:
            nodes.append(node)
            continue
        weight = initializers[node.input[1]]
        if attributes.get("transB", 0):
            transposed = numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(weight).T), weight.name)
            weight.CopyFrom(transposed)
        product = node.output[0] + "_matmul" if len(node.input) > 2 else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], node.input[1]], [product], name=node.name + "_matmul"))
        if len(node.input) > 2:
            nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=node.name + "_bias"))
        rewritten += 1
    model.graph.ClearField("node")
    model.graph.node.extend(nodes)
    if rewritten:
        model.graph.ClearField("value_info")  # shapes recorded for the old nodes; inference redoes them
    return rewritten


def _nbits_quantizer():
    """onnxruntime's MatMulNBits quantizer module, imported without the root-logger setup it does on import
    (which would print every later INFO line of every library)."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    from onnxruntime.quantization import matmul_nbits_quantizer

    root.setLevel(level)
    root.handlers[:] = handlers
    return matmul_nbits_quantizer


def weight_bytes(model: onnx.ModelProto) -> int:
    return sum(int(np.prod(t.dims)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize for t in model.graph.initializer)


def quantize_graph(path: Path, scheme: Scheme | Mixed, external_data: bool) -> dict:
    """Quantize the graph at `path` in place; returns what was done, for the manifest."""
    path = Path(path)
    model = onnx.load(str(path))  # with its external data
    before = weight_bytes(model)
    _gemm_to_matmul(model)
    if scheme.method == "dynamic":
        quantized = _dynamic(model, path, external_data)
        count = sum(1 for n in quantized.graph.node if n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul"))
    else:
        if scheme.method == "mixed":
            nodes, arrangement = lm_weight_matmuls(model)
            assigned = scheme.assign(len(nodes) // len(arrangement), arrangement)
            passes = [(s, {n.name for n, a in zip(nodes, assigned) if a != s}) for s in dict.fromkeys(assigned)]
        else:
            passes = [(scheme, set())]
        for part, excluded in passes:  # each pass leaves the others' nodes (and those already quantized) alone
            model = _blockwise(model, part, excluded)
        quantized = model
        count = sum(1 for n in quantized.graph.node if n.op_type == "MatMulNBits")
        _save(quantized, path, external_data)
    return {**scheme.describe(), "matmuls": count, "weight_bytes_before": before, "weight_bytes_after": weight_bytes(quantized)}


def _blockwise(model: onnx.ModelProto, scheme: Scheme, excluded: set[str]) -> onnx.ModelProto:
    quantizer = _nbits_quantizer().MatMulNBitsQuantizer(model, bits=scheme.bits, block_size=scheme.block_size,
                                                        is_symmetric=scheme.symmetric, accuracy_level=scheme.accuracy_level,
                                                        nodes_to_exclude=sorted(excluded))
    with _quiet(logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")):  # a line per node
        quantizer.process()
    return quantizer.model.model


def quantize_weight(weight: np.ndarray, name: str, scheme: Scheme) -> tuple[dict, list[tuple[str, np.ndarray]]]:
    """One MatMul weight [K, N] packed by onnxruntime's own MatMulNBits quantizer, on its own: the node's
    attributes and its named tensors (packed weight, scales, zero points as `quantize_graph` names them),
    for an export that streams weights one at a time. The same packing as `quantize_graph` (tested)."""
    if scheme.method != "blockwise":
        raise VibeVoiceError(f"{scheme.name} cannot be applied one weight at a time (blockwise schemes only)")
    nbits = _nbits_quantizer()
    config = nbits.DefaultWeightOnlyQuantConfig(block_size=scheme.block_size, is_symmetric=scheme.symmetric,
                                                accuracy_level=scheme.accuracy_level, bits=scheme.bits)
    packed, scales, zero_points = nbits.DefaultWeightOnlyQuantizer(config).qbits_block_quant(weight)
    rows, cols = weight.shape
    attributes = {"K": rows, "N": cols, "bits": scheme.bits, "block_size": scheme.block_size,
                  "accuracy_level": scheme.accuracy_level}
    tensors = [(f"{name}_Q{scheme.bits}", packed), (f"{name}_scales", scales)]
    if not scheme.symmetric:
        tensors.append((f"{name}_zero_points", zero_points))
    return attributes, tensors


def dynamic_weight(weight: np.ndarray, name: str) -> tuple[list[onnx.NodeProto], list[tuple[str, np.ndarray]]]:
    """One MatMul weight [K, N] quantized by onnxruntime's own dynamic quantizer (quantize_dynamic, as `_dynamic`
    calls it), on its own: the nodes it writes for the product of an input "x" with it, giving "y" (the input
    quantized per call, MatMulInteger, the scales applied), and its named tensors (int8 weight in 7 bits per
    output channel, scales, zero points), for a builder that writes graphs one weight at a time. The quantizer
    treats each weight alone, so the same values `quantize_graph` gives (tested)."""
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = helper.make_graph([helper.make_node("MatMul", ["x", name], ["y"])], "product",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.ascontiguousarray(weight, np.float32), name)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with tempfile.TemporaryDirectory() as folder, _quiet(logging.getLogger()):
        target = Path(folder) / "product.onnx"
        quantize_dynamic(model, target, op_types_to_quantize=["MatMul"], per_channel=True, weight_type=QuantType.QInt8,
                         reduce_range=True, extra_options={"MatMulConstBOnly": True})
        quantized = onnx.load(str(target))
    return list(quantized.graph.node), [(t.name, numpy_helper.to_array(t)) for t in quantized.graph.initializer]


# Ternary weights (ASR-BitNet's projections) packed exactly: MatMulNBits with 2-bit codes w + 2, onnxruntime's
# default zero point 2 and scale 1.0 in every block, so its dequantized weight is exactly -1, 0 or 1, computed by
# onnxruntime's int8 kernels (accuracy level 4), which quantize the inputs block by block with the block's largest
# |x| / 127 as the scale. The inputs are a BitLinear's x_q, integers of magnitude at most 127 (x · 127 / max|x|,
# rounded), so a block whose largest is 127 quantizes to itself; every block is made so: a 127 at its head, over a
# weight row of zeros, and 127 real inputs after it (the last block padded with zeros). The int8 products and their
# int32 sums are then the exact integers the float32 MatMul computes (below 2**24: 127 · 8960); without the heads,
# level 4 is off by up to 64 (down_proj's shape). The full-size LM's step, one row at 300 positions, 2 cores: 82.7 ms
# with 4-bit codes in float32 arithmetic (accuracy level 1, exact too; the bundles until 2026-12-06), 44.5 ms with
# 4-bit codes in int8, 36.2 ms with 2-bit ones (774 -> 426 MB read a token; the outputs identical), Microsoft's I2_S
# kernels 25.4 ms. onnxruntime's int8 path for 2-bit codes arrived in 1.28 (before it, 53-98 ms a product of
# 1,536 x 8,960 against 0.29: benchmarks/ternary_products.py), hence the runtime's requirement.
TERNARY = Scheme(bits=2, method="ternary", block_size=128, symmetric=False, accuracy_level=4)
TERNARY_SCHEME = "ternary: MatMulNBits 2-bit codes, scale 1, int8 arithmetic over inputs headed by 127s, exact"
INPUT_HEAD = 127.0  # heads each block of inputs; the block's other TERNARY.block_size - 1 inputs are real


def headed_rows(weight: np.ndarray, block: int = TERNARY.block_size) -> np.ndarray:
    """A weight [K, N] laid out for inputs headed by a 127 each block (headed_inputs): a row of zeros at the
    head of every block of `block` rows, K's rows after them (block - 1 a block), zero rows padding the last."""
    real = block - 1
    blocks = -(-weight.shape[0] // real)
    padded = np.zeros((blocks * real, weight.shape[1]), weight.dtype)
    padded[: weight.shape[0]] = weight
    heads = np.zeros((blocks, 1, weight.shape[1]), weight.dtype)
    return np.concatenate([heads, padded.reshape(blocks, real, -1)], axis=1).reshape(blocks * block, -1)


def headed_inputs(source: str, output: str, width: int, block: int = TERNARY.block_size):
    """Nodes and constants that turn `source` [B, S, width] into `output` [B, S, blocks · block]: its inputs
    (block - 1) a block, zero-padded, each block headed by a 127 (see TERNARY)."""
    real = block - 1
    blocks = -(-width // real)
    constants = [(f"{source}_tail_pads", np.array([0, 0, 0, 0, 0, blocks * real - width], np.int64)),
                 (f"{source}_blocks", np.array([0, 0, blocks, real], np.int64)),
                 (f"{source}_head_pads", np.array([0, 0, 0, 1, 0, 0, 0, 0], np.int64)),
                 (f"{source}_head", np.array(INPUT_HEAD, np.float32)),
                 (f"{source}_headed_width", np.array([0, 0, blocks * block], np.int64))]
    make = onnx.helper.make_node
    nodes = [make("Pad", [source, f"{source}_tail_pads"], [f"{source}_padded"], name=f"{source}_pad"),
             make("Reshape", [f"{source}_padded", f"{source}_blocks"], [f"{source}_in_blocks"], name=f"{source}_blocks"),
             make("Pad", [f"{source}_in_blocks", f"{source}_head_pads", f"{source}_head"], [f"{source}_headed_blocks"],
                  name=f"{source}_head"),
             make("Reshape", [f"{source}_headed_blocks", f"{source}_headed_width"], [output], name=f"{source}_headed")]
    return nodes, constants


def ternary_matmul_nbits(weight: np.ndarray, name: str, scheme: Scheme = TERNARY) -> tuple[dict, list[tuple[str, np.ndarray]]]:
    """A MatMul weight [K, N] holding only -1, 0 and 1 as one MatMulNBits node's attributes and tensors
    (`scheme.bits`-bit codes w + the default zero point 2 ** (bits - 1), packed from the low bits of each byte up;
    scales 1.0; no zero points), whose dequantized weight is the weight exactly."""
    if not np.isin(weight, (-1.0, 0.0, 1.0)).all():
        raise VibeVoiceError(f"{name}: holds values other than -1, 0 and 1, so it is not a ternary weight")
    rows, cols = weight.shape
    bits, block = scheme.bits, scheme.block_size
    zero, per_byte, blocks = 2 ** (bits - 1), 8 // bits, -(-rows // block)
    codes = np.full((cols, blocks * block), zero, np.uint8)  # padding rows: the zero point, the value 0
    codes[:, :rows] = (weight.T + zero).astype(np.uint8)
    packed = np.zeros((cols, blocks * block // per_byte), np.uint8)
    for j in range(per_byte):
        packed |= codes[:, j::per_byte] << (bits * j)
    attributes = {"K": rows, "N": cols, "bits": bits, "block_size": block, "accuracy_level": scheme.accuracy_level}
    return attributes, [(f"{name}_Q{bits}", packed.reshape(cols, blocks, block * bits // 8)),
                        (f"{name}_scales", np.ones(cols * blocks, np.float32))]


def pack_ternary(path: Path, external_data: bool, scheme: Scheme = TERNARY) -> dict:
    """Rewrite, in place, every MatMul of the graph at `path` whose constant weight holds only -1, 0 and 1 as
    MatMulNBits (ternary_matmul_nbits) over its input headed by 127s (headed_inputs, once per input that several
    products read: q, k and v; gate and up): the same products, exactly, in int8 arithmetic, in 0.32 bytes a
    weight (2 bits and a 4-byte scale a block of 128, one row in 128 the heads' zeros) instead of 4."""
    model = onnx.load(str(path))
    before = weight_bytes(model)
    weights = {t.name: t for t in model.graph.initializer}
    uses = {}
    for node in model.graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    nodes, packed, headed = [], 0, {}
    for node in model.graph.node:
        tensor = weights.get(node.input[1]) if node.op_type == "MatMul" and node.domain in ("", "ai.onnx") else None
        array = onnx.numpy_helper.to_array(tensor) if tensor is not None and len(tensor.dims) == 2 else None
        if array is None or uses[node.input[1]] != 1 or not np.isin(array, (-1.0, 0.0, 1.0)).all():
            nodes.append(node)
            continue
        source = node.input[0]
        if source not in headed:
            headed[source] = f"{source}_headed"
            head_nodes, constants = headed_inputs(source, headed[source], array.shape[0], scheme.block_size)
            nodes.extend(head_nodes)
            model.graph.initializer.extend(onnx.numpy_helper.from_array(a, n) for n, a in constants)
        attributes, tensors = ternary_matmul_nbits(headed_rows(array, scheme.block_size), node.input[1], scheme)
        model.graph.initializer.remove(tensor)
        model.graph.initializer.extend(onnx.numpy_helper.from_array(a, n) for n, a in tensors)
        nodes.append(onnx.helper.make_node("MatMulNBits", [headed[source], *(n for n, _ in tensors)], list(node.output),
                                           name=f"{node.name}_Q{scheme.bits}", domain="com.microsoft", **attributes))
        packed += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    if packed and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    _save(model, path, external_data)
    return {**scheme.describe(), "scheme": TERNARY_SCHEME, "matmuls": packed,
            "weight_bytes_before": before, "weight_bytes_after": weight_bytes(model)}


def _dynamic(model: onnx.ModelProto, path: Path, external_data: bool) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path.with_name(path.name + ".data").unlink(missing_ok=True)
    with _quiet(logging.getLogger()):  # the quantizer logs advice and a line per activation on the root logger
        quantize_dynamic(model, path, op_types_to_quantize=["MatMul"], per_channel=True, weight_type=QuantType.QInt8,
                         reduce_range=True,
                         use_external_data_format=external_data, extra_options={"MatMulConstBOnly": True})
    quantized = onnx.load(str(path))
    _save(quantized, path, external_data)  # our file conventions (it writes the data file owner-only)
    return quantized


@contextlib.contextmanager
def _quiet(logger: logging.Logger):
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _sort_topologically(graph: onnx.GraphProto) -> None:
    produced_by = {out: i for i, node in enumerate(graph.node) for out in node.output}
    order, state = [], {}

    def visit(i: int) -> None:
        stack = [(i, False)]
        while stack:
            index, done = stack.pop()
            if done:
                state[index] = 2
                order.append(index)
                continue
            if state.get(index):
                continue
            state[index] = 1
            stack.append((index, True))
            stack.extend((produced_by[name], False) for name in graph.node[index].input
                         if name in produced_by and not state.get(produced_by[name]))

    for i in range(len(graph.node)):
        visit(i)
    nodes = [graph.node[i] for i in order]
    graph.ClearField("node")
    graph.node.extend(nodes)


def _save(model: onnx.ModelProto, path: Path, external_data: bool) -> None:
    """Replace the graph at `path` (and its .data file, when it keeps its weights outside)."""
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)
    onnx.save(model, str(path), save_as_external_data=external_data, all_tensors_to_one_file=True,
              location=data.name, size_threshold=1024)


# Operators kept in fp32 inside an fp16 graph, on top of the converter's defaults: the norms' sum of squares
# and the timestep sinusoid overflow or lose too much in fp16 (the diffusion head is the most sensitive);
# the fused GELU (graphs.fuse_gelus) stands for the Erf it replaced.
FP16_KEEP = ["Pow", "ReduceMean", "Sqrt", "Reciprocal", "Sin", "Cos", "Exp", "Erf", "Gelu"]


def convert_fp16(path: Path, external_data: bool) -> dict:
    """Convert the graph at `path` to fp16 in place, inputs and outputs kept fp32 (the runtime feeds fp32)."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    path = Path(path)
    model = onnx.load(str(path))
    before = weight_bytes(model)
    converted = convert_float_to_float16(model, keep_io_types=True, op_block_list=DEFAULT_OP_BLOCK_LIST + FP16_KEEP)
    share_casts(converted.graph)  # onnxruntime <= 1.31 writes one Cast per consumer, all under one name
    _sort_topologically(converted.graph)  # the converter appends its input casts after their users
    converted.graph.ClearField("value_info")  # stale float types from the export; inference redoes them
    onnx.checker.check_model(converted, full_check=True)  # static; its gates need a GPU provider to run
    _save(converted, path, external_data)
    open_on_cpu(path)
    return {"scheme": "fp16", "kept_fp32_ops": FP16_KEEP, "weight_bytes_before": before,
            "weight_bytes_after": weight_bytes(converted)}


def share_casts(graph: onnx.GraphProto) -> int:
    """Leave one Cast per (tensor, target type): a later Cast of the same tensor to the same type is dropped
    and its consumers read the first one's output. onnxruntime's fp16 converter up to 1.31 adds a Cast before
    every kept-fp32 op that reads a tensor, each named after the tensor, so a tensor read by two such ops is
    written twice under one name (not SSA: the checker refuses it); 1.32's shares one. Returns the number of
    Casts dropped."""
    graph_outputs = {o.name for o in graph.output}
    shared: dict[tuple[str, int], str] = {}  # (tensor, type) -> the output of the Cast kept for it
    cast_by_output: dict[str, tuple[str, int]] = {}
    renamed: dict[str, str] = {}
    kept = []
    for node in graph.node:
        if node.op_type != "Cast" or node.output[0] in graph_outputs:
            kept.append(node)
            continue
        key = (node.input[0], next(helper.get_attribute_value(a) for a in node.attribute if a.name == "to"))
        output = node.output[0]
        if cast_by_output.setdefault(output, key) != key:
            raise VibeVoiceError(f"two different Casts write {output!r}; they cannot be merged")
        if key not in shared:
            shared[key] = output
            kept.append(node)
        elif shared[key] != output:
            renamed[output] = shared[key]
    dropped = len(graph.node) - len(kept)
    if dropped:
        graph.ClearField("node")
        graph.node.extend(kept)
        _rename_inputs(graph, renamed)
    return dropped


def _rename_inputs(graph: onnx.GraphProto, renamed: dict[str, str]) -> None:
    """Point every node input named in `renamed` at its new name, in subgraphs too (they may read outer tensors)."""
    for node in graph.node:
        for i, name in enumerate(node.input):
            node.input[i] = renamed.get(name, name)
        for attribute in node.attribute:
            for subgraph in [attribute.g, *attribute.graphs] if attribute.HasField("g") or attribute.graphs else []:
                _rename_inputs(subgraph, renamed)


def open_on_cpu(path: Path) -> None:
    """Open a converted graph in an onnxruntime session on the CPU provider: the checker is static, and this
    catches what only onnxruntime's loader refuses (a type it cannot resolve, a node it has no kernel for)."""
    import onnxruntime as ort

    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime's exception types are not exported under stable names
        raise VibeVoiceError(f"{path.name}: the fp16 graph does not load in onnxruntime: {error}") from error
