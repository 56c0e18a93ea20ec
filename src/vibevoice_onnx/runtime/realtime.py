"""Torch-free realtime TTS: the shared generation loop on onnxruntime sessions of a bundle.

    tts = RealtimeTTS("onnx/realtime/cpu_fp32")
    for chunk in tts.stream("Hello there.", voice="en-Davis_man"):
        play(chunk.samples, chunk.sample_rate)
    audio, sample_rate = tts.create("Hello there.", voice="en-Davis_man", seed=7)

    speech = tts.text_stream(voice="en-Davis_man", seed=7)   # text streamed in while audio streams out
    # one thread: for piece in llm_tokens: speech.feed(piece); then speech.finish()
    # another:    for chunk in speech: play(chunk.samples, chunk.sample_rate)

    tts.dialogue("Speaker 1: Hi.\nSpeaker 2: Hello!", {1: "en-Davis_man", 2: "en-Grace_woman"}, seed=7)
"""

from __future__ import annotations

import numpy as np

from ..errors import VibeVoiceError
from ..families import family
from ..generation.common import LmStream, whole_head_at
from ..generation.realtime import POSITIONS_PER_TOKEN, TAIL_FRAMES, GenerationResult, TextSegments, realtime_frames
from ..options import check, check_optional
from ..sampling import NoiseSource
from ..script import assign_voices, parse_script
from ..text import TEXT_WINDOW, TextFeed, encode_tts_text, split_text
from .bundle import Bundle
from .fixed import FixedCache, FixedGuidedStreams, FixedLm, FixedLmStream, TileDecoder
from .batch import BATCH_CAPACITY, MemberBackend, MemberGuidedStreams, StreamBatch, row_executor
from .lm import BatchedGuidedStreams, KvCache, OnnxDiffusionHead, OnnxLm, StreamingConv, flat_cache
from .speech import Speech, TtsModel

F32 = np.float32
DEFAULTS = family("realtime").defaults  # upstream's cfg_scale and steps
# After the first frame, frames are decoded this many at a time: the decoder's weights are then read once per
# group (1.4 GB in fp32 at full size), for audio that arrives in bursts of a group. Measured with `bench`.
DECODE_GROUP = 3
# A text whose speech would pass the upper LM's context is spoken in segments cut at sentence ends, each from the
# voice prompt: a segment's text tokens take their own positions and those of the speech frames their windows
# bring, and some room stays for the speech after its last window (until EOS).
BENCH_TEXTS = (  # stream k of `bench --streams` speaks text k (cycled), with seed BENCH_SEED + k
    "VibeVoice turns text into speech one frame at a time. This benchmark measures how fast the ONNX runtime "
    "speaks compared with the PyTorch reference, on the same weights, with the same voice and the same noise.",
    "Several listeners at once share one model here: each frame, the streams that are speaking read the weights "
    "together, so a second voice costs far less than a second model would, and nobody waits for a turn.",
    "A long afternoon by the river: the boats drift past, a dog barks at the ducks, and somebody laughs on the "
    "bridge while the bells of the old town hall ring out the hour over the water and the roofs.",
    "Numbers, names and places come out as they are written: the train for Edinburgh leaves platform four at "
    "seven minutes past nine, and the return journey takes a little under five hours in all.",
)
BENCH_SEED = 42


def bench_frames(backend, bundle: Bundle, voice: str, frames: int, result: GenerationResult,
                 decode_group: int = DECODE_GROUP, *, stream: int = 0, batch: "RealtimeBatch | None" = None):
    """What `bench` times, on either backend: exactly `frames` frames of a fixed text, voice and noise (EOS
    computed, not acted on, so a random checkpoint that would stop early still gives a full run); stream k of
    several speaks its own text with its own noise, batched with the others in `batch`."""
    text = encode_tts_text(bundle.tokenizer, BENCH_TEXTS[stream % len(BENCH_TEXTS)])

    def run_loop(loop_backend):
        return realtime_frames(loop_backend, bundle.voice(voice), text, NoiseSource.from_seed(BENCH_SEED + stream),
                               1.5, 5, frames, result, stop_on_eos=False, decode_group=decode_group)

    return run_loop(backend) if batch is None else batch.frames(run_loop)


