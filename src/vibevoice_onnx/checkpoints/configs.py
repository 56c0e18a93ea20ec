"""Read the dimensions that matter out of a checkpoint's config.json, and make synthetic configs.

Upstream ("codes") configs nest a Qwen2 `decoder_config`, `acoustic_tokenizer_config`,
`semantic_tokenizer_config` and `diffusion_head_config`; the transformers-native ASR-HF config nests
`text_config`, `acoustic_tokenizer_encoder_config` and `semantic_tokenizer_encoder_config` with other
field names. Both are normalised here (without torch) into small frozen dataclasses that the layouts, the loaders, the
exporters and the runtime share.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from ..errors import CheckpointError
from ..families import KINDS, family, kinds_that, load, recognise

# VibeVoice-ASR-Streaming (facts sheet 12): the ASR network in the codes layout with a streaming prompt and
# tokenizer; two released sizes, told apart by their LM (the 1.5B's head tied, the 7B's its own tensor).
STREAMING_VARIANTS = ("1.5b", "7b")
# Its preprocessor_config.json (12.3): the window geometry is read from it, never assumed.
PREPROCESSOR_CONFIG = "preprocessor_config.json"
STREAMING_PREPROCESSOR = {"chunk_frames": 22, "lookahead_frames": 4, "normalize_audio": False,
                          "speech_tok_compress_ratio": 3200, "target_sample_rate": 24000}
# The streaming tokenizer's added tokens past Qwen2.5's (12.5): one id higher than the non-streaming layout.
STREAMING_TOKENS = {"<|text_chunk_end|>": 151665, "<|AUDIO|>": 151666, "<|audio_bos|>": 151667, "<|audio_eos|>": 151668}
# Long-form multi-speaker TTS: VibeVoice-1.5B and VibeVoice-Large (7B), one architecture, one loop; Large's LM
# head is untied (a top-level lm_head.weight), the 1.5B's is the token embedding.
LONG_FORM_KINDS = kinds_that(long_form=True)
TTS_KINDS = kinds_that(speaks=True)

# The VibeVoice TTS and ASR repositories ship no tokenizer: theirs is Qwen2.5's, whose repository is told by the LM's
# width (the released sizes: 0.5B, 1.5B, 7B); a checkpoint of another width (a synthetic one) names it in its
# preprocessor_config.json (language_model_pretrained_name), as upstream's processors read it.
QWEN_TOKENIZERS = {896: "Qwen/Qwen2.5-0.5B", 1536: "Qwen/Qwen2.5-1.5B", 3584: "Qwen/Qwen2.5-7B"}

# The Qwen2.5 added tokens (the VibeVoice models use several, facts sheet section 8), at their real ids.
QWEN_SPECIAL_TOKENS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|object_ref_start|>": 151646,
    "<|object_ref_end|>": 151647,
    "<|box_start|>": 151648,
    "<|box_end|>": 151649,
    "<|quad_start|>": 151650,
    "<|quad_end|>": 151651,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
    "<|fim_prefix|>": 151659,
    "<|fim_middle|>": 151660,
    "<|fim_suffix|>": 151661,
    "<|fim_pad|>": 151662,
    "<|repo_name|>": 151663,
    "<|file_sep|>": 151664,
}


@dataclass(frozen=True)
class QwenDims:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rope_theta: float
    rms_eps: float
    max_positions: int
    tied_embeddings: bool


@dataclass(frozen=True)
class ConvStackDims:
    """One σ-VAE conv stack (encoder or decoder), with ratios and depths in application order."""

    vae_dim: int
    n_filters: int
    ratios: tuple[int, ...]
    depths: tuple[int, ...]
    eps: float
    sample_std: float = 0.0  # σ-VAE: std of the per-item noise scale (fix_std / 0.8 upstream, vae_std in HF); 0: the mean

    @property
    def hop(self) -> int:
        return math.prod(self.ratios)

    def encoder_channels(self) -> list[int]:
        return [self.n_filters * 2**i for i in range(len(self.depths))]

    def decoder_channels(self) -> list[int]:
        top = self.n_filters * 2 ** (len(self.depths) - 1)
        return [top // 2**i for i in range(len(self.depths))]


@dataclass(frozen=True)
class HeadDims:
    hidden: int
    layers: int
    ffn: int
    latent: int
    eps: float
    train_steps: int
    inference_steps: int
    beta_schedule: str
    prediction_type: str


@dataclass(frozen=True)
class ModelDims:
    """Everything about a checkpoint's architecture that code outside this package needs."""

    kind: str
    lm: QwenDims  # the text LM (for realtime: the lower 4-layer LM)
    configured_layers: int  # what config.json claims for the LM stack(s)
    tts_lm: QwenDims | None = None  # realtime upper LM
    acoustic_encoder: ConvStackDims | None = None
    acoustic_decoder: ConvStackDims | None = None
    semantic_encoder: ConvStackDims | None = None
    head: HeadDims | None = None
    special_tokens: tuple[tuple[str, int], ...] = ()

    @property
    def actual_layers(self) -> dict[str, int]:
        layers = {"language_model": self.lm.layers}
        if self.tts_lm is not None:
            layers["tts_language_model"] = self.tts_lm.layers
        return layers


