"""The VibeVoice-ASR reference: transformers' VibeVoiceAsrForConditionalGeneration (either hub layout, loaded
strictly), its modules called one by one in fp32 by the shared loop (generation/asr.py), with upstream's
non-streaming padding in the encoders (transformers' own generate pads the waveform to whole frames and
always streams, which can differ from upstream in the last frame)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

from ..checkpoints.checkpoint import Checkpoint
from ..checkpoints.configs import ModelDims
from ..errors import CheckpointError
from ..families import family
from ..generation.common import LmStream
from .modules import ConvState, UpstreamPadding, as_tensor, conv_state_specs


class AsrReference:
    """The loaded model with the dims the loop and the export need; also the loop's torch backend (no grad)."""

    def __init__(self, model, dims: ModelDims):
        self.model, self.dims = model.eval(), dims
        self.parts = model.model  # language_model, acoustic/semantic_tokenizer_encoder, multi_modal_projector
        self.acoustic_std = dims.acoustic_encoder.sample_std

    @torch.no_grad()
    def embed(self, ids):
        return self.parts.language_model.embed_tokens(torch.as_tensor(np.asarray(ids))[None]).numpy()

    @torch.no_grad()
    def encode(self, audio):
        audio = as_tensor(audio)
        acoustic = self.parts.acoustic_tokenizer_encoder(audio, padding_cache=UpstreamPadding()).latents
        semantic = self.parts.semantic_tokenizer_encoder(audio, padding_cache=UpstreamPadding()).latents
        return acoustic.numpy(), semantic.numpy()

    def encoder_stream(self):
        """Both encoders fed segment after segment with their conv states (upstream's long-audio path)."""
        encoders = (self.parts.acoustic_tokenizer_encoder, self.parts.semantic_tokenizer_encoder)
        states = [ConvState.zeros(conv_state_specs(e), pad_to_stride=True) for e in encoders]

        @torch.no_grad()
        def step(segment):
            chunk = as_tensor(segment)
            return tuple(e(chunk, padding_cache=state).latents.numpy() for e, state in zip(encoders, states))

        return step

    @torch.no_grad()
    def connect(self, acoustic, semantic):
        return self.parts.multi_modal_projector(as_tensor(acoustic), as_tensor(semantic)).numpy()

    def lm_stream(self, positions: int = 0) -> LmStream:  # a DynamicCache grows by itself
        @torch.no_grad()
        def run(embeds, positions, cache):
            out = self.parts.language_model(inputs_embeds=as_tensor(embeds), position_ids=torch.from_numpy(positions),
                                            past_key_values=cache, use_cache=True)
            return out.last_hidden_state.numpy(), cache

        def truncate(cache, length):
            removed = cache.get_seq_length() - length
            if removed:  # a negative count: the tokens to remove, in old and new transformers alike
                cache.crop(-removed)
            return cache

        return LmStream(run, DynamicCache(), 0, truncate)

    @torch.no_grad()
    def logits(self, hidden):
        return self.model.lm_head(as_tensor(hidden)).numpy()[0]


LM_WEIGHTS = ("model.language_model.layers.", "lm_head.")  # 7.6 of the 8.3 B parameters at full size


def _opened(source: Checkpoint | Path) -> Checkpoint:
    """The checkpoint opened (once), refused unless it is of a kind this reference loads."""
    checkpoint = Checkpoint.open(source)
    dims = checkpoint.dims
    if not family(dims.kind).capabilities.transcribes:
        raise CheckpointError(f"{checkpoint.root}: is a {dims.kind} checkpoint, not asr, asr-hf or asr-streaming")
    return checkpoint


def load_asr(checkpoint: Checkpoint | Path, compact: bool = False) -> AsrReference:
    from .loading import load_transformers_model

    checkpoint = _opened(checkpoint)
    return AsrReference(load_transformers_model(checkpoint, compact), checkpoint.dims)


def load_asr_skeleton(checkpoint: Checkpoint | Path) -> AsrReference:
    """The reference with the LM's layers and head left in the shards (placeholders, see load_skeleton);
    `deferred` says where each of those weights is stored."""
    from .loading import load_skeleton

    checkpoint = _opened(checkpoint)
    model, deferred = load_skeleton(checkpoint, lambda target: target.startswith(LM_WEIGHTS))
    reference = AsrReference(model, checkpoint.dims)
    reference.deferred = deferred
    return reference


def load_asr_layer_streamed(checkpoint: Checkpoint | Path) -> AsrReference:
    """The fp32 reference for a model that cannot be held: the LM's layers and head streamed from the shards
    as they run (see loading.stream_layers), the encoders and the embedding in memory."""
    from .loading import stream_layers

    reference = load_asr_skeleton(checkpoint)
    stream_layers(reference.model, reference.deferred,
                  [f"model.language_model.layers.{i}" for i in range(reference.dims.lm.layers)] + ["lm_head"])
    return reference
