"""The realtime PyTorch reference against independent computations.

The modules come from transformers, our glue maps hub keys onto them; each check below recomputes a
component straight from the hub tensors (upstream names) with plain torch functions written from the
facts sheet, so a wrong key mapping, a swapped layer-scale or a mis-indexed stage shows up here.
"""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers.cache_utils import DynamicCache

from vibevoice_onnx.reference.modules import ConvState, conv_state_specs

from hub_formulas import connector_from_hub, decoder_from_hub, head_from_hub, rms


@pytest.fixture(scope="module")
def hub(tiny_checkpoints):
    return {k: v.float() for k, v in load_file(tiny_checkpoints["realtime"] / "model.safetensors").items()}


@torch.no_grad()
def test_diffusion_head_matches_hub_formula(realtime_reference, hub):
    g = torch.Generator().manual_seed(0)
    x, c = torch.randn(3, 64, generator=g), torch.randn(3, 64, generator=g)
    t = torch.tensor([999.0, 400.0, 17.0])
    ours = realtime_reference.predict_velocity(x, t, c)
    expected = head_from_hub(hub, x, t, c)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-4)
    assert expected.std() > 0.1  # the synthetic weights make every sub-block contribute


@torch.no_grad()
def test_connector_eos_and_scaling_match_hub_formulas(realtime_reference, hub):
    z = torch.randn(2, 1, 64, generator=torch.Generator().manual_seed(1))
    expected = connector_from_hub(hub, z, "model.acoustic_connector.")
    torch.testing.assert_close(realtime_reference.connect(z), expected, atol=1e-5, rtol=1e-5)
    hid = torch.randn(2, 64, generator=torch.Generator().manual_seed(2))
    q = "tts_eos_classifier."
    eos = torch.relu(hid @ hub[q + "fc1.weight"].T + hub[q + "fc1.bias"]) @ hub[q + "fc2.weight"].T + hub[q + "fc2.bias"]
    torch.testing.assert_close(realtime_reference.eos_logit(hid), eos, atol=1e-5, rtol=1e-5)
    scale, bias = hub["model.speech_scaling_factor"], hub["model.speech_bias_factor"]
    assert torch.isfinite(scale) and scale != 1 and bias != 0
    torch.testing.assert_close(realtime_reference.unscale(z), z / scale - bias)  # divide first, then subtract


@torch.no_grad()
def test_whole_decode_matches_hub_formula(realtime_reference, hub):
    latents = torch.randn(1, 3, 64, generator=torch.Generator().manual_seed(3))
    ours = realtime_reference.decode(latents)
    expected = decoder_from_hub(hub, latents)
    assert ours.shape == (1, 1, 3 * 3200)
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=1e-4)
    assert expected.std() > 1e-3


@torch.no_grad()
def test_streaming_decode_equals_whole_decode(realtime_reference):
    latents = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(4))
    whole = realtime_reference.decode(latents)
    specs = conv_state_specs(realtime_reference.acoustic_decoder)
    state = ConvState.zeros(specs)
    pieces = [realtime_reference.decode_stream(latents[:, i : i + 1], state) for i in range(7)]
    torch.testing.assert_close(torch.cat(pieces, dim=-1), whole, atol=1e-5, rtol=1e-5)
    # ... and in uneven chunks, with the state carried across
    state = ConvState.zeros(specs)
    chunks = [realtime_reference.decode_stream(latents[:, a:b], state) for a, b in ((0, 2), (2, 3), (3, 7))]
    torch.testing.assert_close(torch.cat(chunks, dim=-1), whole, atol=1e-5, rtol=1e-5)
    assert {s[0] for s in specs} == set(state.tensors)


@torch.no_grad()
def test_lower_lm_is_pre_norm_and_incremental_equals_prefill(realtime_reference):
    from transformers import Qwen2Model

    from vibevoice_onnx.reference.modules import qwen_config

    model = realtime_reference
    embeds = model.embed_text(torch.tensor([[5, 9, 2, 7, 11, 3]]))
    full = model.lower_step(embeds, torch.arange(6)[None], DynamicCache())
    # A stock Qwen2Model with the same layers and a final norm of weight w returns exactly rms(ours)·w.
    stock = Qwen2Model(qwen_config(model.dims.lm))
    missing, unexpected = stock.load_state_dict(model.language_model.state_dict(), strict=False)
    assert missing == ["norm.weight"] and unexpected == []
    stock.norm.weight.normal_()
    torch.testing.assert_close(rms(full, stock.norm.weight, eps=1e-6), stock(inputs_embeds=embeds).last_hidden_state, atol=1e-5, rtol=1e-4)
    cache = DynamicCache()
    first = model.lower_step(embeds[:, :4], torch.arange(4)[None], cache)
    rest = [model.lower_step(embeds[:, i : i + 1], torch.tensor([[i]]), cache) for i in (4, 5)]
    torch.testing.assert_close(torch.cat([first, *rest], dim=1), full, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_upper_lm_applies_its_final_norm(realtime_reference):
    model = realtime_reference
    embeds = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(5))
    out = model.upper_step(embeds, torch.arange(4)[None], DynamicCache())
    unweighted = out / model.tts_language_model.norm.weight
    torch.testing.assert_close(unweighted.pow(2).mean(-1), torch.ones(1, 4), atol=1e-3, rtol=1e-3)