def _need(section: dict, key: str, where: str):
    if key not in section:
        raise CheckpointError(f"config.json: {where} has no field '{key}'")
    return section[key]


def _json_type(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), f"the number {value!r}")


def _section(parent: dict, key: str, where: str) -> dict:
    value = _need(parent, key, where)
    if not isinstance(value, dict):
        raise CheckpointError(f"config.json: {key} must be a JSON object, found {_json_type(value)}")
    return value


def _whole(value, key: str, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < minimum:
        raise CheckpointError(f"config.json: {where}.{key} must be a whole number of at least {minimum}, found {_json_type(value)}")
    return int(value)


def _count(section: dict, key: str, where: str, default: int | None = None, minimum: int = 1) -> int:
    value = section.get(key, default) if default is not None else _need(section, key, where)
    return _whole(value, key, where, minimum)


def _positive(section: dict, key: str, where: str, default: float) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise CheckpointError(f"config.json: {where}.{key} must be a positive number, found {_json_type(value)}")
    return float(value)


def _qwen(section: dict, where: str, layers: int | None = None) -> QwenDims:
    hidden = _count(section, "hidden_size", where)
    heads = _count(section, "num_attention_heads", where)
    kv_heads = _count(section, "num_key_value_heads", where, default=heads)
    head_dim = section.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise CheckpointError(f"config.json: {where}.hidden_size {hidden} is not divisible by num_attention_heads {heads}")
        head_dim = hidden // heads
    if heads % kv_heads:
        raise CheckpointError(f"config.json: {where}.num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    rope = section.get("rope_parameters") if isinstance(section.get("rope_parameters"), dict) else {}
    return QwenDims(
        hidden=hidden,
        layers=layers if layers is not None else _count(section, "num_hidden_layers", where),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=_whole(head_dim, "head_dim", where),
        intermediate=_count(section, "intermediate_size", where),
        vocab=_count(section, "vocab_size", where),
        rope_theta=_positive(section, "rope_theta", where, rope.get("rope_theta", 1e6)),
        rms_eps=_positive(section, "rms_norm_eps", where, 1e-6),
        max_positions=_count(section, "max_position_embeddings", where, default=32768),
        tied_embeddings=bool(section.get("tie_word_embeddings", False)),
    )


def _counts(value, key: str, where: str) -> tuple[int, ...]:
    """A list of whole numbers >= 1, or upstream's "3-3-3" string form."""
    try:
        items = value.split("-") if isinstance(value, str) else list(value)
        numbers = [int(v) if isinstance(v, str) else v for v in items]
    except (TypeError, ValueError):
        numbers = None
    if not numbers:
        raise CheckpointError(f"config.json: {where}.{key} must be a non-empty list of whole numbers, found {_json_type(value)}")
    return tuple(_whole(n, key, where) for n in numbers)


def _stack(vae_dim, n_filters, ratios, depths, eps, where: str, sample_std: float = 0.0) -> ConvStackDims:
    if len(depths) != len(ratios) + 1:
        raise CheckpointError(f"config.json: {where} has {len(ratios)} ratios but {len(depths)} stage depths (needs ratios + 1)")
    return ConvStackDims(vae_dim, n_filters, ratios, depths, eps, sample_std)


def _upstream_sample_std(section: dict) -> float:
    """Upstream's gaussian σ-VAE draws the noise scale per item from N(0, (fix_std / 0.8)²) (facts 1.2)."""
    if section.get("std_dist_type") != "gaussian":
        return 0.0
    fix_std = section.get("fix_std", 0.5)
    if isinstance(fix_std, bool) or not isinstance(fix_std, (int, float)) or not math.isfinite(fix_std) or fix_std < 0:
        raise CheckpointError(f"config.json: fix_std must be a non-negative number, found {_json_type(fix_std)}")
    return float(fix_std) / 0.8


def _upstream_encoder(section: dict, where: str) -> ConvStackDims:
    # Upstream lists ratios in decoder order; the encoder applies them reversed (trap 13).
    return _stack(
        vae_dim=_count(section, "vae_dim", where),
        n_filters=_count(section, "encoder_n_filters", where, default=32),
        ratios=tuple(reversed(_counts(_need(section, "encoder_ratios", where), "encoder_ratios", where))),
        depths=_counts(_need(section, "encoder_depths", where), "encoder_depths", where),
        eps=_positive(section, "layernorm_eps", where, 1e-5),
        where=where,
        sample_std=_upstream_sample_std(section),
    )


def _upstream_decoder(section: dict, where: str) -> ConvStackDims:
    encoder_depths = _counts(_need(section, "encoder_depths", where), "encoder_depths", where)
    decoder_depths = section.get("decoder_depths")
    ratios = section.get("decoder_ratios") or _need(section, "encoder_ratios", where)
    return _stack(
        vae_dim=_count(section, "vae_dim", where),
        n_filters=_count(section, "decoder_n_filters", where, default=32),
        ratios=_counts(ratios, "decoder_ratios", where),
        depths=_counts(decoder_depths, "decoder_depths", where) if decoder_depths else tuple(reversed(encoder_depths)),
        eps=_positive(section, "layernorm_eps", where, 1e-5),
        where=where,
    )


def _hf_encoder(section: dict, where: str) -> ConvStackDims:
    # transformers-native configs store downsampling_ratios already in application order.
    return _stack(
        vae_dim=_count(section, "hidden_size", where),
        n_filters=_count(section, "num_filters", where, default=32),
        ratios=_counts(_need(section, "downsampling_ratios", where), "downsampling_ratios", where),
        depths=_counts(_need(section, "depths", where), "depths", where),
        eps=_positive(section, "rms_norm_eps", where, 1e-5),
        where=where,
        sample_std=float(section.get("vae_std", 0.0)) if "acoustic" in where else 0.0,
    )


def _head(section: dict, where: str) -> HeadDims:
    hidden = _count(section, "hidden_size", where)
    # The sampler implements what every VibeVoice checkpoint uses; anything else would sample wrongly.
    for key, supported in (("ddpm_beta_schedule", "cosine"), ("prediction_type", "v_prediction")):
        if section.get(key, supported) != supported:
            raise CheckpointError(f"config.json: {where}.{key} is '{section[key]}'; only '{supported}' is supported")
    return HeadDims(
        hidden=hidden,
        layers=_count(section, "head_layers", where, default=4),
        ffn=int(hidden * _positive(section, "head_ffn_ratio", where, 3.0)),
        latent=_count(section, "latent_size", where, default=64),
        eps=_positive(section, "rms_norm_eps", where, 1e-5),
        train_steps=_count(section, "ddpm_num_steps", where, default=1000, minimum=2),
        inference_steps=_count(section, "ddpm_num_inference_steps", where, default=20),
        beta_schedule=str(section.get("ddpm_beta_schedule", "cosine")),
        prediction_type=str(section.get("prediction_type", "v_prediction")),
    )


def detect_kind(config: dict, source: str = "config.json") -> str:
    """Tell the checkpoint kind from config.json (see families.recognise)."""
    return recognise(config, source).name


def model_dims(config: dict, source: str = "config.json") -> ModelDims:
    facts = recognise(config, source)
    kind = facts.name
    if facts.transformers_names:
        text = _section(config, "text_config", source)
        special = tuple(
            (name, int(config[name]))
            for name in ("audio_bos_token_id", "audio_eos_token_id", "audio_token_id", "pad_token_id", "eos_token_id")
            if config.get(name) is not None
        )
        return ModelDims(
            kind=kind,
            lm=_qwen(text, "text_config"),
            configured_layers=_count(text, "num_hidden_layers", "text_config"),
            acoustic_encoder=_hf_encoder(_section(config, "acoustic_tokenizer_encoder_config", source), "acoustic_tokenizer_encoder_config"),
            semantic_encoder=_hf_encoder(_section(config, "semantic_tokenizer_encoder_config", source), "semantic_tokenizer_encoder_config"),
            special_tokens=special,
        )

    decoder = _section(config, "decoder_config", source)
    acoustic = _section(config, "acoustic_tokenizer_config", source)
    configured = _count(decoder, "num_hidden_layers", "decoder_config")
    if facts.split_lm:
        upper = _count(config, "tts_backbone_num_hidden_layers", "config")
        if not 0 < upper < configured:
            raise CheckpointError(
                f"{source}: tts_backbone_num_hidden_layers={upper} must lie between 0 and num_hidden_layers={configured}"
            )
        return ModelDims(
            kind=kind,
            lm=_qwen(decoder, "decoder_config", layers=configured - upper),
            tts_lm=_qwen(decoder, "decoder_config", layers=upper),
            configured_layers=configured,
            # The hub file has no encoder, but its config describes one and upstream's save_pretrained writes it.
            acoustic_encoder=_upstream_encoder(acoustic, "acoustic_tokenizer_config") if "encoder_depths" in acoustic else None,
            acoustic_decoder=_upstream_decoder(acoustic, "acoustic_tokenizer_config"),
            head=_head(_section(config, "diffusion_head_config", source), "diffusion_head_config"),
        )
    semantic = _section(config, "semantic_tokenizer_config", source)
    dims = dict(
        kind=kind,
        lm=_qwen(decoder, "decoder_config"),
        configured_layers=configured,
        acoustic_encoder=_upstream_encoder(acoustic, "acoustic_tokenizer_config"),
        acoustic_decoder=_upstream_decoder(acoustic, "acoustic_tokenizer_config"),
        semantic_encoder=_upstream_encoder(semantic, "semantic_tokenizer_config"),
    )
    if facts.capabilities.long_form:
        dims["head"] = _head(_section(config, "diffusion_head_config", source), "diffusion_head_config")
    return ModelDims(**dims)


# ----------------------------------------------------------------------------------------------------------
# Synthetic configs: the real hub field names and values (full), or the same with small widths (tiny).

def _upstream_tokenizer_section(kind: str, vae_dim: int) -> dict:
    section = {
        "causal": True,
        "channels": 1,
        "conv_bias": True,
        "conv_norm": "none",
        "corpus_normalize": 0.0,
        "disable_last_norm": True,
        "encoder_depths": "3-3-3-3-3-3-8",
        "encoder_n_filters": 32,
        "encoder_ratios": [8, 5, 5, 4, 2, 2],
        "fix_std": 0.5 if kind == "acoustic" else 0,
        "layer_scale_init_value": 1e-06,
        "layernorm": "RMSNorm",
        "layernorm_elementwise_affine": True,
        "layernorm_eps": 1e-05,
        "mixer_layer": "depthwise_conv",
        "model_type": f"vibevoice_{kind}_tokenizer",
        "pad_mode": "constant",
        "std_dist_type": "gaussian" if kind == "acoustic" else "none",
        "vae_dim": vae_dim,
        "weight_init_value": 0.01,
    }
    if kind == "acoustic":
        section.update({"decoder_depths": None, "decoder_n_filters": 32, "decoder_ratios": [8, 5, 5, 4, 2, 2]})
    return dict(sorted(section.items()))


def _qwen_section(hidden, layers, heads, kv_heads, intermediate, vocab, max_positions, tied) -> dict:
    return {
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": intermediate,
        "max_position_embeddings": max_positions,
        "max_window_layers": layers,
        "model_type": "qwen2",
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": tied,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab,
    }


def _head_section(hidden: int) -> dict:
    return {
        "ddpm_batch_mul": 4,
        "ddpm_beta_schedule": "cosine",
        "ddpm_num_inference_steps": 20,
        "ddpm_num_steps": 1000,
        "diffusion_type": "ddpm",
        "head_ffn_ratio": 3.0,
        "head_layers": 4,
        "hidden_size": hidden,
        "latent_size": 64,
        "model_type": "vibevoice_diffusion_head",
        "prediction_type": "v_prediction",
        "rms_norm_eps": 1e-05,
        "speech_vae_dim": 64,
    }


def _hf_encoder_section(vae_dim: int) -> dict:
    return {
        "channels": 1,
        "depths": [3, 3, 3, 3, 3, 3, 8],
        "downsampling_ratios": [2, 2, 4, 5, 5, 8],
        "ffn_expansion": 4,
        "hidden_act": "gelu",
        "hidden_size": vae_dim,
        "initializer_range": 0.01,
        "kernel_size": 7,
        "layer_scale_init_value": 1e-06,
        "model_type": "vibevoice_acoustic_tokenizer_encoder",
        "num_filters": 32,
        "rms_norm_eps": 1e-05,
        "vae_std": 0.625,
    }


@dataclass(frozen=True)
class StreamingGeometry:
    """ASR-Streaming's windows (facts sheet 12.3, 12.7): window k covers samples [k·chunk, k·chunk + window); the
    last, shorter one is zero-padded to a whole window."""

    chunk_frames: int
    lookahead_frames: int
    hop: int
    sample_rate: int
    normalize_audio: bool

    @property
    def chunk_samples(self) -> int:
        return self.chunk_frames * self.hop

    @property
    def window_frames(self) -> int:
        return self.chunk_frames + self.lookahead_frames

    @property
    def window_samples(self) -> int:
        return self.window_frames * self.hop

    def windows(self, samples: int) -> int:
        return max(1, -(-samples // self.chunk_samples))

    def describe(self) -> str:
        return (f"chunks of {self.chunk_frames} frames ({self.chunk_samples / self.sample_rate:.4f} s) + "
                f"{self.lookahead_frames} of lookahead: windows of {self.window_samples:,} samples at {self.sample_rate} Hz")


def streaming_geometry(preprocessor: dict | None, source: str = PREPROCESSOR_CONFIG) -> StreamingGeometry:
    """The geometry from the checkpoint's own preprocessor_config.json; upstream refuses one without it."""
    if preprocessor is None:
        raise CheckpointError(f"{source}: missing, so this is not a streaming checkpoint (its chunk_frames and "
                              "lookahead_frames set the windows)")
    for key in ("chunk_frames", "lookahead_frames"):
        if not isinstance(preprocessor.get(key), int) or preprocessor[key] < (1 if key == "chunk_frames" else 0):
            raise CheckpointError(f"{source}: no valid '{key}', so this is not a streaming checkpoint")
    return StreamingGeometry(preprocessor["chunk_frames"], preprocessor["lookahead_frames"],
                             _count(preprocessor, "speech_tok_compress_ratio", source, default=3200),
                             _count(preprocessor, "target_sample_rate", source, default=24000),
                             bool(preprocessor.get("normalize_audio", False)))


def streaming_config(variant: str) -> dict:
    """VibeVoice-ASR-Streaming's config.json (facts sheet 12.2): the ASR skeleton, a vestigial diffusion head
    section, the sample rate and frame size at the top level. Not established, and so our choice: the 1.5B's
    max_position_embeddings (the 1.5B TTS's 65536) and the 7B's (VibeVoice-ASR's 32768)."""
    if variant not in STREAMING_VARIANTS:
        raise CheckpointError(f"unknown ASR-Streaming variant '{variant}' (expected {' or '.join(STREAMING_VARIANTS)})")
    config = {key: value for key, value in asr_config().items() if key != "decoder_config"}
    config.update(
        architectures=["VibeVoiceForASRStreamingTraining"],
        decoder_config=(_qwen_section(1536, 28, 12, 2, 8960, 151936, 65536, True) if variant == "1.5b"
                        else _qwen_section(3584, 28, 28, 4, 18944, 152064, 32768, False)),
        diffusion_head_config=_head_section(1536 if variant == "1.5b" else 3584),
        speech_tok_compress_ratio=3200, target_sample_rate=24000, torch_dtype="float32", use_semantic_feature=True)
    return dict(sorted(config.items()))


def full_config(kind: str, variant: str = "1.5b") -> dict:
    """The hub config.json of KIND, field for field (facts sheet sections 2.1, 3.1, 5.1, 6.1, 12.2); `variant`:
    the size, for a kind released in several (ASR-Streaming)."""
    facts = family(kind)
    make = load(facts.hub_config)
    return make(variant) if facts.variants else make()


def realtime_config() -> dict:
    return {
        "acoustic_tokenizer_config": _upstream_tokenizer_section("acoustic", 64),
        "acoustic_vae_dim": 64,
        "architectures": ["VibeVoiceStreamingForConditionalGenerationInference"],
        "decoder_config": _qwen_section(896, 24, 14, 2, 4864, 151936, 8192, False),
        "diffusion_head_config": _head_section(896),
        "model_type": "vibevoice_streaming",
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.3",
        "tts_backbone_num_hidden_layers": 20,
    }


def _codes_config(architecture: str, **sections) -> dict:
    """The upstream ("codes") layout's config that the 1.5B and ASR share, with their own sections."""
    config = {
        "acoustic_tokenizer_config": _upstream_tokenizer_section("acoustic", 64),
        "acoustic_vae_dim": 64,
        "architectures": [architecture],
        "model_type": "vibevoice",
        "semantic_tokenizer_config": _upstream_tokenizer_section("semantic", 128),
        "semantic_vae_dim": 128,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.3",
        **sections,
    }
    return dict(sorted(config.items()))


def tts_1p5b_config() -> dict:
    return _codes_config("VibeVoiceForConditionalGeneration",
                         decoder_config=_qwen_section(1536, 28, 12, 2, 8960, 151936, 65536, True),
                         diffusion_head_config=_head_section(1536))


def asr_config() -> dict:
    return _codes_config("VibeVoiceForASRTraining",
                         decoder_config=_qwen_section(3584, 28, 28, 4, 18944, 152064, 32768, False))


def asr_bitnet_config() -> dict:
    """VibeVoice-ASR-BitNet (docs/bitnet.md): the ASR config with the 1.5B Qwen2 decoder, its head tied, F32
    weights. Not established, and so our choice: max_position_embeddings (the GGUF's context, 65536)."""
    decoder = {**_qwen_section(1536, 28, 12, 2, 8960, 151936, 65536, True), "torch_dtype": "float32"}
    return {**_codes_config("VibeVoiceForASRTraining", decoder_config=decoder), "torch_dtype": "float32"}


def large_config() -> dict:
    """Facts sheet 11.2, the hub file as ComfyUI copies it."""
    config = tts_1p5b_config()
    decoder = _qwen_section(3584, 28, 28, 4, 18944, 152064, 32768, False)
    del decoder["tie_word_embeddings"]  # absent there: the top-level key unties the head
    config.update(decoder_config={**decoder, "use_mrope": False}, diffusion_head_config=_head_section(3584),
                  tie_word_embeddings=False, acostic_vae_dim=config.pop("acoustic_vae_dim"))  # (sic)
    return dict(sorted(config.items()))


def asr_hf_config() -> dict:
    text = _qwen_section(3584, 28, 28, 4, 18944, 152064, 131072, False)
    return {
        "acoustic_tokenizer_chunk_size": 1440000,
        "acoustic_tokenizer_encoder_config": _hf_encoder_section(64),
        "architectures": ["VibeVoiceAsrForConditionalGeneration"],
        "audio_bos_token_id": QWEN_SPECIAL_TOKENS["<|object_ref_start|>"],
        "audio_eos_token_id": QWEN_SPECIAL_TOKENS["<|object_ref_end|>"],
        "audio_token_id": QWEN_SPECIAL_TOKENS["<|box_start|>"],
        "dtype": "bfloat16",
        "model_type": "vibevoice_asr",
        "semantic_tokenizer_encoder_config": _hf_encoder_section(128),
        "text_config": text,
        "transformers_version": "5.23.0",
    }


# Tiny widths: hidden 64, few layers, 4 conv filters and one block per stage, but the real conv ratios so
# one latent frame is still 3200 samples, and the real latent sizes (64 acoustic, 128 semantic).
TINY_HIDDEN, TINY_HEADS, TINY_KV_HEADS, TINY_INTERMEDIATE = 64, 4, 2, 128
TINY_FILTERS, TINY_DEPTHS = 4, [1, 1, 1, 1, 1, 1, 2]


def tiny_config(kind: str, vocab: int, special_ids: dict[str, int], variant: str = "1.5b") -> dict:
    facts = family(kind)
    config = copy.deepcopy(full_config(kind, variant))
    depth_string = "-".join(str(d) for d in TINY_DEPTHS)
    if facts.transformers_names:
        text = config["text_config"]
        for name in ("acoustic_tokenizer_encoder_config", "semantic_tokenizer_encoder_config"):
            config[name].update(num_filters=TINY_FILTERS, depths=list(TINY_DEPTHS))
        config["audio_bos_token_id"] = special_ids["<|object_ref_start|>"]
        config["audio_eos_token_id"] = special_ids["<|object_ref_end|>"]
        config["audio_token_id"] = special_ids["<|box_start|>"]
    else:
        text = config["decoder_config"]
        for name in ("acoustic_tokenizer_config", "semantic_tokenizer_config"):
            if name in config:
                config[name].update(encoder_n_filters=TINY_FILTERS, encoder_depths=depth_string)
                if "decoder_n_filters" in config[name]:
                    config[name]["decoder_n_filters"] = TINY_FILTERS
        if "diffusion_head_config" in config:
            config["diffusion_head_config"]["hidden_size"] = TINY_HIDDEN
    layers = facts.tiny_layers
    text.update(
        hidden_size=TINY_HIDDEN,
        num_attention_heads=TINY_HEADS,
        num_key_value_heads=TINY_KV_HEADS,
        intermediate_size=TINY_INTERMEDIATE,
        num_hidden_layers=layers,
        max_window_layers=layers,
        vocab_size=vocab,
    )
    if facts.split_lm:
        config["tts_backbone_num_hidden_layers"] = 4
    return config


def tokenizer_repo(dims: ModelDims, preprocessor: dict | None) -> str | None:
    """The Hub repository of the Qwen2.5 tokenizer that matches the checkpoint's LM (QWEN_TOKENIZERS), or None."""
    if dims.lm.hidden in QWEN_TOKENIZERS:
        return QWEN_TOKENIZERS[dims.lm.hidden]
    named = (preprocessor or {}).get("language_model_pretrained_name")
    return named if isinstance(named, str) and named.startswith("Qwen/Qwen2.5") else None


def tts_preprocessor(kind: str) -> dict:
    """The preprocessor_config.json that upstream's TTS repositories ship (facts sheet 2.1, 11.3): the audio
    processor's settings and the Qwen2.5 repository whose tokenizer the model uses, named by its released size."""
    return {"processor_class": family(kind).processor_class,
            "speech_tok_compress_ratio": 3200, "db_normalize": True,
            "language_model_pretrained_name": QWEN_TOKENIZERS[model_dims(full_config(kind)).lm.hidden],
            "audio_processor": {"feature_extractor_type": "VibeVoiceTokenizerProcessor", "sampling_rate": 24000,
                                "normalize_audio": True, "target_dB_FS": -25, "eps": 1e-06}}
