"""One description per model kind: what it is, how a checkpoint is recognised, and which module does what for it.

Every stage (checkpoints, reference, export, verify, runtime) reads a kind's facts from its `Family` record here
rather than keeping a table keyed by kind, so a new kind is one record plus its own stage modules (docs/design.md).
Torch-side parts are named as "module:attribute" strings and imported by `load` only when used: importing this
module imports nothing heavy, and it imports no stage module, so no import circle can run through it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace

from .errors import CheckpointError, VibeVoiceError

PACKAGE = __package__


def load(name: str):
    """The attribute a "module:attribute" name points at (the module relative to this package), imported now."""
    module, _, attribute = name.partition(":")
    loaded = importlib.import_module(f"{PACKAGE}.{module}")
    return getattr(loaded, attribute) if attribute else loaded


@dataclass(frozen=True)
class Capabilities:
    speaks: bool = False  # text to speech
    transcribes: bool = False  # speech to text
    streams: bool = False  # takes its input as it comes (realtime: text; ASR-Streaming: audio)
    long_form: bool = False  # multi-speaker scripts, voices from audio samples, the LM picks segments and EOS
    batchable: bool = False  # several generations on one bundle share each graph call
    in_browser: bool = False  # its loop runs in a web page on onnxruntime-web (`vibevoice-onnx web`)


@dataclass(frozen=True)
class Defaults:
    """The generation options a kind runs with when none are given (upstream's demo, facts sheet 11.7)."""

    cfg_scale: float | None = None
    steps: int | None = None

    def options(self) -> dict:
        return {name: value for name, value in (("cfg_scale", self.cfg_scale), ("steps", self.steps))
                if value is not None}


@dataclass(frozen=True)
class Family:
    name: str  # the kind: manifests' model_kind, the CLI's KIND, OUT_ROOT/KIND/...
    title: str  # the released model(s)
    model_type: str  # config.json's model_type (several kinds share "vibevoice": see recognise)
    # Hub layout facts
    hub_config: str  # (variant) -> the hub config.json, field for field
    layout: str  # (dims, stored names) -> checkpoints.layouts.Layout
    transformers_names: bool = False  # tensors named as transformers names them (normalised to upstream's on read)
    split_lm: bool = False  # two LMs from one decoder_config: a text-only lower LM under the TTS LM
    variants: str | None = None  # the sizes it is released in, where several (make-checkpoint --variant)
    # Synthetic checkpoints (checkpoints/synthetic.py)
    shards: int = 1  # the hub checkpoint's shard count (facts sheet 1.5); tiny ones keep it
    untied_shards: int | None = None  # the count where the variant's LM head is its own tensor, when it differs
    tiny_layers: int = 2  # LM layers of a tiny synthetic checkpoint
    processor_class: str | None = None  # a TTS repository's preprocessor_config.json names it
    preprocessor: str | None = None  # the preprocessor_config.json the repository ships, where fixed
    added_tokens: str | None = None  # its tokenizer's added tokens, where they are not Qwen2.5's
    dtype: str = "bfloat16"  # the hub checkpoint's weights (make-checkpoint's default --dtype)
    # Stages, by name (imported when used)
    reference: str = "reference.asr:load_asr"  # (checkpoint) -> the PyTorch reference the gates compare against
    to_transformers: str | None = None  # hub name -> the transformers model's name (None: the same)
    torch_backend: str | None = None  # (reference) -> its backend for the runtime's generation loop (timing)
    exporter: str | None = None  # the module that knows its graphs (export/build.py)
    writer: str | None = None  # the module that writes its graphs from the checkpoint without torch (writer/)
    policy: str | None = None  # {precision: {graph: Scheme}} (export/precision.py)
    gates: str | None = None  # the module holding its parity gates (verify)
    runtime: str | None = None  # the torch-free API class that opens its bundles (vibevoice_onnx.open returns it)
    # Running it
    prompt: str = "transcription:build_asr_prompt"  # (tokenizer, samples, hotwords) -> AsrPrompt (transcribing kinds)
    transcript: str = "transcription:parse_transcript"  # (generated text) -> (segments, note)
    voices: str | None = None  # its voices: "preset" (upstream's KV-cache presets) or "audio" (samples)
    int8_activations: bool = False  # its graphs quantize activations to int8 at every precision (verify judges
    #                                 its fp32 bundles by int8's limits: the rounding of those steps is its own)
    defaults: Defaults = field(default_factory=Defaults)
    capabilities: Capabilities = field(default_factory=Capabilities)
    # The languages it is announced with (Wyoming's info: Home Assistant offers a model for a pipeline in one of
    # them): its model card's where known (1.5B and Large: English and Chinese; ASR-Streaming: facts sheet 12.1),
    # else English, which every VibeVoice model speaks.
    languages: tuple[str, ...] = ("en",)

    @property
    def streams_audio(self) -> bool:
        """Transcribes audio as it comes, in windows whose geometry its preprocessor_config.json gives."""
        return self.capabilities.transcribes and self.capabilities.streams

    def shard_count(self, tied_head: bool) -> int:
        return self.shards if tied_head or self.untied_shards is None else self.untied_shards


LONG_FORM = Family(
    "1.5b", "VibeVoice-1.5B", "vibevoice",
    hub_config="checkpoints.configs:tts_1p5b_config", layout="checkpoints.layouts:tts_1p5b_layout",
    shards=3, processor_class="VibeVoiceProcessor",
    to_transformers="checkpoints.names:tts_1p5b_to_hf",
    reference="reference.tts15b:load_tts15b", torch_backend="reference.tts15b:TorchTts15bBackend",
    exporter="export.tts15b", writer="writer.tts15b", policy="export.precision:LONG_FORM_POLICY", gates="verify.tts15b",
    runtime="runtime.tts15b:LongFormTTS", voices="audio", defaults=Defaults(cfg_scale=1.3, steps=10),
    capabilities=Capabilities(speaks=True, long_form=True, batchable=True), languages=("en", "zh"),
)
ASR = Family(
    "asr", "VibeVoice-ASR (upstream's layout)", "vibevoice",
    hub_config="checkpoints.configs:asr_config", layout="checkpoints.layouts:asr_codes_layout",
    shards=8,  # not established; mirrors its -HF twin
    to_transformers="checkpoints.names:asr_codes_to_hf",
    exporter="export.asr", writer="writer.asr", policy="export.precision:ASR_POLICY", gates="verify.asr",
    runtime="runtime.asr:Transcriber",
    capabilities=Capabilities(transcribes=True, batchable=True),
)

FAMILIES = (
    Family(
        "realtime", "VibeVoice-Realtime-0.5B", "vibevoice_streaming",
        hub_config="checkpoints.configs:realtime_config", layout="checkpoints.layouts:realtime_layout",
        split_lm=True, shards=1, tiny_layers=6, processor_class="VibeVoiceStreamingProcessor",
        reference="reference.loading:load_realtime", torch_backend="reference.realtime:TorchRealtimeBackend",
        exporter="export.realtime", writer="writer.realtime", policy="export.precision:REALTIME_POLICY",
        gates="verify.realtime", runtime="runtime.realtime:RealtimeTTS", voices="preset", defaults=Defaults(cfg_scale=1.5, steps=5),
        capabilities=Capabilities(speaks=True, streams=True, batchable=True, in_browser=True),
    ),
    LONG_FORM,
    replace(
        LONG_FORM, name="large", title="VibeVoice-Large (7B)",  # the 1.5B's architecture, scaled
        hub_config="checkpoints.configs:large_config", layout="checkpoints.layouts:large_layout", shards=10,
        to_transformers="checkpoints.names:large_to_hf", exporter="export.large", writer="writer.large",
        runtime="runtime.tts15b:LargeTTS",
    ),
    ASR,
    replace(
        ASR, name="asr-hf", title="VibeVoice-ASR (transformers' layout)", model_type="vibevoice_asr",
        hub_config="checkpoints.configs:asr_hf_config", layout="checkpoints.layouts:asr_hf_layout",
        transformers_names=True, to_transformers=None,
    ),
    replace(
        # The 1.5B ASR with ternary LM projections: config.json says what the 7B's says (model_type, architecture);
        # the tied head tells it (recognise). F32 latent weights, ternarized at load (docs/bitnet.md).
        ASR, name="asr-bitnet", title="VibeVoice-ASR-BitNet (1.5B, ternary LM projections)",
        hub_config="checkpoints.configs:asr_bitnet_config", layout="checkpoints.layouts:asr_bitnet_layout",
        shards=3, dtype="float32", reference="reference.asr_bitnet:load_asr_bitnet",
        exporter="export.asr_bitnet", writer="writer.asr_bitnet", policy="export.precision:BITNET_POLICY", gates="verify.asr",
        prompt="transcription:build_text_prompt", transcript="transcription:parse_prose", int8_activations=True,
    ),
    Family(
        "asr-streaming", "VibeVoice-ASR-Streaming (1.5B, 7B)", "vibevoice",
        hub_config="checkpoints.configs:streaming_config", layout="checkpoints.layouts:asr_streaming_layout",
        variants="checkpoints.configs:STREAMING_VARIANTS",
        shards=3, untied_shards=8,  # the 1.5B's 3 shards (its head tied), the 7B's 8 (facts sheet 12.4)
        preprocessor="checkpoints.configs:STREAMING_PREPROCESSOR", added_tokens="checkpoints.configs:STREAMING_TOKENS",
        to_transformers="checkpoints.names:asr_codes_to_hf",
        exporter="export.asr", writer="writer.asr", policy="export.precision:STREAMING_ASR_POLICY",
        gates="verify.asr_streaming",
        runtime="runtime.asr_streaming:StreamingModel",
        capabilities=Capabilities(transcribes=True, streams=True),
        languages=("zh", "en", "es", "pt", "de", "ja", "ko", "fr", "ru", "it"),  # facts sheet 12.1
    ),
)
BY_NAME = {f.name: f for f in FAMILIES}
KINDS = tuple(BY_NAME)
# The precisions a bundle is built at (each kind's policy says which it has; export.precision).
# int8-decoder: fp32 but the decoder in dynamic int8, what onnxruntime-web runs fastest in WASM (docs/javascript.md).
PRECISIONS = ("fp32", "int8", "int4", "int4-mixed", "int8-decoder", "fp16")


def family(kind: str) -> Family:
    try:
        return BY_NAME[kind]
    except KeyError:
        raise CheckpointError(f"unknown checkpoint kind '{kind}' (expected one of {', '.join(KINDS)})") from None


def stage(kind: str, part: str, doing: str):
    """What a kind's record names for `part` ("exporter", "gates", ...), loaded now; where it names none, a sentence
    that `doing` (e.g. "building realtime checkpoints") is not supported, and for which kinds it is."""
    name = getattr(family(kind), part)
    if name is None:
        supported = ", ".join(f.name for f in FAMILIES if getattr(f, part))
        raise VibeVoiceError(f"{doing} is not supported yet (supported: {supported})")
    return load(name)


def kinds_that(**capabilities: bool) -> tuple[str, ...]:
    """The kinds whose capabilities are as given (e.g. transcribes=True, streams=False), in KINDS order."""
    return tuple(f.name for f in FAMILIES
                 if all(getattr(f.capabilities, name) == wanted for name, wanted in capabilities.items()))


def recognise(config: dict, source: str = "config.json") -> Family:
    """The kind of a checkpoint from its config.json (model_type alone is ambiguous: trap 20)."""
    model_type = config.get("model_type")
    candidates = [f for f in FAMILIES if f.model_type == model_type]
    if len(candidates) == 1:
        return candidates[0]
    if model_type == "vibevoice":
        return _recognise_vibevoice(config, source)
    if model_type is None:
        raise CheckpointError(f"{source}: no 'model_type' field, so this is not a VibeVoice checkpoint config")
    raise CheckpointError(
        f"{source}: unknown model_type '{model_type}' (expected vibevoice_streaming, vibevoice or vibevoice_asr)"
    )


def _recognise_vibevoice(config: dict, source: str) -> Family:
    """The five kinds of model_type 'vibevoice', told apart in this order."""
    architectures = " ".join(config.get("architectures") or [])
    if "ASRStreaming" in architectures:  # before the diffusion head test: its config keeps a vestigial one (12.2)
        return BY_NAME["asr-streaming"]
    if "decoder_config" not in config:
        raise CheckpointError(
            f"{source}: model_type 'vibevoice' without 'decoder_config' is the transformers-native "
            "1.5B layout, which is not supported yet; use the upstream microsoft/VibeVoice-1.5B checkpoint"
        )
    if "diffusion_head_config" in config:
        # Large says so at the top level (facts sheet 11.2: its decoder section has no tie key at all)
        return BY_NAME["large" if config.get("tie_word_embeddings") is False else "1.5b"]
    if "ASR" in architectures or "semantic_tokenizer_config" in config:
        # ASR-BitNet's config is the 7B ASR's with a 1.5B decoder whose head is tied (the 7B's is not); no other
        # marker is known (docs/bitnet.md)
        decoder = config["decoder_config"] if isinstance(config["decoder_config"], dict) else {}
        return BY_NAME["asr-bitnet" if decoder.get("tie_word_embeddings") is True else "asr"]
    raise CheckpointError(f"{source}: model_type 'vibevoice' with neither a diffusion head nor an ASR architecture")
