"""Torch-free VibeVoice-1.5B: long-form multi-speaker TTS, the shared loop on onnxruntime sessions of a bundle.

    tts = LongFormTTS("onnx/1.5b/cpu_fp32")
    script = "Speaker 1: Hello there.\\nSpeaker 2: Hi! Lovely to be here."
    for chunk in tts.stream(script, speakers={1: "alice", 2: "samples/bob.wav"}):
        play(chunk.samples, chunk.sample_rate)
    audio, sample_rate = tts.create("Just one voice.", speakers="alice", seed=7)
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from ..audio import VoiceSample
from ..checkpoints.configs import LONG_FORM_KINDS
from ..errors import VibeVoiceError
from ..families import family
from ..generation.tts15b import (MAX_LENGTH_TIMES, LongFormResult, TokenIds, long_form_frames, prompt_embeddings,
                                 segmented_frames)
from ..options import check, check_optional
from ..sampling import NoiseSource
from ..script import Script, assign_voices, build_prompt, parse_script
from ..text import split_text
from .batch import BATCH_CAPACITY, MemberBackend, MemberGuidedStreams, StreamBatch, row_executor
from .lm import BatchedGuidedStreams, KvCache, OnnxDiffusionHead, OnnxLm, StreamingConv
from .speech import Speech, TtsModel

F32 = np.float32
DEFAULTS = family("1.5b").defaults  # upstream's demo, Large's too
VOICE_LATENTS = ("sample", "mean")
VOICE_NOISE_STREAM = 1 << 40  # the voice-prompt noise draws from its own stream of the seed (frames use 0, 1, ...)
BENCH_SCRIPTS = (  # stream k of `bench --streams` speaks script k (cycled), with seed BENCH_SEED + k
    "Speaker 1: VibeVoice turns a script into speech one latent at a time. This benchmark measures how fast the "
    "ONNX runtime speaks compared with the PyTorch reference, on the same weights and noise.",
    "Speaker 1: Two scripts at once share one model here.\nSpeaker 2: Each step, both read the weights together.",
)
BENCH_SEED = 42


def bench_frames(backend, bundle, voice: str, frames: int, result: LongFormResult, decode_group: int | None = None,
                 *, stream: int = 0, batch: "LongFormBatch | None" = None):
    """What `bench` times, on either backend: exactly `frames` latents of a script (speech start, then speech
    picked at every step whatever the LM prefers, the cap of twice the prompt's length lifted), the voice's
    encoder mean (for every speaker) and fixed noise, so a random checkpoint gives a full run of any length;
    stream k of several speaks its own script with its own noise, batched with the others in `batch`."""
    if decode_group is not None:
        raise VibeVoiceError(f"--decode-group is for realtime bundles; a {bundle.kind} bundle decodes each latent "
                             "as it is made")
    sample = bundle.voice(voice)
    script = parse_script(BENCH_SCRIPTS[stream % len(BENCH_SCRIPTS)])
    prompt = build_prompt(bundle.tokenizer, script, [sample.frames] * len(script.speakers))
    ids = TokenIds.from_tokenizer(bundle.tokenizer)
    noise = NoiseSource.from_seed(BENCH_SEED + stream, bundle.dims.head.latent)

    def latents(loop_backend) -> Iterator[np.ndarray]:  # lazily: the first audio includes the voice and the prefill
        embeds = prompt_embeddings(loop_backend, prompt, [sample.samples] * len(script.speakers), None)
        yield from long_form_frames(loop_backend, embeds, ids, noise, 1.3, 10, frames, result, upstream_cap=False,
                                    choose=lambda step, greedy: ids.start if step == 0 else ids.pad)
    return latents(backend) if batch is None else batch.frames(latents)


class OnnxGuidedLm:
    """Both CFG streams of the LM in one batch-2 call per step, the negative one run speculatively.

    Upstream runs the negative stream only after the positive one has picked `<|vision_pad|>`, on the same
    input. Here every step after the prompt runs both rows at once (the weights are read once); when the pick
    is not `<|vision_pad|>`, the negative row's new position is taken back, which leaves it as if it had
    never run. A `<|vision_start|>` empties the negative row, so its next token sits at position 0 alone.
    """

    def __init__(self, lm: OnnxLm, in_place: bool = True, planned: int | None = None, limit: int = 0):
        self.lm, self.in_place, self.planned, self.limit = lm, in_place, planned, limit
        self.streams: BatchedGuidedStreams | None = None
        self.speculated: tuple[np.ndarray, np.ndarray] | None = None  # (input, negative hidden) of the last step

    def open_streams(self, length: int) -> BatchedGuidedStreams:
        """Two empty rows for a prompt of `length` and the run after it."""
        return BatchedGuidedStreams(self.lm, KvCache.planned(self.lm, 2, length, self.planned, self.limit, self.in_place))

    def prefill(self, embeds):
        self.streams = self.open_streams(embeds.shape[1])
        return self.streams.text(embeds)

    def positive(self, embed):
        self._drop_speculation()
        hidden, negative = self.streams.speech(embed)
        self.speculated = (embed, negative)
        return hidden

    def negative(self, embed):
        if self.speculated is not None and self.speculated[0] is embed:
            hidden, self.speculated = self.speculated[1], None
            return hidden
        self._drop_speculation()
        return self.streams.negative(embed)

    def restart_negative(self):
        self._drop_speculation()
        self.streams.restart(1)

    def _drop_speculation(self):
        if self.speculated is not None:
            self.streams.forget(1)
            self.speculated = None


class OnnxTts15bBackend:
    """Evaluates each 1.5B component with its ONNX graph; KV caches and conv states are lists of arrays."""

    def __init__(self, bundle):
        bundle.require_kind(*LONG_FORM_KINDS)
        self.bundle = bundle
        self.embed_table, scale, bias = bundle.host_tensors("embed_tokens", "speech_scaling_factor", "speech_bias_factor")
        # Large's untied head, memory-mapped like the embedding (only the choice rows are read); else tied
        self.head_table = bundle.host_tensors("lm_head")[0] if bundle.kind == "large" else self.embed_table
        self.scale_factor, self.bias_factor = F32(scale), F32(bias)
        dims = bundle.dims
        self.max_positions = dims.lm.max_positions
        self.train_steps = dims.head.train_steps
        self.voice_std = dims.acoustic_encoder.sample_std
        self.lm = OnnxLm(bundle, "lm")
        self.sessions = {name: bundle.session(name) for name in
                         ("acoustic_connector", "semantic_connector", "acoustic_encoder")}
        self.head = OnnxDiffusionHead(bundle)
        self.decoder = StreamingConv(bundle, "acoustic_decoder_stream")
        self.semantic = StreamingConv(bundle, "semantic_encoder_stream")

    def embed(self, ids):
        return self.embed_table[np.asarray(ids)].astype(F32)[None]

    def choice_logits(self, hidden, ids):
        return self.head_table[ids].astype(F32) @ hidden[0].astype(F32)

    def guided_lm(self, planned=None):
        return OnnxGuidedLm(self.lm, planned=planned, limit=self.max_positions)

    def velocity(self, noisy, timesteps, conditions):
        return self.head.velocity(noisy, timesteps, conditions)

    def head_at(self, conditions, timesteps):
        return self.head.at(conditions, timesteps)

    def encode_voices(self, audio):
        return self.sessions["acoustic_encoder"].run(None, {"audio": np.ascontiguousarray(audio, dtype=F32)})[0]

    def connect_acoustic(self, latents):
        return self.sessions["acoustic_connector"].run(None, {"latents": np.ascontiguousarray(latents, dtype=F32)})[0]

    def connect_semantic(self, features):
        return self.sessions["semantic_connector"].run(None, {"latents": np.ascontiguousarray(features, dtype=F32)})[0]

    def scale(self, latents):
        return ((latents + self.bias_factor) * self.scale_factor).astype(F32)

    def unscale(self, latents):
        return (latents / self.scale_factor - self.bias_factor).astype(F32)

    def new_decoder_state(self):
        return self.decoder.new_state()

    def decode_frames(self, latent, state):
        audio, state = self.decoder.run(latent, state)
        return audio[0, 0], state

    def new_semantic_state(self):
        return self.semantic.new_state()

    def encode_semantic(self, chunk, state):
        return self.semantic.run(chunk[None, None], state)


class LongFormBatch(StreamBatch):
    """Several 1.5B (or Large) generations on one bundle at once (runtime.batch): each step, one LM call for all
    streams' positive and negative rows (two rows each of one shared cache), one diffusion-head conditioning call
    and one call per sampler step, one call of each connector. A prompt's prefill, a lone negative step and the
    streaming decoder and semantic encoder run stream by stream. A script in segments restarts its rows at each.

        batch = tts.batch(max_streams=2)
        speeches = [tts.stream(script, speakers, seed=s, batch=batch) for script, speakers, s in requests]
    """

    def __init__(self, backend: OnnxTts15bBackend, max_streams: int):
        super().__init__(backend, backend.lm, max_streams, 2, min(backend.max_positions, BATCH_CAPACITY),
                         {"connect_acoustic": row_executor(backend.connect_acoustic),
                          "connect_semantic": row_executor(backend.connect_semantic)})


class LongFormMember(MemberBackend):
    """A long-form stream's backend in a LongFormBatch."""

    alone_calls = MemberBackend.alone_calls | {"encode_voices", "decode_frames", "encode_semantic"}

    def guided_lm(self, planned=None):
        return MemberGuidedLm(self)

    def connect_acoustic(self, latents):
        return self._connect("connect_acoustic", latents)

    def connect_semantic(self, features):
        return self._connect("connect_semantic", features)

    def _connect(self, kind: str, latents):
        """One frame's (the loop's per-step input) batched; a voice prompt's many frames alone."""
        if latents.shape[:2] == (1, 1):
            return self._call(kind, np.ascontiguousarray(latents, dtype=F32))
        run = getattr(self.base, kind)
        return self._alone(lambda: run(latents))


class MemberGuidedLm(OnnxGuidedLm):
    """OnnxGuidedLm on a batch member's two rows of the shared cache: its speech steps batched."""

    def __init__(self, backend: LongFormMember):
        super().__init__(backend.batch.lm)
        self.backend = backend

    def open_streams(self, length):
        self.backend.batch.cache.lengths[self.backend.rows] = 0  # this thread's rows: no batch runs while it is here
        return MemberGuidedStreams(self.backend)


LongFormBatch.member_backend = LongFormMember


Speakers = dict | str | VoiceSample  # {script number: voice}, or one voice for a script with one speaker


class LongFormTTS(TtsModel):
    """VibeVoice-1.5B from an ONNX bundle, with onnxruntime and numpy only."""

    kind = "1.5b"

    def _backend(self) -> OnnxTts15bBackend:
        return OnnxTts15bBackend(self.bundle)

    def voice(self, spec: str | Path | VoiceSample) -> VoiceSample:
        """A voice sample: one of the bundle's voices by name, an audio file or URL, or a VoiceSample as it is."""
        return spec if isinstance(spec, VoiceSample) else self.bundle.voice(str(spec))

    def stream(self, script: str, speakers: Speakers, cfg_scale: float = DEFAULTS.cfg_scale,
               steps: int = DEFAULTS.steps, seed: int | None = None, noise: NoiseSource | None = None,
               voice_latents: str = "sample", max_frames: int | None = None,
               batch: LongFormBatch | None = None) -> Speech:
        """Speech of a `Speaker N:` script (or plain text, one speaker). With `batch` (see `batch()`), it runs
        batched with the batch's other streams, to the same audio."""
        cfg_scale, steps = check("cfg_scale", cfg_scale), check("steps", steps)
        max_frames = check_optional("max_frames", max_frames)
        if voice_latents not in VOICE_LATENTS:
            raise VibeVoiceError(f"voice_latents must be one of {', '.join(VOICE_LATENTS)}, got '{voice_latents}'")
        parsed = parse_script(script)
        given = speakers if isinstance(speakers, dict) else {None: speakers}
        voices = [self.voice(spec) for spec in assign_voices(parsed, given)]
        frames_of = [voice.frames for voice in voices]
        prompts = [build_prompt(self.bundle.tokenizer, part, frames_of) for part in self.segments(parsed, frames_of)]
        ids = TokenIds.from_tokenizer(self.bundle.tokenizer)
        if noise is None or voice_latents == "sample":  # the voice noise needs a seed even when `noise` is given
            seed = self.noise_source(seed, None)[1]
        noise, seed = self.noise_source(seed, noise)
        rng = np.random.default_rng([seed, VOICE_NOISE_STREAM]) if voice_latents == "sample" else None
        result = LongFormResult()

        def frames(backend) -> Iterator[np.ndarray]:  # lazily, so time to first audio includes encoding the voices
            yield from segmented_frames(backend, prompts, [v.samples for v in voices], rng, ids, noise, cfg_scale,
                                        steps, max_frames, result)

        speech = Speech(frames(self.backend) if batch is None else batch.frames(frames), result, seed, noise)
        speech.prompt_tokens, speech.voices, speech.segments = len(prompts[0].ids), voices, len(prompts)
        return speech

    def batch(self, max_streams: int = 2) -> LongFormBatch:
        """Room for `max_streams` generations batched step by step on this model (see LongFormBatch)."""
        return LongFormBatch(self.backend, max_streams)

    def segments(self, script: Script, voice_frames: list[int]) -> list[Script]:
        """The script whole or, where its prompt would leave too little of the model's context for the steps
        upstream allows it (twice its length), in consecutive parts of its lines (a line too long cut at
        sentence ends) whose prompts, with all the voices, each take at most a third of the positions."""
        tokenizer = self.bundle.tokenizer
        limit = self.backend.max_positions // (1 + MAX_LENGTH_TIMES)
        if len(build_prompt(tokenizer, script, voice_frames).ids) <= limit:
            return [script]
        cost = lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)  # noqa: E731
        fixed = len(build_prompt(tokenizer, Script(((script.lines[0][0], ""),), script.offset), voice_frames).ids)
        budget = limit - fixed
        if budget < 16:
            raise VibeVoiceError(f"the voice samples take {fixed} of the {limit} prompt positions a part of a script may "
                                 "have here; use shorter voice samples")
        label = lambda number: f" Speaker {number - script.offset}:"  # noqa: E731 (as build_prompt writes a line)
        lines = [(number, piece) for number, text in script.lines
                 for piece in ([text] if cost(f"{label(number)} {text}\n") <= budget
                               else split_text(text, cost, budget - cost(label(number)) - 2))]
        parts: list[list[tuple[int, str]]] = [[]]
        used = 0
        for number, text in lines:
            line = cost(f"{label(number)} {text}\n")
            if parts[-1] and used + line > budget:
                parts.append([])
                used = 0
            parts[-1].append((number, text))
            used += line
        return [Script(tuple(part), script.offset) for part in parts]


class LargeTTS(LongFormTTS):
    """VibeVoice-Large (7B) from an ONNX bundle: the 1.5B's API and loop, its untied head's decisions."""

    kind = "large"


BENCH = (OnnxTts15bBackend, bench_frames, LongFormBatch)  # what `bench` runs of these kinds: runtime.bench.bench_kind
