"""The 1.5B loop and prompt against an independent, line-by-line transcription of upstream's original code.

The reference and the runtime both run generation/tts15b.py and script.py, so the closed-loop gate cannot
see a mistake there. This test rewrites upstream's processor (`_parse_script`, `_create_voice_prompt`,
`_process_single`) and `generate` (commit d5895e7) from scratch with the raw transformers modules: the
negative stream kept as upstream keeps it (one growing cache whose old entries the attention mask hides
after a `<|vision_start|>`, positions from the mask's cumulative sum), the voice batch encoded with
upstream's per-conv "extra padding" formula, transformers' own streaming conv caches zeroed at
`<|vision_end|>`, and diffusers' scheduler stepping upstream's two-row sample.
"""

import math
import re

import numpy as np
import pytest
import torch
from diffusers import DPMSolverMultistepScheduler
from transformers.cache_utils import DynamicCache
from transformers.models.vibevoice_acoustic_tokenizer.modeling_vibevoice_acoustic_tokenizer import (
    VibeVoiceAcousticTokenizerConv1dPaddingCache,
)

from vibevoice_onnx.generation.tts15b import TokenIds
from vibevoice_onnx.reference.tts15b import generate, load_tts15b
from vibevoice_onnx.sampling import NoiseSource
from vibevoice_onnx.script import build_prompt, parse_script
from vibevoice_onnx.text import load_tokenizer
from vibevoice_onnx.verify.tts15b import synthetic_voices

SCRIPT = "speaker 1:  Hello there, how are you?\nSpeaker 2: Fine, thanks.\nSpeaker 1: Good to hear."


