"""The tensor layout of each checkpoint kind: every hub key with its shape, component and initialisation.

One description serves three users, so they cannot disagree: the synthetic factory writes exactly these
tensors, `inspect` compares a real checkpoint against them, and the loaders rename them into PyTorch modules.
Shapes come from the checkpoint's own config (see configs.py), never from constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import CheckpointError
from ..families import family, load
from .configs import ConvStackDims, HeadDims, ModelDims, QwenDims

# How the synthetic factory initialises a tensor (see synthetic.py). Anything a zero or 1e-6 init would make
# trivial upstream (adaLN modulation, final layers, layer-scale gammas, norms) gets a non-degenerate init.
LINEAR, CONV, EMBEDDING, NORM, BIAS, LAYER_SCALE, SCALING, SHIFT, EOS_BIAS, WAVEFORM = (
    "linear", "conv", "embedding", "norm", "bias", "layer_scale", "scaling", "shift", "eos_bias", "waveform",
)
TIED = "tied"  # a copy of the LM's token embedding (a hub file that stores its tied head byte for byte)
EMBED_TOKENS = "model.language_model.embed_tokens.weight"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    component: str
    init: str
    used: bool = True  # False: present in the hub file but never read at inference (kept for strictness)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Layout:
    dims: ModelDims
    tensors: tuple[TensorSpec, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def kind(self) -> str:
        return self.dims.kind

    def by_name(self) -> dict[str, TensorSpec]:
        return {t.name: t for t in self.tensors}

    @property
    def parameters(self) -> int:
        return sum(t.numel for t in self.tensors)

    def components(self) -> dict[str, int]:
        """Parameter count per component, in layout order."""
        counts: dict[str, int] = {}
        for t in self.tensors:
            counts[t.component] = counts.get(t.component, 0) + t.numel
        return counts


def _qwen_layers(prefix: str, q: QwenDims, component: str, *, embed_used=True, norm=True) -> list[TensorSpec]:
    kv = q.kv_heads * q.head_dim
    attn = q.heads * q.head_dim
    specs = [TensorSpec(f"{prefix}embed_tokens.weight", (q.vocab, q.hidden), component, EMBEDDING, embed_used)]
    for i in range(q.layers):
        p = f"{prefix}layers.{i}."
        specs += [
            TensorSpec(p + "self_attn.q_proj.weight", (attn, q.hidden), component, LINEAR),
            TensorSpec(p + "self_attn.q_proj.bias", (attn,), component, BIAS),
            TensorSpec(p + "self_attn.k_proj.weight", (kv, q.hidden), component, LINEAR),
            TensorSpec(p + "self_attn.k_proj.bias", (kv,), component, BIAS),
            TensorSpec(p + "self_attn.v_proj.weight", (kv, q.hidden), component, LINEAR),
            TensorSpec(p + "self_attn.v_proj.bias", (kv,), component, BIAS),
            TensorSpec(p + "self_attn.o_proj.weight", (q.hidden, attn), component, LINEAR),
            TensorSpec(p + "mlp.gate_proj.weight", (q.intermediate, q.hidden), component, LINEAR),
            TensorSpec(p + "mlp.up_proj.weight", (q.intermediate, q.hidden), component, LINEAR),
            TensorSpec(p + "mlp.down_proj.weight", (q.hidden, q.intermediate), component, LINEAR),
            TensorSpec(p + "input_layernorm.weight", (q.hidden,), component, NORM),
            TensorSpec(p + "post_attention_layernorm.weight", (q.hidden,), component, NORM),
        ]
    if norm:
        specs.append(TensorSpec(f"{prefix}norm.weight", (q.hidden,), component, NORM))
    return specs


def _conv(prefix: str, out_ch: int, in_ch: int, kernel: int, component: str, used: bool) -> list[TensorSpec]:
    return [
        TensorSpec(prefix + ".weight", (out_ch, in_ch, kernel), component, CONV, used),
        TensorSpec(prefix + ".bias", (out_ch,), component, BIAS, used),
    ]


def _block(prefix: str, ch: int, component: str, used: bool) -> list[TensorSpec]:
    """One ConvNeXt-style block (upstream names): depthwise mixer + FFN, each with RMSNorm and layer scale."""
    return [
        TensorSpec(prefix + "norm.weight", (ch,), component, NORM, used),
        TensorSpec(prefix + "ffn_norm.weight", (ch,), component, NORM, used),
        TensorSpec(prefix + "gamma", (ch,), component, LAYER_SCALE, used),
        TensorSpec(prefix + "ffn_gamma", (ch,), component, LAYER_SCALE, used),
        *_conv(prefix + "mixer.conv.conv.conv", ch, 1, 7, component, used),
        TensorSpec(prefix + "ffn.linear1.weight", (4 * ch, ch), component, LINEAR, used),
        TensorSpec(prefix + "ffn.linear1.bias", (4 * ch,), component, BIAS, used),
        TensorSpec(prefix + "ffn.linear2.weight", (ch, 4 * ch), component, LINEAR, used),
        TensorSpec(prefix + "ffn.linear2.bias", (ch,), component, BIAS, used),
    ]


def conv_encoder(prefix: str, d: ConvStackDims, component: str, used: bool = True) -> list[TensorSpec]:
    channels = d.encoder_channels()
    specs = _conv(f"{prefix}downsample_layers.0.0.conv.conv", channels[0], 1, 7, component, used)
    for i, ratio in enumerate(d.ratios, start=1):
        specs += _conv(f"{prefix}downsample_layers.{i}.0.conv.conv", channels[i], channels[i - 1], 2 * ratio, component, used)
    for i, depth in enumerate(d.depths):
        for j in range(depth):
            specs += _block(f"{prefix}stages.{i}.{j}.", channels[i], component, used)
    specs += _conv(f"{prefix}head.conv.conv", d.vae_dim, channels[-1], 7, component, used)
    return specs


def conv_decoder(prefix: str, d: ConvStackDims, component: str, used: bool = True) -> list[TensorSpec]:
    channels = d.decoder_channels()
    specs = _conv(f"{prefix}upsample_layers.0.0.conv.conv", channels[0], d.vae_dim, 7, component, used)
    for i, ratio in enumerate(d.ratios, start=1):
        # ConvTranspose1d weights are [in, out, k].
        specs += [
            TensorSpec(f"{prefix}upsample_layers.{i}.0.convtr.convtr.weight", (channels[i - 1], channels[i], 2 * ratio), component, CONV, used),
            TensorSpec(f"{prefix}upsample_layers.{i}.0.convtr.convtr.bias", (channels[i],), component, BIAS, used),
        ]
    for i, depth in enumerate(d.depths):
        for j in range(depth):
            specs += _block(f"{prefix}stages.{i}.{j}.", channels[i], component, used)
    # The waveform head gets a small init so random decoders produce audio-range samples, not ±10.
    specs += [
        TensorSpec(f"{prefix}head.conv.conv.weight", (1, channels[-1], 7), component, WAVEFORM, used),
        TensorSpec(f"{prefix}head.conv.conv.bias", (1,), component, WAVEFORM, used),
    ]
    return specs


def _connector(prefix: str, in_dim: int, hidden: int, component: str) -> list[TensorSpec]:
    return [
        TensorSpec(prefix + "fc1.weight", (hidden, in_dim), component, LINEAR),
        TensorSpec(prefix + "fc1.bias", (hidden,), component, BIAS),
        TensorSpec(prefix + "norm.weight", (hidden,), component, NORM),
        TensorSpec(prefix + "fc2.weight", (hidden, hidden), component, LINEAR),
        TensorSpec(prefix + "fc2.bias", (hidden,), component, BIAS),
    ]


def _prediction_head(prefix: str, h: HeadDims) -> list[TensorSpec]:
    c = "prediction_head"
    specs = [
        TensorSpec(prefix + "noisy_images_proj.weight", (h.hidden, h.latent), c, LINEAR),
        TensorSpec(prefix + "cond_proj.weight", (h.hidden, h.hidden), c, LINEAR),
        TensorSpec(prefix + "t_embedder.mlp.0.weight", (h.hidden, 256), c, LINEAR),
        TensorSpec(prefix + "t_embedder.mlp.2.weight", (h.hidden, h.hidden), c, LINEAR),
    ]
    for i in range(h.layers):
        p = f"{prefix}layers.{i}."
        specs += [
            TensorSpec(p + "ffn.gate_proj.weight", (h.ffn, h.hidden), c, LINEAR),
            TensorSpec(p + "ffn.up_proj.weight", (h.ffn, h.hidden), c, LINEAR),
            TensorSpec(p + "ffn.down_proj.weight", (h.hidden, h.ffn), c, LINEAR),
            TensorSpec(p + "norm.weight", (h.hidden,), c, NORM),
            TensorSpec(p + "adaLN_modulation.1.weight", (3 * h.hidden, h.hidden), c, LINEAR),
        ]
    specs += [
        TensorSpec(prefix + "final_layer.adaLN_modulation.1.weight", (2 * h.hidden, h.hidden), c, LINEAR),
        TensorSpec(prefix + "final_layer.linear.weight", (h.latent, h.hidden), c, LINEAR),
    ]
    return specs


def _scalars() -> list[TensorSpec]:
    return [
        TensorSpec("model.speech_scaling_factor", (), "scaling_factors", SCALING),
        TensorSpec("model.speech_bias_factor", (), "scaling_factors", SHIFT),
    ]


REALTIME_ENCODER = "model.acoustic_tokenizer.encoder."


def realtime_layout(d: ModelDims, stored: set[str] | None = None, with_encoder: bool | None = None) -> Layout:
    """The hub layout; `with_encoder` (by default: whether `stored`, the checkpoint's names, hold any of it): as
    upstream's own save_pretrained writes it, which adds the acoustic encoder (its model always builds the whole
    acoustic tokenizer), present and unused."""
    if with_encoder is None:
        with_encoder = stored is not None and any(n.startswith(REALTIME_ENCODER) for n in stored)
    h = d.lm.hidden
    encoder = []
    if with_encoder:
        if d.acoustic_encoder is None:
            raise CheckpointError("the checkpoint holds an acoustic encoder, but its acoustic_tokenizer_config does "
                                  "not describe one (no encoder_depths)")
        encoder = conv_encoder(REALTIME_ENCODER, d.acoustic_encoder, "acoustic_encoder", used=False)
    tensors = [
        *_qwen_layers("model.language_model.", d.lm, "language_model", norm=False),
        *_qwen_layers("model.tts_language_model.", d.tts_lm, "tts_language_model", embed_used=False),
        TensorSpec("model.tts_input_types.weight", (2, h), "tts_input_types", EMBEDDING),
        *_connector("model.acoustic_connector.", d.acoustic_decoder.vae_dim, h, "acoustic_connector"),
        *_prediction_head("model.prediction_head.", d.head),
        *encoder,
        *conv_decoder("model.acoustic_tokenizer.decoder.", d.acoustic_decoder, "acoustic_decoder"),
        *_scalars(),
        TensorSpec("tts_eos_classifier.fc1.weight", (h, h), "tts_eos_classifier", LINEAR),
        TensorSpec("tts_eos_classifier.fc1.bias", (h,), "tts_eos_classifier", BIAS),
        TensorSpec("tts_eos_classifier.fc2.weight", (1, h), "tts_eos_classifier", LINEAR),
        TensorSpec("tts_eos_classifier.fc2.bias", (1,), "tts_eos_classifier", EOS_BIAS),
    ]
    notes = (
        f"config says {d.configured_layers} layers; they run as two models: language_model "
        f"{d.lm.layers} layers without final norm (text only) + tts_language_model {d.tts_lm.layers} layers with "
        "its own norm, separate KV caches and position counters",
        "tts_language_model.embed_tokens is present but never used",
        "acoustic encoder present (as upstream's save_pretrained writes it) but never used: voices come only from presets"
        if with_encoder else "no acoustic encoder: voices come only from presets",
    )
    return Layout(d, tuple(tensors), notes)


def _upstream_audio_parts(d: ModelDims, decoder_used: bool) -> list[TensorSpec]:
    return [
        *conv_encoder("model.acoustic_tokenizer.encoder.", d.acoustic_encoder, "acoustic_encoder"),
        *conv_decoder("model.acoustic_tokenizer.decoder.", d.acoustic_decoder, "acoustic_decoder", used=decoder_used),
        *conv_encoder("model.semantic_tokenizer.encoder.", d.semantic_encoder, "semantic_encoder"),
        *_connector("model.acoustic_connector.", d.acoustic_encoder.vae_dim, d.lm.hidden, "acoustic_connector"),
        *_connector("model.semantic_connector.", d.semantic_encoder.vae_dim, d.lm.hidden, "semantic_connector"),
    ]


def tts_1p5b_layout(d: ModelDims, stored: set[str] | None = None) -> Layout:
    tensors = [
        *_qwen_layers("model.language_model.", d.lm, "language_model"),
        *_upstream_audio_parts(d, decoder_used=True),
        *_prediction_head("model.prediction_head.", d.head),
        *_scalars(),
    ]
    return Layout(d, tuple(tensors), ("lm_head is tied to language_model.embed_tokens (no tensor)",))


def large_layout(d: ModelDims, stored: set[str] | None = None) -> Layout:
    """VibeVoice-Large: the 1.5B's tensors plus the untied head at the top level (facts sheet 11.4)."""
    tts = tts_1p5b_layout(d).tensors
    lm = [t for t in tts if t.component == "language_model"]
    head = TensorSpec("lm_head.weight", (d.lm.vocab, d.lm.hidden), "lm_head", LINEAR)
    return Layout(d, (*lm, head, *tts[len(lm):]), ("lm_head is untied: its rows give the segment and EOS decisions",))


