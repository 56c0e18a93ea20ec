"""`build`: the bundle's contents and manifest, atomicity, and the tokenizer rule."""

import json

import numpy as np
import onnx
import pytest
import torch

from vibevoice_onnx.errors import VibeVoiceError
from vibevoice_onnx.export import build as build_module
from vibevoice_onnx.export.build import build_bundle, resolve_tokenizer
from vibevoice_onnx.reference.modules import ConvState, conv_state_specs

from helpers import copy_checkpoint

GRAPHS = {"lower_lm", "upper_lm", "diffusion_head_conditioning", "diffusion_head_step",
          "acoustic_connector", "eos_classifier", "acoustic_decoder_stream"}


def test_bundle_holds_every_graph_with_its_signature(tiny_traced_bundle, tiny_checkpoints):
    manifest = json.loads((tiny_traced_bundle / "manifest.json").read_text())
    assert tiny_traced_bundle.parts[-2:] == ("realtime", "cpu_fp32")
    assert manifest["model_kind"] == "realtime" and manifest["precision"] == "fp32"
    assert set(manifest["graphs"]) == GRAPHS
    assert manifest["config"] == json.loads((tiny_checkpoints["realtime"] / "config.json").read_text())
    assert manifest["source"]["hash"].startswith("sha256:")
    assert manifest["tools"]["torch"] and manifest["tools"]["onnxruntime"]
    lower, upper = manifest["graphs"]["lower_lm"], manifest["graphs"]["upper_lm"]
    assert [i["name"] for i in lower["inputs"]] == ["inputs_embeds", "position_ids", "seqlens_k", "total_sequence_length"] + [
        f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")]
    assert len(upper["outputs"]) == 1 + 2 * 4  # hidden + present K/V of the 4 upper layers
    assert [upper["inputs"][i]["dtype"] for i in (1, 2, 3)] == ["int64", "int32", "int32"]
    assert upper["inputs"][0]["shape"][-1] == 64
    # the cache is attended and written by one GroupQueryAttention per layer (in place when bound so)
    for name, layers in (("lower_lm", 2), ("upper_lm", 4)):
        nodes = onnx.load(str(tiny_traced_bundle / manifest["graphs"][name]["file"])).graph.node
        assert [n.domain for n in nodes if n.op_type == "GroupQueryAttention"] == ["com.microsoft"] * layers
    stream = manifest["graphs"]["acoustic_decoder_stream"]
    assert len(stream["inputs"]) == 1 + len(stream["states"]) == len(stream["outputs"])
    for name, graph in manifest["graphs"].items():
        model = onnx.load(str(tiny_traced_bundle / graph["file"]))
        onnx.checker.check_model(model)
        assert [i.name for i in model.graph.input] == [i["name"] for i in graph["inputs"]]
    from safetensors.numpy import load_file

    host = load_file(tiny_traced_bundle / "host.safetensors")
    assert host["embed_tokens"].shape == (512, 64) and host["tts_input_types"].shape == (2, 64)
    assert np.isfinite(float(host["speech_scaling_factor"]))
    assert (tiny_traced_bundle / "tokenizer.json").is_file()
    assert {oct(p.stat().st_mode & 0o777) for p in tiny_traced_bundle.iterdir() if p.is_file()} == {"0o644"}  # shareable


def test_lm_graphs_do_not_carry_the_embedding_table(tiny_traced_bundle):
    model = onnx.load(str(tiny_traced_bundle / "upper_lm.onnx"))
    assert not any(tuple(i.dims) == (512, 64) for i in model.graph.initializer)


def test_lm_layers_run_as_few_fused_kernels(tiny_traced_bundle, tmp_path):
    """As onnxruntime's model builder writes Qwen2: per layer, once onnxruntime has optimized the graph, two
    fused RMSNorms, one product for q, k and v with its bias Add and the Split of its output, one
    GroupQueryAttention that also rotates (no rotary operators around it), o, gate, up and down, the SiLU, the
    gating Mul and the two residual Adds: 14 operators at fp32 (13 quantized, where MatMulNBits takes the bias;
    the transformers form ran 47: each norm seven, the rotary twelve)."""
    from collections import Counter

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(tiny_traced_bundle / "upper_lm.onnx"), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx"))
    ops, layers = Counter(n.op_type for n in optimized.graph.node), 4
    assert ops["SimplifiedLayerNormalization"] == 2 * layers + 1 and ops["GroupQueryAttention"] == layers
    assert ops["MatMul"] == (1 + 4) * layers and not ops.keys() & {"Sin", "Cos", "Neg", "Pow", "Sqrt", "Reciprocal"}
    assert sum(ops.values()) == 14 * layers + 1  # + the final norm
    rotary = [a.i for n in optimized.graph.node if n.op_type == "GroupQueryAttention" for a in n.attribute if a.name == "do_rotary"]
    assert rotary == [1] * layers


def test_diffusion_head_graphs_run_as_few_fused_kernels(tiny_traced_bundle, tmp_path):
    """The conditioning graph projects the activated condition once for every layer (one product, no Concat);
    the step graph's norms are each one SimplifiedLayerNormalization (seven operators in transformers' form)."""
    from collections import Counter

    import onnxruntime as ort

    def optimized_ops(name: str) -> Counter:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / f"{name}.onnx")
        ort.InferenceSession(str(tiny_traced_bundle / f"{name}.onnx"), options, providers=["CPUExecutionProvider"])
        return Counter(n.op_type for n in onnx.load(str(tmp_path / f"{name}.onnx")).graph.node)

    conditioning, step = optimized_ops("diffusion_head_conditioning"), optimized_ops("diffusion_head_step")
    layers = json.loads((tiny_traced_bundle / "manifest.json").read_text())["config"]["diffusion_head_config"]["head_layers"]
    # products: the condition's, the timestep MLP's two and one for every layer's modulation (8 as transformers
    # writes it, a projection a layer and a Concat of them); the one Concat left is the timestep's sin and cos
    assert conditioning["MatMul"] + conditioning["Gemm"] + conditioning["FusedGemm"] == 4 and conditioning["Concat"] == 1
    assert step["SimplifiedLayerNormalization"] == layers + 1
    assert not step.keys() & {"Pow", "ReduceMean", "Sqrt", "Reciprocal"}


