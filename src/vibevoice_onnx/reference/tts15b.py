"""The VibeVoice-1.5B reference: transformers' own VibeVoiceForConditionalGeneration, loaded strictly, and the
shared generation loop (generation/tts15b.py) run on its modules in fp32.

transformers' generate differs from upstream's original code in ways that matter here (it does not zero the
conv states at `<|vision_end|>`, and it pads voice samples to whole frames before encoding), so the loop is
ours and the model's modules are called one by one, upstream's way: the voice batch through the acoustic
encoder with upstream's padding, the decoder and the semantic encoder with explicit streaming states.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

from ..checkpoints.checkpoint import Checkpoint
from ..checkpoints.configs import LONG_FORM_KINDS, ModelDims
from ..errors import CheckpointError
from ..generation.common import Steering, whole_head_at
from ..generation.tts15b import LongFormResult, SeparateStreams, TokenIds, long_form_frames, prompt_embeddings
from ..sampling import NoiseSource
from ..script import Prompt
from .modules import ConvState, UpstreamPadding, as_tensor, conv_state_specs


class Tts15bReference:
    """The loaded transformers model with the dims the loop needs."""

    def __init__(self, model, dims: ModelDims):
        self.model, self.dims = model.eval(), dims
        self.parts = model.model  # language_model, audio_tower, semantic_tokenizer_encoder, connectors, head

    @property
    def language_model(self):
        return self.parts.language_model

    @property
    def acoustic_encoder(self):
        return self.parts.audio_tower.encoder

    @property
    def acoustic_decoder(self):
        return self.parts.audio_tower.decoder

    @property
    def semantic_encoder(self):
        return self.parts.semantic_tokenizer_encoder


LM_LAYERS = "model.language_model.layers."  # Large: 6.5 of its 9.3 B parameters (and 0.5 in its head)


def _opened(source: Checkpoint | Path) -> Checkpoint:
    """The checkpoint opened (once), refused unless it is of a kind this reference loads."""
    checkpoint = Checkpoint.open(source)
    dims = checkpoint.dims
    if dims.kind not in LONG_FORM_KINDS:
        raise CheckpointError(f"{checkpoint.root}: is a {dims.kind} checkpoint, not {' or '.join(LONG_FORM_KINDS)}")
    return checkpoint


def load_tts15b(checkpoint: Checkpoint | Path, compact: bool = False) -> Tts15bReference:
    """The strict reference of a 1.5B or Large checkpoint; `compact` keeps the large weights in their stored
    bf16 and computes in fp32 (same numbers, half the memory: verify runs it beside the bundle's sessions)."""
    from .loading import load_transformers_model

    checkpoint = _opened(checkpoint)
    return Tts15bReference(load_transformers_model(checkpoint, compact), checkpoint.dims)


def load_tts15b_skeleton(checkpoint: Checkpoint | Path) -> Tts15bReference:
    """The reference with the LM's layers left in the shards (placeholders, see loading.load_skeleton) and
    `deferred` saying where each is stored: what a memory-bounded build traces and streams."""
    from .loading import load_skeleton

    checkpoint = _opened(checkpoint)
    model, deferred = load_skeleton(checkpoint, lambda target: target.startswith(LM_LAYERS) or target == "lm_head.weight")
    reference = Tts15bReference(model, checkpoint.dims)
    reference.deferred = deferred
    return reference


def load_tts15b_layer_streamed(checkpoint: Checkpoint | Path) -> Tts15bReference:
    """The exact fp32 reference of a model too large to hold: its LM layers read from the shards as they run."""
    from .loading import stream_layers

    reference = load_tts15b_skeleton(checkpoint)
    stream_layers(reference.model, reference.deferred, [f"{LM_LAYERS}{i}" for i in range(reference.dims.lm.layers)])
    head = reference.model.lm_head.weight  # the loop indexes its rows (no forward to hook): held, in fp32
    if "lm_head.weight" in reference.deferred:
        head.data = reference.deferred["lm_head.weight"].read().to(torch.float32)
    else:  # tied (1.5B): the embedding's rows
        head.data = reference.parts.language_model.embed_tokens.weight.data
    return reference


class TorchGuidedLm(SeparateStreams):
    """Both CFG streams as upstream runs them (generation.tts15b.SeparateStreams) on PyTorch's LM."""

    def new_cache(self):
        return DynamicCache()

    def forward(self, embeds: np.ndarray, cache, start: int):
        """The last position's hidden state, and the cache (grown in place here)."""
        positions = torch.arange(start, start + embeds.shape[1])[None]
        out = self.lm(inputs_embeds=as_tensor(embeds), position_ids=positions, past_key_values=cache, use_cache=True)
        return out.last_hidden_state[:, -1].numpy(), cache


class TorchTts15bBackend:
    def __init__(self, reference: Tts15bReference):
        self.ref, parts = reference, reference.parts
        self.parts = parts
        self.max_positions = reference.dims.lm.max_positions
        self.train_steps = reference.dims.head.train_steps
        self.voice_std = reference.dims.acoustic_encoder.sample_std

    def embed(self, ids):
        return self.parts.language_model.embed_tokens(torch.tensor([list(ids)])).numpy()

    def choice_logits(self, hidden, ids):
        return (self.ref.model.lm_head.weight[ids] @ as_tensor(hidden)[0]).numpy()

    def guided_lm(self, planned=None):  # transformers' DynamicCache grows as it goes
        return TorchGuidedLm(self.parts.language_model)

    def velocity(self, noisy, timesteps, conditions):
        return self.parts.diffusion_head(as_tensor(noisy), as_tensor(timesteps), as_tensor(conditions)).numpy()

    def head_at(self, conditions, timesteps):
        return whole_head_at(self.velocity, conditions)

    def encode_voices(self, audio):
        return self.ref.acoustic_encoder(as_tensor(audio), padding_cache=UpstreamPadding()).latents.numpy()

    def connect_acoustic(self, latents):
        return self.parts.multi_modal_projector(as_tensor(latents)).numpy()

    def connect_semantic(self, features):
        return self.parts.semantic_connector(as_tensor(features)).numpy()

    def scale(self, latents):
        return ((as_tensor(latents) + self.parts.latent_bias_factor) * self.parts.latent_scaling_factor).numpy()

    def unscale(self, latents):
        return (as_tensor(latents) / self.parts.latent_scaling_factor - self.parts.latent_bias_factor).numpy()

    def new_decoder_state(self):
        return ConvState.zeros(conv_state_specs(self.ref.acoustic_decoder))

    def decode_frames(self, latent, state):
        return self.ref.acoustic_decoder(as_tensor(latent).transpose(1, 2), padding_cache=state).audio[0, 0].numpy(), state

    def new_semantic_state(self):
        return ConvState.zeros(conv_state_specs(self.ref.semantic_encoder))

    def encode_semantic(self, chunk, state):
        features = self.ref.semantic_encoder(as_tensor(chunk)[None, None], padding_cache=state).latents
        return features.numpy(), state


@torch.no_grad()
def generate(reference: Tts15bReference, prompt: Prompt, voices: list[np.ndarray], ids: TokenIds, noise: NoiseSource,
             cfg_scale: float = 1.3, steps: int = 10, max_frames: int | None = None, voice_rng=None,
             choose=None, max_steps: int | None = None, result: LongFormResult | None = None,
             steering: Steering | None = None) -> LongFormResult:
    backend = TorchTts15bBackend(reference)
    result = LongFormResult() if result is None else result
    embeds = prompt_embeddings(backend, prompt, voices, voice_rng)
    for _ in long_form_frames(backend, embeds, ids, noise, cfg_scale, steps, max_frames, result, choose, max_steps,
                              steering=steering):
        pass
    return result
