"""Strict loading of all four layouts into the PyTorch reference / transformers classes."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from vibevoice_onnx.errors import CheckpointError
from vibevoice_onnx.reference.loading import load_realtime, load_transformers_model

from helpers import copy_checkpoint
from hub_formulas import connector_from_hub, decoder_from_hub, encoder_from_hub, head_from_hub


def hub_tensors(checkpoint):
    out = {}
    for shard in sorted(checkpoint.glob("*.safetensors")):
        out.update({k: v.float() for k, v in load_file(shard).items()})
    return out


@torch.no_grad()
def test_1p5b_loads_into_transformers_with_every_tensor_in_place(tiny_checkpoints):
    ckpt = tiny_checkpoints["1.5b"]
    full = load_transformers_model(ckpt)
    model = full.model
    w = hub_tensors(ckpt)
    g = torch.Generator().manual_seed(0)
    audio = torch.randn(1, 1, 2 * 3200, generator=g)
    torch.testing.assert_close(model.audio_tower.encoder(audio).latents, encoder_from_hub(w, audio, "model.acoustic_tokenizer.encoder."), atol=1e-4, rtol=1e-4)
    semantic = model.semantic_tokenizer_encoder(audio).latents
    torch.testing.assert_close(semantic, encoder_from_hub(w, audio, "model.semantic_tokenizer.encoder."), atol=1e-4, rtol=1e-4)
    assert semantic.shape == (1, 2, 128)
    latents = torch.randn(1, 2, 64, generator=g)
    torch.testing.assert_close(model.audio_tower.decoder(latents.transpose(1, 2)).audio, decoder_from_hub(w, latents), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(model.multi_modal_projector(latents), connector_from_hub(w, latents, "model.acoustic_connector."), atol=1e-5, rtol=1e-5)
    sem = torch.randn(1, 2, 128, generator=g)
    torch.testing.assert_close(model.semantic_connector(sem), connector_from_hub(w, sem, "model.semantic_connector."), atol=1e-5, rtol=1e-5)
    x, c, t = torch.randn(2, 64, generator=g), torch.randn(2, 64, generator=g), torch.tensor([999.0, 5.0])
    torch.testing.assert_close(model.diffusion_head(x, t, c), head_from_hub(w, x, t, c), atol=1e-5, rtol=1e-4)
    assert model.latent_scaling_factor == w["model.speech_scaling_factor"]
    assert full.lm_head.weight.data_ptr() == model.language_model.embed_tokens.weight.data_ptr()  # tied


@pytest.mark.parametrize("kind", ["asr", "asr-hf"])
@torch.no_grad()
def test_asr_layouts_load_into_the_same_transformers_class(kind, tiny_checkpoints):
    model = load_transformers_model(tiny_checkpoints[kind])
    assert type(model).__name__ == "VibeVoiceAsrForConditionalGeneration"
    w = hub_tensors(tiny_checkpoints[kind])
    if kind == "asr-hf":  # already transformers names: every stored tensor must be the model's
        state = model.state_dict()
        assert all(torch.equal(state[name], tensor) for name, tensor in w.items())
    else:
        audio = torch.randn(1, 1, 3200, generator=torch.Generator().manual_seed(1))
        latents = model.model.semantic_tokenizer_encoder(audio).latents
        torch.testing.assert_close(latents, encoder_from_hub(w, audio, "model.semantic_tokenizer.encoder."), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(model.lm_head.weight, w["lm_head.weight"])


def test_asr_hf_accepts_legacy_llava_prefixes(tiny_checkpoints, tmp_path):
    from safetensors.numpy import load_file as load_np, save_file

    ckpt = copy_checkpoint(tiny_checkpoints["asr-hf"], tmp_path / "legacy")
    for shard in ckpt.glob("*.safetensors"):
        tensors = load_np(shard)
        renamed = {k.replace("model.language_model.", "language_model.model.").replace("lm_head.", "language_model.lm_head."): v for k, v in tensors.items()}
        save_file(renamed, shard, metadata={"format": "pt"})
    index = ckpt / "model.safetensors.index.json"
    index.write_text(index.read_text().replace('"model.language_model.', '"language_model.model.').replace('"lm_head.', '"language_model.lm_head.'))
    model = load_transformers_model(ckpt)
    reference = load_transformers_model(tiny_checkpoints["asr-hf"])
    assert torch.equal(model.lm_head.weight, reference.lm_head.weight)


def test_strict_load_names_what_is_missing(tiny_checkpoints, tmp_path):
    from safetensors.numpy import load_file as load_np, save_file

    ckpt = copy_checkpoint(tiny_checkpoints["realtime"], tmp_path / "broken")
    tensors = load_np(ckpt / "model.safetensors")
    tensors["model.prediction_head.cond_proj.weightx"] = tensors.pop("model.prediction_head.cond_proj.weight")
    save_file(tensors, ckpt / "model.safetensors")
    with pytest.raises(CheckpointError) as err:
        load_realtime(ckpt)
    message = str(err.value)
    assert "1 missing (model.prediction_head.cond_proj.weight)" in message
    assert "1 unexpected (model.prediction_head.cond_proj.weightx)" in message


def test_realtime_loader_refuses_other_kinds(tiny_checkpoints):
    with pytest.raises(CheckpointError, match="is a 1.5b checkpoint, not realtime"):
        load_realtime(tiny_checkpoints["1.5b"])


def test_scaling_buffers_come_from_the_checkpoint(realtime_reference, tiny_checkpoints):
    w = hub_tensors(tiny_checkpoints["realtime"])
    assert float(realtime_reference.speech_scaling_factor) == float(w["model.speech_scaling_factor"])
    assert not np.isnan(float(realtime_reference.speech_bias_factor))


@torch.no_grad()
def test_a_compact_reference_computes_the_same_numbers(tiny_checkpoints):
    """bf16-stored weights read as fp32 where used: exactly the fp32 reference, in less memory."""
    from vibevoice_onnx.reference.tts15b import load_tts15b

    full, compact = load_tts15b(tiny_checkpoints["1.5b"]), load_tts15b(tiny_checkpoints["1.5b"], compact=True)
    kept = [p for p in compact.model.parameters() if p.dtype == torch.bfloat16]
    assert kept and all(p.dtype == torch.float32 for p in full.model.parameters())
    latents = torch.randn(1, 64, 3)
    assert torch.equal(full.acoustic_decoder(latents).audio, compact.acoustic_decoder(latents).audio)
    embeds = torch.randn(1, 5, 64)
    assert torch.equal(full.language_model(inputs_embeds=embeds).last_hidden_state,
                       compact.language_model(inputs_embeds=embeds).last_hidden_state)


def with_upstream_encoder(src, dst, drop: int = 0):
    """The tiny realtime checkpoint plus the acoustic encoder tensors that upstream's own save_pretrained
    writes (names and shapes recorded from it in upstream_realtime_encoder.json), random values."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    recorded = json.loads((Path(__file__).parent / "upstream_realtime_encoder.json").read_text())
    checkpoint = copy_checkpoint(src, dst)
    tensors = load_file(checkpoint / "model.safetensors")
    g = torch.Generator().manual_seed(1)
    for name, shape in list(recorded["tensors"].items())[drop:]:
        tensors[name] = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
    save_file(tensors, checkpoint / "model.safetensors", metadata={"format": "pt"})
    return checkpoint, recorded