class OnnxRealtimeBackend:
    """Evaluates each component with its ONNX graph; KV caches and conv states are lists of arrays."""

    def __init__(self, bundle: Bundle):
        bundle.require_kind("realtime")
        self.bundle = bundle
        self.embed, types, scale, bias = bundle.host_tensors(
            "embed_tokens", "tts_input_types", "speech_scaling_factor", "speech_bias_factor")
        self.types, self.scale, self.bias = types.astype(F32), F32(scale), F32(bias)
        self.train_steps = bundle.dims.head.train_steps
        self.open_graphs(bundle)

    def open_graphs(self, bundle: Bundle) -> None:
        self.max_positions = bundle.dims.tts_lm.max_positions
        self.sessions = {name: bundle.session(name) for name in bundle.info.graphs}
        self.lms = {name: OnnxLm(bundle, name) for name in ("lower_lm", "upper_lm")}
        self.head = OnnxDiffusionHead(bundle)
        self.decoder = StreamingConv(bundle, "acoustic_decoder_stream")

    def embed_text(self, ids):
        return self.embed[np.asarray(ids)].astype(F32)[None]

    def type_embedding(self, index):
        return self.types[index]

    def stream(self, name: str, layers, in_place: bool = True, planned: int | None = None) -> LmStream:
        """One stream of LM `name` from a voice prompt's (K, V) per layer (`planned`: see KvCache.planned)."""
        lm = self.lms[name]
        cache = KvCache.of_streams(lm, [flat_cache(layers)], in_place, planned, self.max_positions)
        return LmStream(lm.unbatched, cache, layers[0][0].shape[2])

    def text_stream(self, layers, planned=None):
        return self.stream("lower_lm", layers, planned=planned)

    def waited(self, items):
        """Text windows as they come (a batch member waits for them parked: see runtime.batch)."""
        return items

    def guided_streams(self, positive, negative, planned=None):
        lm = self.lms["upper_lm"]
        cache = KvCache.of_streams(lm, [flat_cache(positive), flat_cache(negative)], planned=planned,
                                   limit=self.max_positions)
        return BatchedGuidedStreams(lm, cache)

    def velocity(self, noisy, timesteps, conditions):
        return self.head.velocity(noisy, timesteps, conditions)

    def head_at(self, conditions, timesteps):
        return self.head.at(conditions, timesteps)

    def connect(self, latent):
        return self.sessions["acoustic_connector"].run(None, {"latents": latent.astype(F32)})[0]

    def eos_logit(self, hidden):
        return float(self.sessions["eos_classifier"].run(None, {"hidden_states": hidden.astype(F32)})[0][0, 0])

    def new_decoder_state(self):
        return self.decoder.new_state()

    def decode_frames(self, latent, state):
        audio, state = self.decoder.run(latent, state)
        return audio[0, 0], state

    def unscale(self, latent):
        return (latent / self.scale - self.bias).astype(F32)