def upstream_prompt(tokenizer, script: str, voices):
    enc = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    start, end, pad = (tokenizer.token_to_id(t) for t in ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>"))
    parsed = []
    for line in script.strip().split("\n"):
        match = re.match(r"^Speaker\s+(\d+)\s*:\s*(.*)$", line.strip(), re.IGNORECASE)
        parsed.append((int(match.group(1)), " " + match.group(2).strip()))
    if min(s for s, _ in parsed) > 0:
        parsed = [(s - 1, t) for s, t in parsed]
    tokens = enc(" Transform the text provided by various speakers into speech output, utilizing the distinct voice "
                 "of each respective speaker.\n")
    mask = [False] * len(tokens)
    tokens += enc(" Voice input:\n")
    mask += [False] * len(enc(" Voice input:\n"))
    for speaker_id, wav in enumerate(voices):
        prefix = enc(f" Speaker {speaker_id}:")
        n = math.ceil(wav.shape[0] / 3200)
        tokens += prefix + [start] + [pad] * n + [end] + enc("\n")
        mask += [False] * len(prefix) + [False] + [True] * n + [False] + [False]
    tokens += enc(" Text input:\n")
    mask += [False] * len(enc(" Text input:\n"))
    for speaker_id, text in parsed:
        line = enc(f" Speaker {speaker_id}:{text}\n")
        tokens += line
        mask += [False] * len(line)
    tokens += enc(" Speech output:\n") + [start]
    mask += [False] * (len(enc(" Speech output:\n")) + 1)
    return tokens, mask


class ExtraPadding:
    """Upstream's SConv1d non-streaming padding, transcribed: get_extra_padding_for_conv1d, then pad1d."""

    def update(self, x, key, module):
        kernel, stride = module.conv.kernel_size[0], module.conv.stride[0]
        padding_total = (kernel - 1) * module.conv.dilation[0] - (stride - 1)
        length = x.shape[-1]
        n_frames = (length - kernel + padding_total) / stride + 1
        ideal_length = (math.ceil(n_frames) - 1) * stride + (kernel - padding_total)
        return torch.nn.functional.pad(x, (padding_total, ideal_length - length))


def set_to_zero(cache):
    for layer in cache.layers.values():
        if layer.is_initialized:
            layer.cache.zero_()


@torch.no_grad()
def upstream_generate(model, tokens, speech_mask, voices, ids: TokenIds, noise, cfg, steps, force, max_steps):
    parts = model.model
    batch = np.zeros((len(voices), max(len(v) for v in voices)), np.float32)
    for i, v in enumerate(voices):
        batch[i, : len(v)] = v
    mean = parts.audio_tower.encoder(torch.from_numpy(batch)[:, None], padding_cache=ExtraPadding()).latents
    features = (mean + parts.latent_bias_factor) * parts.latent_scaling_factor
    speech_masks = torch.zeros(features.shape[:2], dtype=torch.bool)
    for i, v in enumerate(voices):
        speech_masks[i, : math.ceil(len(v) / 3200)] = True
    embeds = parts.language_model.embed_tokens(torch.tensor([tokens]))
    embeds[torch.tensor([speech_mask])] = parts.multi_modal_projector(features)[speech_masks]

    scheduler = DPMSolverMultistepScheduler(num_train_timesteps=1000, beta_schedule="squaredcos_cap_v2",
                                            prediction_type="v_prediction")
    acoustic_cache, semantic_cache = VibeVoiceAcousticTokenizerConv1dPaddingCache(), VibeVoiceAcousticTokenizerConv1dPaddingCache()
    positive, negative = DynamicCache(), DynamicCache()
    positive_length = 0
    negative_mask = torch.ones(1, 1, dtype=torch.long)  # one slot ahead of the cache, as generate keeps it
    negative_input = parts.language_model.embed_tokens(torch.tensor([[ids.start]]))
    inputs_embeds, out_tokens, latents, audio = None, [], [], []
    for step in range(max_steps):
        current = embeds if inputs_embeds is None else inputs_embeds
        hidden = parts.language_model(inputs_embeds=current, past_key_values=positive, use_cache=True,
                                      position_ids=torch.arange(positive_length, positive_length + current.shape[1])[None]).last_hidden_state
        positive_length += current.shape[1]
        logits = model.lm_head(hidden[:, -1])[0]
        allowed = torch.full_like(logits, float("-inf"))
        allowed[[ids.start, ids.end, ids.pad, ids.eos]] = 0
        token = force(step, int(torch.argmax(logits + allowed)))
        out_tokens.append(token)
        if token == ids.eos:
            break
        if token == ids.end:
            set_to_zero(acoustic_cache)
            set_to_zero(semantic_cache)
        if token == ids.start:
            negative_mask[:, :] = 0
            negative_mask[:, -1] = 1
            for layer in negative.layers:
                if layer.keys is not None and layer.keys.numel():
                    layer.keys[:, :, -1] = layer.keys[:, :, 0].clone()
                    layer.values[:, :, -1] = layer.values[:, :, 0].clone()
        next_embeds = parts.language_model.embed_tokens(torch.tensor([[token]]))
        if token == ids.pad:
            fed = negative_input if inputs_embeds is None else inputs_embeds
            positions = (negative_mask.cumsum(-1) - 1).masked_fill(negative_mask == 0, 1)[:, -1:]
            negative_hidden = parts.language_model(inputs_embeds=fed, attention_mask=negative_mask, position_ids=positions,
                                                   past_key_values=negative, use_cache=True).last_hidden_state
            negative_mask = torch.cat([negative_mask, torch.ones(1, 1, dtype=torch.long)], dim=-1)
            scheduler.set_timesteps(steps)
            condition = torch.cat([hidden[:, -1], negative_hidden[:, -1]])
            speech = torch.stack([torch.from_numpy(noise(len(latents))), torch.zeros(64)])  # row 1: upstream's unused row
            for t in scheduler.timesteps:
                half = speech[:1]
                eps = parts.diffusion_head(torch.cat([half, half]), t.repeat(2).to(half), condition)
                cond_eps, uncond_eps = eps.split(1)
                half_eps = uncond_eps + cfg * (cond_eps - uncond_eps)
                speech = scheduler.step(torch.cat([half_eps, half_eps]), t, speech).prev_sample
            z = speech[:1][:, None]
            scaled = z / parts.latent_scaling_factor - parts.latent_bias_factor
            chunk = parts.audio_tower.decoder(scaled.transpose(1, 2), padding_cache=acoustic_cache, use_cache=True).audio
            semantic = parts.semantic_tokenizer_encoder(chunk, padding_cache=semantic_cache, use_cache=True).latents
            next_embeds = parts.multi_modal_projector(z) + parts.semantic_connector(semantic)
            latents.append(z[0, 0])
            audio.append(chunk[0, 0])
        inputs_embeds = next_embeds
    return out_tokens, torch.stack(latents).numpy(), torch.cat(audio).numpy()


@pytest.fixture(scope="module")
def reference(tiny_checkpoints):
    return load_tts15b(tiny_checkpoints["1.5b"])


def test_prompt_matches_upstreams_processor(tiny_checkpoints):
    tokenizer = load_tokenizer(tiny_checkpoints["1.5b"] / "tokenizer.json")
    voices = synthetic_voices()
    tokens, mask = upstream_prompt(tokenizer, SCRIPT, voices)
    ours = build_prompt(tokenizer, parse_script(SCRIPT), [math.ceil(len(v) / 3200) for v in voices])
    assert ours.ids == tokens
    assert ours.voice_positions == [i for i, m in enumerate(mask) if m]


@pytest.mark.parametrize("schedule", ["free", "segments"])
def test_shared_loop_matches_an_independent_transcription_of_upstream(reference, tiny_checkpoints, schedule):
    tokenizer = load_tokenizer(tiny_checkpoints["1.5b"] / "tokenizer.json")
    ids = TokenIds.from_tokenizer(tokenizer)
    voices = synthetic_voices()
    tokens, mask = upstream_prompt(tokenizer, SCRIPT, voices)
    pattern = [ids.pad] * 4 + [ids.end, ids.start] + [ids.pad] * 3 + [ids.end, ids.end, ids.start, ids.pad, ids.pad, ids.start, ids.pad]
    force = (lambda step, greedy: greedy) if schedule == "free" else (lambda step, greedy: pattern[step])
    noise = NoiseSource.from_seed(5)
    expected_tokens, expected_latents, expected_audio = upstream_generate(
        reference.model, tokens, mask, voices, ids, noise, 1.7, 6, force, len(pattern))
    prompt = build_prompt(tokenizer, parse_script(SCRIPT), [math.ceil(len(v) / 3200) for v in voices])
    ours = generate(reference, prompt, voices, ids, noise, cfg_scale=1.7, steps=6, choose=force, max_steps=len(pattern))
    assert ours.tokens == expected_tokens
    assert len(ours.latents) == len(expected_latents) >= 9
    np.testing.assert_allclose(np.stack(ours.latents), expected_latents, atol=2e-4, rtol=1e-4)
    np.testing.assert_allclose(ours.audio, expected_audio, atol=2e-4, rtol=1e-4)
