"""Key renaming between the upstream (hub) layout and the module names the PyTorch reference uses.

The reference is built from transformers 5.23 modules (Qwen2Model, VibeVoiceDiffusionHead, the VibeVoice
acoustic tokenizer, VibeVoice(Asr)ForConditionalGeneration), so each hub key is mapped onto those names
(facts sheet section 7). Pure string functions: no torch here.
"""

from __future__ import annotations

import re

from ..errors import CheckpointError
from ..families import family

_STEM_CONV = re.compile(r"^(down|up)sample_layers\.0\.0\.conv\.conv\.(weight|bias)$")
_RESAMPLE = re.compile(r"^(?:downsample_layers\.(\d+)\.0\.conv\.conv|upsample_layers\.(\d+)\.0\.convtr\.convtr)\.(weight|bias)$")
_STAGE = re.compile(r"^stages\.(\d+)\.(\d+)\.(.+)$")


def upstream_encoder_to_hf(name: str) -> str:
    """Rename one key of an upstream conv stack (encoder or decoder) to the transformers-native name (§7.1)."""
    if m := _STEM_CONV.match(name):
        return f"stem.conv.conv.{m.group(2)}"
    if m := _RESAMPLE.match(name):
        index = int(m.group(1) or m.group(2))
        kind = "conv.conv" if m.group(1) else "convtr.convtr"
        return f"conv_layers.{index - 1}.{kind}.{m.group(3)}"
    if m := _STAGE.match(name):
        stage, block, rest = int(m.group(1)), m.group(2), m.group(3)
        rest = rest.replace("mixer.conv.conv.conv.", "mixer.conv.")
        return f"stem.stage.{block}.{rest}" if stage == 0 else f"conv_layers.{stage - 1}.stage.{block}.{rest}"
    if name.startswith("head.conv.conv."):
        return "head.conv." + name[len("head.conv.conv."):]
    raise CheckpointError(f"unexpected conv-stack key '{name}'")


_HEAD_RENAMES = (
    ("t_embedder.mlp.0.", "timestep_proj.fc1."),
    ("t_embedder.mlp.2.", "timestep_proj.fc2."),
    ("final_layer.adaLN_modulation.1.", "final_layer.linear_1."),
    ("final_layer.linear.", "final_layer.linear_2."),
)
_HEAD_LAYER_MODULATION = re.compile(r"^layers\.(\d+)\.adaLN_modulation\.1\.")


def upstream_head_to_hf(name: str) -> str:
    """Rename a `prediction_head.*` suffix to the transformers VibeVoiceDiffusionHead names."""
    for old, new in _HEAD_RENAMES:
        if name.startswith(old):
            return new + name[len(old):]
    return _HEAD_LAYER_MODULATION.sub(r"layers.\1.linear.", name)


_CONNECTOR_RENAMES = {"fc1.": "linear_1.", "norm.": "act.", "fc2.": "linear_2."}


def upstream_connector_to_hf(name: str) -> str:
    for old, new in _CONNECTOR_RENAMES.items():
        if name.startswith(old):
            return new + name[len(old):]
    raise CheckpointError(f"unexpected connector key '{name}'")


def _strip(name: str, prefix: str) -> str | None:
    return name[len(prefix):] if name.startswith(prefix) else None


def realtime_to_reference(name: str) -> str | None:
    """Hub key of the realtime checkpoint -> state-dict key of reference.realtime.RealtimeModel."""
    for prefix, target in (("model.language_model.", "language_model."), ("model.tts_language_model.", "tts_language_model.")):
        if (rest := _strip(name, prefix)) is not None:
            return target + rest
    if (rest := _strip(name, "model.prediction_head.")) is not None:
        return "diffusion_head." + upstream_head_to_hf(rest)
    if (rest := _strip(name, "model.acoustic_tokenizer.decoder.")) is not None:
        return "acoustic_decoder." + upstream_encoder_to_hf(rest)
    if name.startswith("model.acoustic_tokenizer.encoder."):
        return None  # written by upstream's save_pretrained, never used (the layout still checks it)
    if (rest := _strip(name, "model.acoustic_connector.")) is not None:
        return "acoustic_connector." + upstream_connector_to_hf(rest)
    if (rest := _strip(name, "tts_eos_classifier.")) is not None:
        return "eos_classifier." + rest
    simple = {
        "model.tts_input_types.weight": "tts_input_types.weight",
        "model.speech_scaling_factor": "speech_scaling_factor",
        "model.speech_bias_factor": "speech_bias_factor",
    }
    if name in simple:
        return simple[name]
    raise CheckpointError(f"realtime checkpoint: no reference module for key '{name}'")


