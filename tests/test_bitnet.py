"""VibeVoice-ASR-BitNet (kind asr-bitnet, docs/bitnet.md): recognised apart from the 7B ASR whose config it shares,
synthetic checkpoints in its released layout loaded strictly."""

from __future__ import annotations

import json

import pytest

from vibevoice_onnx.checkpoints.configs import detect_kind, full_config, model_dims
from vibevoice_onnx.checkpoints.inspect import inspect_checkpoint
from vibevoice_onnx.checkpoints.synthetic import make_checkpoint


@pytest.fixture(scope="module")
def tiny_bitnet(tmp_path_factory):
    out = tmp_path_factory.mktemp("bitnet") / "tiny"
    make_checkpoint("asr-bitnet", out)
    return out


@pytest.fixture(scope="module")
def bitnet_bundle(tiny_bitnet, tmp_path_factory):
    from vibevoice_onnx.export.build import build_bundle

    return build_bundle(tiny_bitnet, tmp_path_factory.mktemp("bitnet-onnx"), write=True)


def test_recognised_apart_from_the_7b_asr_and_asr_hf():
    bitnet, asr = full_config("asr-bitnet"), full_config("asr")
    assert (bitnet["model_type"], bitnet["architectures"]) == (asr["model_type"], asr["architectures"])
    assert detect_kind(bitnet) == "asr-bitnet"
    assert detect_kind(asr) == "asr"
    assert detect_kind(full_config("asr-hf")) == "asr-hf"
    assert detect_kind(full_config("asr-streaming", "1.5b")) == "asr-streaming"  # the other tied 1.5B ASR
    untied = json.loads(json.dumps(bitnet))
    untied["decoder_config"]["tie_word_embeddings"] = False
    assert detect_kind(untied) == "asr"


def test_full_dims_are_the_released_ones():  # the tensor and value totals: tests/test_layouts.py
    lm = model_dims(full_config("asr-bitnet")).lm
    assert (lm.hidden, lm.layers, lm.heads, lm.kv_heads, lm.intermediate, lm.vocab, lm.tied_embeddings) == (
        1536, 28, 12, 2, 8960, 151936, True)


def test_tiny_checkpoint_is_f32_sharded_and_loads_strictly(tiny_bitnet):
    from safetensors import safe_open

    report = inspect_checkpoint(tiny_bitnet)
    assert report["kind"] == "asr-bitnet"
    assert (report["missing"], report["unexpected"], report["dtypes"]) == ([], [], {"F32": len(report_names(tiny_bitnet))})
    index = json.loads((tiny_bitnet / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 3
    tensors = {}
    for shard in set(index["weight_map"].values()):
        with safe_open(str(tiny_bitnet / shard), "np") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys() if k in ("lm_head.weight", EMBED)})
    assert (tensors["lm_head.weight"] == tensors[EMBED]).all()  # byte-identical, as released


EMBED = "model.language_model.embed_tokens.weight"


def report_names(root) -> list[str]:
    return list(json.loads((root / "model.safetensors.index.json").read_text())["weight_map"])


# ---------------------------------------------------------------------------------------------------------------
# The reference: BitLinear is the published formula


def test_bitlinear_is_the_formula_on_random_tensors():
    import numpy as np
    import torch

    from vibevoice_onnx.reference.asr_bitnet import BitLinear

    g = torch.Generator().manual_seed(3)
    linear = torch.nn.Linear(48, 20)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(20, 48, generator=g) * 0.3)
    x = torch.randn(2, 5, 48, generator=g) * 2
    x[0, 0] = 0  # an all-zero token: the 1e-5 floor
    ours = BitLinear(linear)(x).detach().numpy().astype(np.float64)

    w, b, xs = (t.detach().numpy().astype(np.float64) for t in (linear.weight, linear.bias, x))
    s = 1 / max(np.abs(w.astype(np.float32)).mean(dtype=np.float32), 1e-5)
    wt = np.clip(np.round(w * s), -1, 1)  # numpy rounds half to even, as torch
    a = 127 / np.maximum(np.abs(xs).max(-1, keepdims=True), 1e-5)
    xq = np.clip(np.round(xs * a), -128, 127)
    expected = xq @ wt.T / (a * s) + b
    assert set(np.unique(BitLinear(linear).weight.numpy())) <= {-1.0, 0.0, 1.0}
    assert np.abs(ours - expected).max() < 1e-5
    assert np.allclose(ours[0, 0], b)  # a zero token gives the bias


