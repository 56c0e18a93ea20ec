"""transformers-native models for the checkpoints transformers 5.23 covers (1.5B TTS, ASR in both layouts)."""

from __future__ import annotations

from transformers import (
    VibeVoiceAsrConfig, VibeVoiceAsrForConditionalGeneration, VibeVoiceConfig, VibeVoiceForConditionalGeneration,
)

from ..checkpoints.configs import ModelDims
from ..families import family
from .modules import _conv_stack_kwargs, qwen_config


def _encoder_dict(d) -> dict:
    return dict(downsampling_ratios=list(d.ratios), **_conv_stack_kwargs(d))


def build_hf_model(dims: ModelDims):
    text = qwen_config(dims.lm).to_dict()
    capabilities = family(dims.kind).capabilities
    if capabilities.long_form:
        h = dims.head
        config = VibeVoiceConfig(
            # Large's head is its own tensor: the default (tied) would overwrite it with the embedding (trap 11.9.1)
            tie_word_embeddings=dims.lm.tied_embeddings,
            text_config=text,
            audio_config=_encoder_dict(dims.acoustic_encoder),
            semantic_model_config=_encoder_dict(dims.semantic_encoder),
            diffusion_head_config=dict(
                hidden_size=h.hidden, latent_size=h.latent, num_hidden_layers=h.layers,
                intermediate_size=h.ffn, rms_norm_eps=h.eps,
            ),
        )
        return VibeVoiceForConditionalGeneration(config)
    if capabilities.transcribes:
        config = VibeVoiceAsrConfig(
            tie_word_embeddings=dims.lm.tied_embeddings,  # ASR-Streaming 1.5B: the head is the embedding
            text_config=text,
            acoustic_tokenizer_encoder_config=_encoder_dict(dims.acoustic_encoder),
            semantic_tokenizer_encoder_config=_encoder_dict(dims.semantic_encoder),
        )
        return VibeVoiceAsrForConditionalGeneration(config)
    raise ValueError(f"no transformers-native model for kind {dims.kind}")