@torch.no_grad()
def test_a_realtime_checkpoint_as_upstream_saves_it_loads_with_its_encoder_ignored(tiny_checkpoints, tmp_path):
    import json

    from vibevoice_onnx.checkpoints.inspect import inspect_checkpoint

    checkpoint, recorded = with_upstream_encoder(tiny_checkpoints["realtime"], tmp_path / "upstream")
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["acoustic_tokenizer_config"] == recorded["acoustic_tokenizer_config"]  # the config it was saved with
    report = inspect_checkpoint(checkpoint)
    assert report["ok"] and report["components"]["acoustic_encoder"] > 0 and report["unused_tensors"] >= 96
    assert any("as upstream's save_pretrained writes it" in note for note in report["notes"])
    hub, upstream = load_realtime(tiny_checkpoints["realtime"]), load_realtime(checkpoint)
    for (name, a), (_, b) in zip(hub.state_dict().items(), upstream.state_dict().items()):
        assert torch.equal(a, b), name  # the encoder lands nowhere; everything else is the same
    partial, _ = with_upstream_encoder(tiny_checkpoints["realtime"], tmp_path / "partial", drop=1)
    report = inspect_checkpoint(partial)
    assert not report["ok"] and report["missing"] == [next(iter(recorded["tensors"]))]