def asr_codes_layout(d: ModelDims, stored: set[str] | None = None) -> Layout:
    tensors = [
        TensorSpec("lm_head.weight", (d.lm.vocab, d.lm.hidden), "lm_head", LINEAR),
        *_qwen_layers("model.language_model.", d.lm, "language_model"),
        *_upstream_audio_parts(d, decoder_used=False),
    ]
    return Layout(d, tuple(tensors), ("model.acoustic_tokenizer.decoder.* is present but unused by ASR",))


def asr_streaming_layout(d: ModelDims, stored: set[str] | None = None) -> Layout:
    """VibeVoice-ASR-Streaming: the codes-layout ASR tensors (facts sheet 12.4). The 1.5B ships an lm_head
    although its config ties the head to the embedding, which upstream then uses: present, never read."""
    tied = d.lm.tied_embeddings
    tensors = [TensorSpec(t.name, t.shape, t.component, t.init, used=not (tied and t.name == "lm_head.weight"))
               for t in asr_codes_layout(d).tensors]
    notes = ("model.acoustic_tokenizer.decoder.* is present but unused by ASR",
             "lm_head.weight is present but unused: the config ties the head to the token embedding, as upstream "
             "computes the logits" if tied else "lm_head is untied: its own tensor gives the logits")
    return Layout(d, tuple(tensors), notes)


