"""Layouts against the published facts: tensor and parameter totals of the real hub checkpoints."""

import json

import pytest

from vibevoice_onnx.checkpoints.configs import full_config, model_dims, tiny_config
from vibevoice_onnx.checkpoints.layouts import layout_for

# Totals recorded by a provenance manifest of the hub checkpoints (facts sheet 1.5).
HUB_TOTALS = {
    "realtime": (605, 1_017_626_724),
    "1.5b": (1_204, 2_704_021_987),
    "asr-hf": (901, 8_330_325_888),
    "asr-bitnet": (1_177, 2_814_116_321),  # docs/bitnet.md: its three F32 shards (MOB)
}


@pytest.mark.parametrize("kind", sorted(HUB_TOTALS))
def test_full_layout_matches_hub_totals(kind):
    layout = layout_for(model_dims(full_config(kind)))
    assert (len(layout.tensors), layout.parameters) == HUB_TOTALS[kind]
    assert len({t.name for t in layout.tensors}) == len(layout.tensors)


def test_large_layout_matches_the_published_arithmetic():
    """Facts sheet 11.5 (parameter counts from the module definitions, the two scalars apart) and 11.4 (one
    tensor more than the 1.5B: the top-level untied head)."""
    layout = layout_for(model_dims(full_config("large")))
    assert (len(layout.tensors), layout.parameters) == (1_205, 9_343_355_361 + 2)
    components = layout.components()
    assert components["lm_head"] == 544_997_376 and components["prediction_head"] == 669_333_504
    assert components["acoustic_connector"] == 13_085_184 and components["semantic_connector"] == 13_314_560


def test_realtime_config_is_the_hub_file_size():
    # The hub config.json is 2,117 bytes; ours, written as transformers writes configs, must be too.
    assert len(json.dumps(full_config("realtime"), indent=2) + "\n") == 2117


def test_realtime_structure_encodes_the_split_and_the_traps():
    dims = model_dims(full_config("realtime"))
    assert dims.configured_layers == 24
    assert dims.actual_layers == {"language_model": 4, "tts_language_model": 20}
    names = {t.name: t for t in layout_for(dims).tensors}
    assert "model.language_model.layers.3.mlp.up_proj.weight" in names
    assert "model.language_model.layers.4.mlp.up_proj.weight" not in names
    assert "model.tts_language_model.layers.19.mlp.up_proj.weight" in names
    assert "model.language_model.norm.weight" not in names  # Identity final norm
    assert "model.tts_language_model.norm.weight" in names
    assert not names["model.tts_language_model.embed_tokens.weight"].used
    assert names["model.language_model.embed_tokens.weight"].used
    assert not any(".acoustic_tokenizer.encoder." in n for n in names)
    assert names["tts_eos_classifier.fc2.weight"].shape == (1, 896)
    assert names["model.tts_input_types.weight"].shape == (2, 896)
    assert names["model.speech_scaling_factor"].shape == ()
    assert names["model.acoustic_tokenizer.decoder.upsample_layers.1.0.convtr.convtr.weight"].shape == (2048, 1024, 16)


def test_other_kinds_encode_their_differences():
    tts = {t.name for t in layout_for(model_dims(full_config("1.5b"))).tensors}
    assert "lm_head.weight" not in tts  # tied
    codes = {t.name: t for t in layout_for(model_dims(full_config("asr"))).tensors}
    assert codes["lm_head.weight"].shape == (152064, 3584)
    decoder = [t for n, t in codes.items() if ".acoustic_tokenizer.decoder." in n]
    assert decoder and not any(t.used for t in decoder)  # present, unused
    hf = {t.name for t in layout_for(model_dims(full_config("asr-hf"))).tensors}
    assert "lm_head.weight" in hf
    assert "model.acoustic_tokenizer_encoder.conv_layers.5.conv.conv.weight" in hf
    assert not any("decoder" in n for n in hf)


def test_model_type_vibevoice_is_disambiguated():
    assert model_dims(full_config("1.5b")).kind == "1.5b"
    assert model_dims(full_config("large")).kind == "large"  # the top-level tie_word_embeddings: false
    assert model_dims(full_config("asr")).kind == "asr"
    assert full_config("1.5b")["model_type"] == full_config("asr")["model_type"] == "vibevoice"


@pytest.mark.parametrize("kind", ["realtime", "1.5b", "large", "asr", "asr-hf"])
def test_tiny_configs_keep_the_real_hop(kind):
    dims = model_dims(tiny_config(kind, 512, {"<|object_ref_start|>": 1, "<|object_ref_end|>": 2, "<|box_start|>": 3}))
    stacks = [s for s in (dims.acoustic_encoder, dims.acoustic_decoder, dims.semantic_encoder) if s]
    assert stacks and all(s.hop == 3200 for s in stacks)
    assert dims.lm.hidden <= 128