def test_ternarize_rounds_half_to_even():
    import torch

    from vibevoice_onnx.reference.asr_bitnet import ternarize

    codes, scale = ternarize(torch.tensor([[0.5, -0.5, 1.5, -2.5, 0.0]]))  # mean|W| = 1: s = 1
    assert float(scale) == 1.0 and codes.tolist() == [[0.0, 0.0, 1.0, -1.0, 0.0]]


def test_the_reference_ternarizes_every_projection(tiny_bitnet):
    import torch

    from vibevoice_onnx.reference.asr_bitnet import PROJECTIONS, BitLinear, load_asr_bitnet

    reference = load_asr_bitnet(tiny_bitnet)
    layers = reference.parts.language_model.layers
    projections = [layer.get_submodule(p) for layer in layers for p in PROJECTIONS]
    assert len(projections) == 7 * len(layers) and all(isinstance(m, BitLinear) for m in projections)
    assert all(set(torch.unique(m.weight).tolist()) == {-1.0, 0.0, 1.0} for m in projections)
    # the head stays the embedding, float
    assert reference.model.lm_head.weight.data_ptr() == reference.parts.language_model.embed_tokens.weight.data_ptr()


# ---------------------------------------------------------------------------------------------------------------
# The export: ternary weights represented exactly, the integer arithmetic reproduced bit for bit


def test_a_bitlinear_graph_equals_the_reference_bit_for_bit(tmp_path):
    """down_proj's full-size input width (8960: the longest sums, 127 · 8960 < 2**24; 96 of its outputs), latent weights of the
    released scale, tokens of other scales; the graph's output equals torch's bit for bit, and so does the graph
    with its ternary weights packed as 2-bit MatMulNBits over inputs headed by 127s, computed in int8 (what a
    bundle holds)."""
    import shutil

    import numpy as np
    import onnxruntime as ort
    import torch

    from vibevoice_onnx.export.graphs import BATCH, FRAMES, GraphSpec, export_graph
    from vibevoice_onnx.export.precision import pack_ternary
    from vibevoice_onnx.reference.asr_bitnet import BitLinear

    g = torch.Generator().manual_seed(5)
    linear = torch.nn.Linear(8960, 96, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(96, 8960, generator=g) * 0.043)
    layer = BitLinear(linear)
    x = torch.randn(2, 7, 8960, generator=g) * torch.logspace(-3, 2, 7)[None, :, None]
    x[0, 0] = torch.where(torch.rand(8960, generator=g) < 0.5, 1.0, -1.0) * 3  # every x_q at ±127
    spec = GraphSpec("bitlinear", layer, (x[:, :2],), ["x"], ["y"], ({0: BATCH, 1: FRAMES},))
    path = export_graph(spec, tmp_path, lambda _: None, fuse=False)
    packed = tmp_path / "packed" / path.name
    packed.parent.mkdir()
    shutil.copyfile(path, packed)
    details = pack_ternary(packed, external_data=False)
    assert details["matmuls"] == 1 and details["weight_bytes_after"] < details["weight_bytes_before"] / 12
    with torch.no_grad():
        expected = layer(x).numpy()
    for graph in (path, packed):
        out = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
        assert np.array_equal(out, expected), graph  # bit for bit
    codes = layer.weight.numpy()
    assert set(np.unique(codes)) == {-1.0, 0.0, 1.0}
    # the integer part alone, in int64, is what the fp32 MatMul computed
    a = 127 / np.maximum(np.abs(x.numpy()).max(-1, keepdims=True), np.float32(1e-5))
    x_q = np.clip(np.round(x.numpy() * a), -128, 127).astype(np.int64)
    exact = (x_q @ codes.astype(np.int64).T).astype(np.float64)
    assert np.abs(exact).max() < 2**24
    assert np.abs(expected * (a * float(layer.weight_scale)) - exact).max() / np.abs(exact).max() < 1e-6