def test_decoder_gelus_run_as_fused_kernels(tiny_traced_bundle):
    from collections import Counter

    for name in ("acoustic_decoder_stream",):
        graph = onnx.load(str(tiny_traced_bundle / f"{name}.onnx")).graph
        ops = Counter(node.op_type for node in graph.node)
        assert ops["Gelu"] > 0 and ops["Erf"] == 0, name  # none left spelt out op by op
        used = {value for node in graph.node for value in node.input}
        assert [i.name for i in graph.initializer if i.name not in used] == [], name  # nor their constants


def test_a_failed_build_leaves_nothing_that_looks_complete(tiny_checkpoints, tmp_path, monkeypatch):
    calls = []
    real_export = build_module.export_graph

    def export_then_fail(spec, out_dir, log=print, fuse=True):
        if calls:
            raise RuntimeError("simulated crash during export")
        calls.append(spec.name)
        return real_export(spec, out_dir, log, fuse)

    monkeypatch.setattr(build_module, "export_graph", export_then_fail)
    with pytest.raises(RuntimeError, match="simulated crash"):
        build_bundle(tiny_checkpoints["realtime"], tmp_path)
    assert calls == ["lower_lm"]
    assert list(tmp_path.iterdir()) == []  # neither a partial bundle nor the kind folder the build created


def test_a_checkpoint_without_tokenizer_needs_one(tiny_checkpoints, tmp_path):
    ckpt = copy_checkpoint(tiny_checkpoints["realtime"], tmp_path / "ckpt")
    (ckpt / "tokenizer.json").unlink()
    with pytest.raises(VibeVoiceError, match="has no tokenizer.json.*pass --tokenizer"):
        build_bundle(ckpt, tmp_path / "onnx")
    assert not (tmp_path / "onnx" / "realtime" / "cpu_fp32").exists()
    folder = tmp_path / "qwen"
    folder.mkdir()
    (folder / "tokenizer.json").write_text((tiny_checkpoints["realtime"] / "tokenizer.json").read_text())
    assert resolve_tokenizer(ckpt, folder) == folder / "tokenizer.json"
    assert resolve_tokenizer(ckpt, folder / "tokenizer.json") == folder / "tokenizer.json"
    with pytest.raises(VibeVoiceError, match="no tokenizer.json there"):
        resolve_tokenizer(ckpt, tmp_path / "nowhere")