def asr_bitnet_layout(d: ModelDims, stored: set[str] | None = None) -> Layout:
    """VibeVoice-ASR-BitNet (docs/bitnet.md): the codes-layout ASR tensors, all F32; its lm_head is the embedding
    byte for byte and its config ties the head, so the tensor is present and never read."""
    lm = _qwen_layers("model.language_model.", d.lm, "language_model")
    head = TensorSpec("lm_head.weight", (d.lm.vocab, d.lm.hidden), "lm_head", TIED, used=False)
    notes = ("model.acoustic_tokenizer.decoder.* is present but unused by ASR",
             "lm_head.weight is present but unused: a copy of the token embedding, to which the config ties the head",
             "the q/k/v/o/gate/up/down projections hold latent weights, ternarized at load (one scale per tensor)")
    return Layout(d, (*lm, head, *_upstream_audio_parts(d, decoder_used=False)), notes)


def asr_hf_layout(d: ModelDims, stored: set[str] | None = None) -> Layout:
    from .names import upstream_encoder_to_hf

    def encoder(hf_prefix: str, dims: ConvStackDims, component: str) -> list[TensorSpec]:
        upstream = conv_encoder("", dims, component)
        return [TensorSpec(hf_prefix + upstream_encoder_to_hf(t.name), t.shape, t.component, t.init) for t in upstream]

    h = d.lm.hidden
    projector = []
    for modality, dims in (("acoustic", d.acoustic_encoder), ("semantic", d.semantic_encoder)):
        p = f"model.multi_modal_projector.{modality}_"
        comp = f"{modality}_connector"
        projector += [
            TensorSpec(p + "linear_1.weight", (h, dims.vae_dim), comp, LINEAR),
            TensorSpec(p + "linear_1.bias", (h,), comp, BIAS),
            TensorSpec(p + "norm.weight", (h,), comp, NORM),
            TensorSpec(p + "linear_2.weight", (h, h), comp, LINEAR),
            TensorSpec(p + "linear_2.bias", (h,), comp, BIAS),
        ]
    tensors = [
        TensorSpec("lm_head.weight", (d.lm.vocab, h), "lm_head", LINEAR),
        *_qwen_layers("model.language_model.", d.lm, "language_model"),
        *encoder("model.acoustic_tokenizer_encoder.", d.acoustic_encoder, "acoustic_encoder"),
        *encoder("model.semantic_tokenizer_encoder.", d.semantic_encoder, "semantic_encoder"),
        *projector,
    ]
    return Layout(d, tuple(tensors), ("transformers-native layout: untied lm_head, encoders only, no decoder",))


def layout_for(d: ModelDims, stored: set[str] | None = None) -> Layout:
    """The layout of a kind (its family's `layout`); `stored` (the checkpoint's normalised names) picks a variant
    where a kind has two (see realtime_layout)."""
    return load(family(d.kind).layout)(d, stored)