class FixedRealtimeBackend(OnnxRealtimeBackend):
    """A bundle of the fixed-shape profile (`build --profile fixed`): the same loop over graphs of static
    shapes (runtime.fixed): caches of the bundle's capacity, which is then the model's context (a generation
    that would pass it ends with max_length), the head at two rows, the decoder in tiles, EOS on the host."""

    def open_graphs(self, bundle: Bundle) -> None:
        self.eos_weights = [w.astype(F32) for w in bundle.host_tensors(
            "eos_classifier.fc1.weight", "eos_classifier.fc1.bias", "eos_classifier.fc2.weight", "eos_classifier.fc2.bias")]
        self.lms = {name: FixedLm(bundle, name) for name in ("lower_lm_text", "upper_lm_text", "upper_lm_step")}
        self.max_positions = self.lms["upper_lm_step"].capacity
        self.sessions = {name: bundle.session(name) for name in ("diffusion_head", "acoustic_connector")}
        self.decoder = TileDecoder(bundle)

    def text_stream(self, layers, planned=None):
        lm = self.lms["lower_lm_text"]
        return FixedLmStream(lm, FixedCache([layers], lm.capacity, "the voice prompt's lower LM"))

    def guided_streams(self, positive, negative, planned=None):
        cache = FixedCache([positive, negative], self.max_positions, "the voice prompt's upper LM")
        return FixedGuidedStreams(self.lms["upper_lm_text"], self.lms["upper_lm_step"], cache)

    def velocity(self, noisy, timesteps, conditions):
        """Any number of rows, two a call (the graph's shape), the last pair padded."""
        rows = len(noisy)
        pad = lambda a: np.concatenate([a, np.zeros((rows % 2, *a.shape[1:]), F32)]).astype(F32)  # noqa: E731
        noisy, timesteps, conditions = pad(noisy), pad(timesteps), pad(conditions)
        head = self.sessions["diffusion_head"]
        out = [head.run(None, {"noisy_latents": noisy[k:k + 2], "timesteps": timesteps[k:k + 2],
                               "condition": conditions[k:k + 2]})[0] for k in range(0, len(noisy), 2)]
        return np.concatenate(out)[:rows]

    def head_at(self, conditions, timesteps):
        return whole_head_at(self.velocity, conditions)

    def decode_frames(self, latent, state):
        return self.decoder.run(latent, state)

    def eos_logit(self, hidden):
        fc1, b1, fc2, b2 = self.eos_weights
        return float((np.maximum(hidden.astype(F32) @ fc1.T + b1, 0) @ fc2.T + b2)[0, 0])


def backend_for(bundle: Bundle) -> OnnxRealtimeBackend:
    """The backend of the bundle's profile."""
    return (FixedRealtimeBackend if bundle.profile == "fixed" else OnnxRealtimeBackend)(bundle)


class RealtimeBatch(StreamBatch):
    """Several realtime generations on one bundle at once (runtime.batch): each step, one upper-LM call for all
    streams' positive and negative rows (two rows each of one shared cache), one diffusion-head conditioning call
    and one call per sampler step, one connector and one EOS call. Text windows (5 tokens of one row:
    onnxruntime's attention takes several rows only one token at a time) and the decoder run stream by stream.

        batch = tts.batch(max_streams=4)
        speeches = [tts.stream(text, voice=v, seed=s, batch=batch) for text, v, s in requests]  # read each anywhere
    """

    def __init__(self, backend: OnnxRealtimeBackend, max_streams: int):
        super().__init__(backend, backend.lms["upper_lm"], max_streams, 2,
                         min(backend.max_positions, BATCH_CAPACITY),
                         {"connect": row_executor(backend.connect), "eos": self._eos})

    def _eos(self, hiddens):
        logits = self.backend.sessions["eos_classifier"].run(None, {"hidden_states": np.concatenate(hiddens)})[0]
        return [float(logit) for logit in logits[:, 0]]


class RealtimeMember(MemberBackend):
    """A realtime stream's backend in a RealtimeBatch."""

    alone_calls = MemberBackend.alone_calls | {"decode_frames"}

    def text_stream(self, layers, planned=None):
        stream = self.base.text_stream(layers, planned)
        run = stream.run
        stream.run = lambda embeds, positions, cache: self._alone(lambda: run(embeds, positions, cache))
        return stream

    def guided_streams(self, positive, negative, planned=None):
        for row, layers in zip(self.rows, (positive, negative)):
            self._alone(lambda row=row, layers=layers: self.batch.cache.load(row, flat_cache(layers)))
        return MemberGuidedStreams(self)

    def connect(self, latent):
        return self._call("connect", latent.astype(F32))

    def eos_logit(self, hidden):
        return self._call("eos", hidden.astype(F32))