@pytest.mark.parametrize("bits", [2, 4])
def test_ternary_packing_round_trips_odd_shapes(bits):
    import dataclasses

    import numpy as np

    from vibevoice_onnx.export.precision import TERNARY, ternary_matmul_nbits

    weight = np.random.default_rng(1).integers(-1, 2, (200, 6)).astype(np.float32)  # K not a multiple of the block
    attributes, tensors = ternary_matmul_nbits(weight, "w", dataclasses.replace(TERNARY, bits=bits))
    assert unpack_ternary(attributes, dict(tensors), "w").tobytes() == weight.tobytes()
    with pytest.raises(Exception, match="not a ternary weight"):
        ternary_matmul_nbits(weight * 0.5, "w")


def unpack_ternary(attributes: dict, tensors: dict, name: str):
    """The [K, N] weight a ternary MatMulNBits node's tensors hold: (code - 2 ** (bits - 1)) · scale, 8 // bits
    codes a byte from the low bits up."""
    import numpy as np

    bits = attributes["bits"]
    packed, scales = tensors[f"{name}_Q{bits}"], tensors[f"{name}_scales"]
    n, blocks = packed.shape[:2]
    codes = np.stack([(packed >> (bits * j)) & (2**bits - 1) for j in range(8 // bits)], axis=-1).reshape(n, blocks, -1)
    values = (codes.astype(np.float32) - 2 ** (bits - 1)) * scales.reshape(n, blocks, 1)
    return np.ascontiguousarray(values.reshape(n, -1)[:, :attributes["K"]].T)


def test_the_lm_graph_holds_exactly_the_reference_ternary_codes(tiny_bitnet, bitnet_bundle):
    import onnx
    from onnx import helper, numpy_helper

    from vibevoice_onnx.export.precision import TERNARY_SCHEME, headed_rows
    from vibevoice_onnx.reference.asr_bitnet import PROJECTIONS, load_asr_bitnet

    model = onnx.load(str(bitnet_bundle / "lm.onnx"))
    tensors = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    packed = []
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            assert (attributes["bits"], attributes["accuracy_level"], len(node.input)) == (2, 4, 3)  # zero point: 2
            packed.append(unpack_ternary(attributes, tensors, node.input[1].removesuffix("_Q2")))
    assert not [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in tensors]  # none left float
    layers = load_asr_bitnet(tiny_bitnet).parts.language_model.layers
    codes = [headed_rows(layer.get_submodule(p).weight.detach().numpy().T) for layer in layers for p in PROJECTIONS]
    assert len(packed) == len(codes) == 7 * len(layers)
    assert sorted(c.tobytes() for c in packed) == sorted((c + 0.0).tobytes() for c in codes)  # + 0.0: -0 is 0
    # one input headed by 127s a layer for q, k and v, one for o, one for gate and up, one for down
    assert sum(n.op_type == "Pad" and n.input[2:] != [] for n in model.graph.node) == 4 * len(layers)
    assert TERNARY_SCHEME in (bitnet_bundle / "manifest.json").read_text()


# ---------------------------------------------------------------------------------------------------------------
# Prompt, transcript, and the whole path: build, verify, transcribe


def test_the_prompt_asks_for_plain_text_in_the_json_system_frame(tiny_bitnet):
    from tokenizers import Tokenizer

    from vibevoice_onnx.transcription import (SYSTEM_PROMPT, build_text_prompt, parse_prose, parse_transcript,
                                              prompt_builder, transcript_parser)

    tokenizer = Tokenizer.from_file(str(tiny_bitnet / "tokenizer.json"))
    assert prompt_builder("asr-bitnet") is build_text_prompt
    assert transcript_parser("asr-bitnet") is parse_prose and transcript_parser("asr") is parse_transcript
    prompt = build_text_prompt(tokenizer, 24000 * 2 + 5)  # 2.0002 s: 16 audio tokens (rounded up)
    text = tokenizer.decode(prompt.ids, skip_special_tokens=False)
    assert text == (f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n<|object_ref_start|>"
                    + "<|box_start|>" * 16 + "<|object_ref_end|>\nThis is a 2.00 seconds audio, please transcribe it."
                    "<|im_end|>\n")
    assert "JSON" in SYSTEM_PROMPT and len(prompt.audio_positions) == 16
    hot = tokenizer.decode(build_text_prompt(tokenizer, 24000, "Zorblax").ids, skip_special_tokens=False)
    assert hot.endswith("This is a 1.00 seconds audio, with extra info: Zorblax\n\nPlease transcribe it.<|im_end|>\n")


def test_the_released_tokenizer_lacks_the_audio_tokens_so_their_ids_are_inserted(tiny_bitnet):
    import json as _json

    from tokenizers import Tokenizer

    from vibevoice_onnx.transcription import build_text_prompt

    data = _json.loads((tiny_bitnet / "tokenizer.json").read_text())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")]
    plain = Tokenizer.from_str(_json.dumps(data))  # as released: plain Qwen2, three added tokens
    assert plain.token_to_id("<|box_start|>") is None
    prompt = build_text_prompt(plain, 3200 * 3)
    start = prompt.audio_positions[0] - 1
    assert prompt.ids[start:start + 5] == [151646, 151648, 151648, 151648, 151647]


def test_prose_is_a_transcript():
    from vibevoice_onnx.transcription import Segment, parse_prose, render

    segments, note = parse_prose("assistant\nHello there, this is plain text.\n")
    assert (segments, note) == ([Segment(None, None, None, "Hello there, this is plain text.")], None)
    assert render("txt", segments, "", "") == "Hello there, this is plain text.\n"
    assert parse_prose("  \n ") == ([], "the model's output is empty")


def test_build_verify_and_transcribe_end_to_end(bitnet_bundle, tiny_bitnet):
    import numpy as np

    from vibevoice_onnx.runtime.asr import Transcriber
    from vibevoice_onnx.runtime.manifest import Manifest
    from vibevoice_onnx.verify.common import verify_bundle

    record = verify_bundle(bitnet_bundle, tiny_bitnet, log=lambda _: None)
    assert record["passed"], [g for g in record["gates"] if not g["passed"]]
    gates = {g["name"]: g for g in record["gates"]}
    assert gates["lm (past 11, new 5)"]["cosine"] > 0.99999
    assert gates["closed loop, teacher-forced: greedy picks agree"]["passed"]
    assert Manifest.read(bitnet_bundle).parity["passed"]  # recorded in the bundle

    t = np.arange(24000 * 2) / 24000
    audio = (0.2 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 2 * t))).astype(np.float32)
    result = Transcriber(bitnet_bundle).transcribe(audio, sample_rate=24000, max_new_tokens=6)
    assert len(result.tokens) == 6 and "stopped at the 6-token limit" in result.note
    assert result.segments == ([] if not result.text.strip() else [result.segments[0]])  # prose: one segment or none


def test_int8_quantizes_the_head_and_the_encoders_and_keeps_the_lm_exact(tiny_bitnet, bitnet_bundle, tmp_path):
    """int8: the tied head as 8-bit MatMulNBits, both encoders in dynamic int8 (MatMulInteger); the LM as fp32 has
    it (its ternary products are exact either way: the same file); the bundle passes its gates."""
    import onnx

    from vibevoice_onnx.export.build import build_bundle
    from vibevoice_onnx.export.precision import policy
    from vibevoice_onnx.verify.common import verify_bundle

    bundle = build_bundle(tiny_bitnet, tmp_path, precision="int8", write=True)
    manifest = json.loads((bundle / "manifest.json").read_text())
    products = {"lm_head": "MatMulNBits", "acoustic_encoder_stream": "MatMulInteger", "semantic_encoder_stream": "MatMulInteger"}
    assert set(policy("asr-bitnet", "int8")) == set(products)
    for name, product in products.items():
        nodes = onnx.load(str(bundle / f"{name}.onnx")).graph.node
        assert manifest["graphs"][name]["precision"]["bits"] == 8 and any(n.op_type == product for n in nodes), name
    assert manifest["graphs"]["lm"]["precision"]["method"] == "ternary"
    assert (bundle / "lm.onnx").read_bytes() == (bitnet_bundle / "lm.onnx").read_bytes()
    record = verify_bundle(bundle, tiny_bitnet, log=lambda _: None)
    assert record["passed"], [g["name"] for g in record["gates"] if not g["passed"]]