def test_unsupported_requests_are_refused(tiny_checkpoints, tmp_path):
    with pytest.raises(VibeVoiceError, match="no int4-mixed policy for 1.5b bundles yet"):
        build_bundle(tiny_checkpoints["1.5b"], tmp_path, precision="int4-mixed")
    with pytest.raises(VibeVoiceError, match="cpu_fp16 bundles are not built: fp16 is never faster"):
        build_bundle(tiny_checkpoints["realtime"], tmp_path, precision="fp16")
    with pytest.raises(VibeVoiceError, match="device 'tpu' is not supported"):
        build_bundle(tiny_checkpoints["realtime"], tmp_path, device="tpu")
    assert not any(tmp_path.iterdir())  # refused before any output


def test_a_rebuild_keeps_the_imported_voices(tiny_bundle, eos_early_rebuild):
    _, rebuilt = eos_early_rebuild
    assert (rebuilt / "voices" / "synthetic.safetensors").read_bytes() == (tiny_bundle / "voices" / "synthetic.safetensors").read_bytes()
    assert not (rebuilt / "stale.txt").exists()
    assert sorted(p.name for p in rebuilt.parent.iterdir()) == ["cpu_fp32"]


@torch.no_grad()
def test_rewritten_head_and_upsamplers_equal_transformers_modules(realtime_reference):
    """What the export rewrites (the head split in two; the decoder channels-last, its transposed convs as two
    MatMuls, its norms spelt out) gives transformers' numbers and conv states, and leaves the reference model's
    own modules as they were."""
    from vibevoice_onnx.export.graphs import HeadConditioningGraph, HeadStepGraph, export_decoder_view

    g = torch.Generator().manual_seed(5)
    head, decoder = realtime_reference.diffusion_head, realtime_reference.acoustic_decoder
    x, c, t = torch.randn(3, 64, generator=g), torch.randn(3, 64, generator=g), torch.tensor([999.0, 400.0, 17.0])
    split = HeadStepGraph(head)(x, HeadConditioningGraph(head)(t, c))
    torch.testing.assert_close(split, head(x, t, c), atol=1e-5, rtol=1e-5)

    view, latents = export_decoder_view(decoder), torch.randn(1, 64, 5, generator=g)
    assert conv_state_specs(view) == conv_state_specs(decoder)
    torch.testing.assert_close(view(latents).audio, decoder(latents).audio, atol=1e-5, rtol=1e-5)
    theirs, ours = ConvState.zeros(conv_state_specs(decoder)), ConvState.zeros(conv_state_specs(decoder))
    for a, b in ((0, 1), (1, 3), (3, 5)):  # a first frame, then chunks carrying the states
        torch.testing.assert_close(view(latents[..., a:b], padding_cache=ours).audio,
                                   decoder(latents[..., a:b], padding_cache=theirs).audio, atol=1e-5, rtol=1e-5)
    for key in theirs.tensors:
        torch.testing.assert_close(ours.tensors[key], theirs.tensors[key])
    assert all(type(layer.convtr).__name__ == "VibeVoiceAcousticTokenizerCausalConvTranspose1d" for layer in decoder.conv_layers)
    assert all(type(layer.linear).__name__ == "Linear" for layer in head.layers)


@torch.no_grad()
def test_channels_last_encoders_equal_transformers_encoders(tiny_checkpoints):
    """The exported encoders' channels-last view gives transformers' latents and conv states, whole (upstream's
    padding) and streamed in chunks (the last one short, padded to a stride), for both of the 1.5B's encoders."""
    from vibevoice_onnx.export.graphs import export_encoder_view
    from vibevoice_onnx.reference.modules import UpstreamPadding
    from vibevoice_onnx.reference.tts15b import load_tts15b

    reference = load_tts15b(tiny_checkpoints["1.5b"])
    audio = torch.randn(1, 1, 7 * 3200 + 123, generator=torch.Generator().manual_seed(6)) * 0.1
    for encoder in (reference.acoustic_encoder, reference.semantic_encoder):
        view = export_encoder_view(encoder)
        assert conv_state_specs(view) == conv_state_specs(encoder)
        torch.testing.assert_close(view(audio, padding_cache=UpstreamPadding()).latents,
                                   encoder(audio, padding_cache=UpstreamPadding()).latents, atol=1e-5, rtol=1e-5)
        theirs, ours = (ConvState.zeros(conv_state_specs(encoder), pad_to_stride=True) for _ in range(2))
        for a, b in ((0, 3200), (3200, 4 * 3200), (4 * 3200, audio.shape[-1])):
            torch.testing.assert_close(view(audio[..., a:b], padding_cache=ours).latents,
                                       encoder(audio[..., a:b], padding_cache=theirs).latents, atol=1e-5, rtol=1e-5)
        for key in theirs.tensors:
            torch.testing.assert_close(ours.tensors[key], theirs.tensors[key])