def tts_1p5b_to_hf(name: str) -> str:
    """Hub key of VibeVoice-1.5B -> transformers VibeVoiceForConditionalGeneration key (§7.2)."""
    if name.startswith("model.language_model."):
        return name
    for prefix, target in (
        ("model.acoustic_tokenizer.encoder.", "model.audio_tower.encoder."),
        ("model.acoustic_tokenizer.decoder.", "model.audio_tower.decoder."),
        ("model.semantic_tokenizer.encoder.", "model.semantic_tokenizer_encoder."),
    ):
        if (rest := _strip(name, prefix)) is not None:
            return target + upstream_encoder_to_hf(rest)
    if (rest := _strip(name, "model.acoustic_connector.")) is not None:
        return "model.multi_modal_projector." + upstream_connector_to_hf(rest)
    if (rest := _strip(name, "model.semantic_connector.")) is not None:
        return "model.semantic_connector." + upstream_connector_to_hf(rest)
    if (rest := _strip(name, "model.prediction_head.")) is not None:
        return "model.diffusion_head." + upstream_head_to_hf(rest)
    simple = {"model.speech_scaling_factor": "model.latent_scaling_factor", "model.speech_bias_factor": "model.latent_bias_factor"}
    if name in simple:
        return simple[name]
    raise CheckpointError(f"1.5B checkpoint: no transformers module for key '{name}'")


def large_to_hf(name: str) -> str:
    """Hub key of VibeVoice-Large -> transformers VibeVoiceForConditionalGeneration key: the 1.5B's, and the
    untied head at the top level as transformers names it."""
    return name if name == "lm_head.weight" else tts_1p5b_to_hf(name)


def asr_codes_to_hf(name: str) -> str | None:
    """Hub key of codes-layout VibeVoice-ASR -> transformers VibeVoiceAsr key; None for the unused decoder."""
    if name.startswith("model.acoustic_tokenizer.decoder."):
        return None
    if name == "lm_head.weight" or name.startswith("model.language_model."):
        return name
    for prefix, target in (
        ("model.acoustic_tokenizer.encoder.", "model.acoustic_tokenizer_encoder."),
        ("model.semantic_tokenizer.encoder.", "model.semantic_tokenizer_encoder."),
    ):
        if (rest := _strip(name, prefix)) is not None:
            return target + upstream_encoder_to_hf(rest)
    for modality in ("acoustic", "semantic"):
        if (rest := _strip(name, f"model.{modality}_connector.")) is not None:
            renamed = upstream_connector_to_hf(rest).replace("act.", "norm.")
            return f"model.multi_modal_projector.{modality}_{renamed}"
    raise CheckpointError(f"ASR checkpoint: no transformers module for key '{name}'")


# transformers 5.23 also accepts llava-style prefixes for ASR-HF (conversion_mapping.py); hub shards may use
# either spelling (facts §10), so both are normalised to the `model.*` names the layout lists.
_ASR_HF_LEGACY = (
    ("language_model.lm_head.", "lm_head."),
    ("language_model.model.", "model.language_model."),
    ("language_model.", "model.language_model."),
    ("acoustic_tokenizer_encoder.", "model.acoustic_tokenizer_encoder."),
    ("semantic_tokenizer_encoder.", "model.semantic_tokenizer_encoder."),
    ("multi_modal_projector.", "model.multi_modal_projector."),
)


def normalise_asr_hf(name: str) -> str:
    if name.startswith("model.") or name == "lm_head.weight":
        return name
    for old, new in _ASR_HF_LEGACY:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def normalise_key(kind: str, name: str) -> str:
    """The spelling the layout uses for a stored key (only ASR-HF has alternative spellings)."""
    return normalise_asr_hf(name) if family(kind).transformers_names else name