RealtimeBatch.member_backend = RealtimeMember


class TextStream(Speech):
    """Speech of a text that streams in: `feed(piece)` and then `finish()` (from any thread) while another
    thread iterates for the audio; `close()` gives up, and a loop waiting for text stops with TextCancelled.
    With the same noise the audio is that of `stream(whole_text)`, however the text was split."""

    def __init__(self, text: TextFeed, frames, result, seed, noise):
        super().__init__(frames, result, seed, noise)
        self.text = text

    def feed(self, piece: str) -> None:
        self.text.feed(piece)

    def finish(self) -> None:
        self.text.finish()

    def close(self) -> None:
        self.text.close()


class Dialogue(Speech):
    """A `Speaker N:` script spoken turn by turn, each turn a fresh generation from its speaker's voice;
    `turns` holds each turn's (speaker, voice, seed, GenerationResult) as it is spoken."""

    def __init__(self, frames, result, seed, turns: list):
        super().__init__(frames, result, seed, None)
        self.turns = turns


class RealtimeTTS(TtsModel):
    """VibeVoice-Realtime from an ONNX bundle, with onnxruntime and numpy only."""

    kind = "realtime"

    def _backend(self) -> OnnxRealtimeBackend:
        return backend_for(self.bundle)

    def stream(self, text: str, voice: str, cfg_scale: float = DEFAULTS.cfg_scale, steps: int = DEFAULTS.steps,
               seed: int | None = None, noise: NoiseSource | None = None, max_frames: int | None = None,
               decode_group: int = DECODE_GROUP, batch: RealtimeBatch | None = None) -> Speech:
        """Speech of `text`; one longer than the model's context is spoken in segments (speech.segments > 1).
        With `batch` (see `batch()`), it runs batched with the batch's other streams, to the same audio."""
        segments = self.segments(text, voice)
        text_ids = segments[0] if len(segments) == 1 else TextSegments(tuple(segments))
        speech = self._speech(text_ids, voice, cfg_scale, steps, seed, noise, max_frames, decode_group, batch)
        speech.segments = len(segments)
        return speech

    def segments(self, text: str, voice: str) -> list[list[int]]:
        """The text's token ids, in one piece or, where its speech would pass the upper LM's context after the
        voice prompt, in pieces cut at sentence ends (words, for a sentence too long) that each fit."""
        tokenizer, ids = self.bundle.tokenizer, encode_tts_text(self.bundle.tokenizer, text)
        prompt_length = self.bundle.voice(voice).tts_lm[0][0].shape[2]
        budget = int((self.backend.max_positions - prompt_length - TAIL_FRAMES) / POSITIONS_PER_TOKEN) - 1  # 1: "\n"
        if len(ids) * POSITIONS_PER_TOKEN + prompt_length + TAIL_FRAMES <= self.backend.max_positions:
            return [ids]
        if budget < TEXT_WINDOW:
            raise VibeVoiceError(f"voice '{voice}' takes {prompt_length} of the model's {self.backend.max_positions} "
                                 "positions, which leaves no room for text; use a shorter voice prompt")
        cost = lambda piece: len(tokenizer.encode(piece, add_special_tokens=False).ids)  # noqa: E731
        return [encode_tts_text(tokenizer, piece) for piece in split_text(text, cost, budget)]

    def text_stream(self, voice: str, cfg_scale: float = DEFAULTS.cfg_scale, steps: int = DEFAULTS.steps,
                    seed: int | None = None, noise: NoiseSource | None = None, max_frames: int | None = None,
                    decode_group: int = DECODE_GROUP, max_chars: int | None = None,
                    batch: RealtimeBatch | None = None) -> TextStream:
        """Speech of a text fed in pieces (see TextStream); each 5-token window runs as soon as it is complete."""
        feed = TextFeed(self.bundle.tokenizer, max_chars)
        speech = self._speech(feed, voice, cfg_scale, steps, seed, noise, max_frames, decode_group, batch)
        return TextStream(feed, speech._frames, speech.result, speech.seed, speech.noise)

    def batch(self, max_streams: int = 4) -> RealtimeBatch:
        """Room for `max_streams` generations batched frame by frame on this model (see RealtimeBatch)."""
        if isinstance(self.backend, FixedRealtimeBackend):
            raise VibeVoiceError(f"{self.bundle.path}: a fixed-shape bundle runs one stream at a time (its graphs "
                                 "have the shapes of one); batch streams on a bundle of the default profile")
        return RealtimeBatch(self.backend, max_streams)

    def dialogue(self, script: str, voices: dict, cfg_scale: float = DEFAULTS.cfg_scale, steps: int = DEFAULTS.steps,
                 seed: int | None = None, max_frames: int | None = None, turn_gap: float = 0.0,
                 decode_group: int = DECODE_GROUP,
                 batch: RealtimeBatch | None = None) -> Dialogue:
        """Speak a `Speaker N:` script, one line a turn: turn k (from 0) is `stream(its text, its speaker's
        voice, seed=seed + k)`, capped at `max_frames`, and `turn_gap` seconds of silence join the turns.
        `voices` maps each speaker number as written to a bundle voice (a None key: a script of one speaker)."""
        parsed = parse_script(script)
        by_speaker = dict(zip(parsed.speakers, assign_voices(parsed, voices)))
        for voice in set(by_speaker.values()):
            self.bundle.voice(voice)  # an unknown voice is refused before any audio
        gap = np.zeros(round(check("turn_gap", turn_gap) * self.sample_rate), F32)
        _, seed = self.noise_source(seed, None)
        if seed + len(parsed.lines) - 1 > 2**63 - 1:
            raise VibeVoiceError(f"seed {seed} + {len(parsed.lines) - 1} turns exceeds the largest seed")
        result, turns = GenerationResult(), []
        speeches = [(number, by_speaker[number], seed + k, text) for k, (number, text) in enumerate(parsed.lines)]

        def frames():
            for number, voice, turn_seed, text in speeches:
                speech = self.stream(text, voice, cfg_scale, steps, turn_seed, None, max_frames, decode_group, batch)
                speech.result.keep_audio = result.keep_audio  # a streamed dialogue holds no turn's audio either
                turns.append((number, voice, turn_seed, speech.result))
                for frame, samples in enumerate(speech._frames):
                    if frame == 0 and len(turns) > 1:
                        samples = np.concatenate([gap, samples])
                    result.add(speech.result.latents[frame], samples)
                    yield samples
                result.stop_reason = speech.result.stop_reason

        return Dialogue(frames(), result, seed, turns)

    def _speech(self, text_ids, voice: str, cfg_scale: float, steps: int, seed: int | None, noise: NoiseSource | None,
                max_frames: int | None, decode_group: int, batch: RealtimeBatch | None = None) -> Speech:
        cfg_scale, steps = check("cfg_scale", cfg_scale), check("steps", steps)
        max_frames, decode_group = check_optional("max_frames", max_frames), check("decode_group", decode_group)
        prompt = self.bundle.voice(voice)
        noise, seed = self.noise_source(seed, noise)
        result = GenerationResult()
        def run_loop(backend):
            text = backend.waited(text_ids) if isinstance(text_ids, TextFeed) else text_ids
            return realtime_frames(backend, prompt, text, noise, cfg_scale, steps, max_frames, result,
                                   decode_group=decode_group)

        frames = run_loop(self.backend) if batch is None else batch.frames(run_loop)
        return Speech(frames, result, seed, noise)


BENCH = (backend_for, bench_frames, RealtimeBatch)  # what `bench` runs of this kind: runtime.bench.bench_kind
