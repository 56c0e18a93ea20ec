"""`POST /v1/audio/transcriptions` on ASR bundles: the multipart form as OpenAI's client (and LiteLLM) send
it, the upload decoded whatever its format, and the transcript in OpenAI's shapes or streamed as SSE."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import VibeVoiceError
from ..families import family
from ..generation.asr_streaming import MAX_TOKENS_PER_CHUNK, chunk_segments
from ..runtime.asr import MAX_NEW_TOKENS, Transcript, joined
from ..transcription import Segment, parse_transcript, render
from .codec import decode_upload
from ..requests import RequestError, TranscriptionRequest
from .fields import api_error, option, served_model, take
from .http import ApiError
from .models import Models, ServedModel

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
# The form fields read here; others (OpenAI's `include[]`, `chunking_strategy`...) are ignored, as by OpenAI.
TEXT_FIELDS = ("model", "response_format", "prompt", "language", "temperature", "stream", "seed", "mean_latents",
               "max_new_tokens", "repetition_guard")
NOT_A_TRANSCRIPT = "the model's output is not a JSON transcript"


@dataclass
class TranscriptionCall:
    """A transcription as the server takes it: the model, the request's options, and the response."""

    model: ServedModel
    response_format: str
    prompt: str | None
    language: str | None
    stream: bool
    options: dict  # seed, mean_latents, max_new_tokens, repetition_guard


def granularities(form) -> list[str]:
    """`timestamp_granularities` as `key[]=v` repeated (OpenAI's client), the bare key (LiteLLM), or both."""
    values = [*form.getlist("timestamp_granularities[]"), *form.getlist("timestamp_granularities")]
    return [v.strip() for value in values for v in str(value).split(",") if v.strip()]


def parse_transcription(form, models: Models) -> TranscriptionCall:
    fields = {key: form.get(key) for key in form.keys() if key in TEXT_FIELDS}
    for key, value in fields.items():
        if not isinstance(value, str):
            raise ApiError(422, f"'{key}' must be a text field, not a file", param=key, code="invalid_type")
    model = served_model(models, take(fields, "model", str, required=True), "asr")
    fmt = take(fields, "response_format", str, default="json", choices=RESPONSE_FORMATS)
    for granularity in granularities(form):
        if granularity == "word":
            raise ApiError(400, "word timestamps are not available: VibeVoice-ASR writes timestamps per segment "
                           "only; ask for 'segment'", param="timestamp_granularities", code="unsupported_value")
        if granularity != "segment":
            raise ApiError(400, f"timestamp_granularities must be 'segment', got '{granularity}'",
                           param="timestamp_granularities", code="invalid_value")
    temperature = take(fields, "temperature", float, default=0.0)
    if not 0.0 <= temperature <= 1.0:
        raise ApiError(400, f"'temperature' must be from 0 to 1, got {temperature:g} (decoding is greedy whatever "
                       "it is)", param="temperature", code="invalid_value")
    request = TranscriptionRequest(take(fields, "prompt", str), take(fields, "seed", float),
                                   take(fields, "max_new_tokens", float),
                                   take(fields, "mean_latents", bool, default=False),
                                   take(fields, "repetition_guard", bool, default=True))
    try:
        options = request.options()
    except RequestError as e:
        raise api_error(e) from None
    options.setdefault("max_new_tokens", MAX_NEW_TOKENS)
    return TranscriptionCall(model, fmt, options.pop("hotwords"), take(fields, "language", str),
                             take(fields, "stream", bool, default=False), options)


def load_upload(path: str) -> tuple[np.ndarray, int]:
    """The upload's samples, or a 400 with one sentence: empty, undecodable or silent."""
    try:
        samples, rate = decode_upload(path)
    except ValueError as e:
        raise ApiError(400, f"the uploaded file is not audio this server can decode ({e})", param="file",
                       code="invalid_file") from None
    if samples.size == 0:
        raise ApiError(400, "the uploaded file holds no audio (zero samples)", param="file", code="empty_file")
    if not np.isfinite(samples).all():
        raise ApiError(400, "the uploaded file holds NaN or infinite samples", param="file", code="invalid_file")
    if not np.any(samples):
        raise ApiError(400, "the uploaded audio is silent, so there is nothing to transcribe", param="file",
                       code="silent_file")
    return samples, rate


class SegmentStream:
    """The transcript text as it becomes known while tokens decode: a segment's text once the segment is
    complete in the model's JSON. `finish` gives what is left (all of it when the output holds no transcript),
    so the deltas always add up to the final `text`."""

    def __init__(self):
        self.sent, self.count = "", 0

    def update(self, decoded: str, final: bool = False) -> tuple[str, list[tuple[int, Segment]]]:
        """The new text and the newly complete segments, with their ids. parse_transcript keeps only complete JSON objects
        of an array still being written, so a segment it gives never changes afterwards."""
        try:
            segments, _ = parse_transcript(decoded)
        except VibeVoiceError:
            segments = []
        new = list(enumerate(segments[self.count:], start=self.count))
        self.count += len(new)
        text = transcript_text(segments, decoded) if final else join(segments)
        delta = text[len(self.sent):] if text.startswith(self.sent) else ""
        self.sent += delta
        return delta, new


def join(segments: list[Segment]) -> str:
    return " ".join(s.text for s in segments if s.text)


def transcript_text(segments: list[Segment], decoded: str) -> str:
    return join(segments) if segments else decoded.strip()


def respond(transcript: Transcript, request: TranscriptionCall, fmt: str | None = None):
    """The transcript in the asked shape (or `fmt`): a dict (JSON) or a string (text, srt, vtt)."""
    fmt = fmt or request.response_format
    text = readable_text(transcript)
    warning = _warning(transcript)
    if fmt in ("srt", "vtt"):
        return render(fmt, transcript.segments, transcript.text, transcript.raw)
    if fmt == "text":
        return text + "\n"
    body = {"text": text, "usage": {"type": "duration", "seconds": math.ceil(transcript.audio_seconds)},
            "repetition": transcript.repetition.as_dict()}
    if fmt == "verbose_json":
        body = {"task": "transcribe", "language": request.language or "unknown",
                "duration": round(transcript.audio_seconds, 3), "text": text,
                "segments": [_segment(i, s) for i, s in enumerate(transcript.segments)], "raw_text": transcript.raw,
                "usage": body["usage"], "repetition": body["repetition"]}
    if warning:
        body["warning"] = warning
    return body


def readable_text(transcript: Transcript) -> str:
    """What was said, as every front-end gives it: the segments' texts (no times, no speakers), or the decoded
    text where the output held no transcript."""
    return transcript.readable if transcript.readable is not None else transcript_text(transcript.segments,
                                                                                       transcript.text)


def _warning(transcript: Transcript) -> str | None:
    if not transcript.segments and transcript.readable is None:
        return joined(f"{NOT_A_TRANSCRIPT}: 'text' is the decoded text without special tokens, and there are no "
                      "segments", transcript.repetition.describe())
    return transcript.note


def _segment(index: int, segment: Segment) -> dict:
    fields = asdict(segment)
    start = fields["start"] or 0.0
    return {"id": index, "seek": 0, "start": start, "end": fields["end"] if fields["end"] is not None else start,
            "text": fields["text"], "tokens": [], "temperature": 0.0, "speaker": fields["speaker"]}


def transcribe_job(request: TranscriptionCall, samples: np.ndarray, rate: int, stream: bool):
    """The worker's job: transcribe; with `stream`, emit (delta, new segments) while tokens decode."""
    model = request.model
    if family(model.kind).streams_audio:
        return chunk_job(request, samples, rate, stream)
    decode = model.runner.tokenizer.decode
    segments = SegmentStream()

    def job(emit):
        def on_token(tokens):
            if not stream:  # a heartbeat, so the route can notice a client that left and stop the decoding
                if len(tokens) % 8 == 0:
                    emit(None)
                return
            delta, new = segments.update(decode(tokens, skip_special_tokens=True))
            if delta or new:
                emit((delta, new))

        transcript = model.runner.transcribe(samples, sample_rate=rate, hotwords=request.prompt, on_token=on_token,
                                             **request.options, **model.batched)
        if stream:
            emit(segments.update(transcript.text, final=True))
        return transcript

    return job


def chunk_job(request: TranscriptionCall, samples: np.ndarray, rate: int, stream: bool):
    """transcribe_job on an ASR-Streaming model: its text comes chunk by chunk (a delta each, with the chunk's
    segments); `max_new_tokens` caps each chunk's text (at most upstream's 256)."""
    options = dict(request.options)
    options["max_tokens_per_chunk"] = min(options.pop("max_new_tokens"), MAX_TOKENS_PER_CHUNK)

    def job(emit):
        count, speaker = [0], [None]

        def on_chunk(chunk):
            if not stream:
                emit(None)  # the heartbeat (see transcribe_job)
                return
            segments = chunk_segments(chunk, speaker[0])
            speaker[0] = chunk.speaker
            emit((chunk.text, list(enumerate(segments, start=count[0]))))
            count[0] += len(segments)

        return request.model.runner.transcribe(samples, rate, hotwords=request.prompt, on_chunk=on_chunk, **options)

    return job


LIVE_FIELDS = ("model", "context_info", "prompt", "max_tokens", "seed", "mean_latents", "sample_rate", "format",
               "repetition_guard")
PCM_FORMATS = {"f32le": "<f4", "s16le": "<i2"}  # upstream's socket takes float32; arecord's S16_LE too


@dataclass
class LiveRequest:
    model: ServedModel
    hotwords: str | None
    options: dict  # for StreamingTranscriber: seed, mean_latents, max_tokens_per_chunk, repetition_guard
    sample_rate: int
    dtype: str

    def samples(self, data: bytes) -> np.ndarray:
        width = np.dtype(self.dtype).itemsize
        if len(data) % width:
            raise VibeVoiceError(f"a binary message holds whole {self.dtype} samples: {len(data)} bytes is not a "
                                 f"multiple of {width}")
        samples = np.frombuffer(data, self.dtype)
        return samples.astype(np.float32) / 32768.0 if self.dtype == "<i2" else samples


def parse_live(config, models: Models) -> LiveRequest:
    """The live socket's first message: upstream's /v1/stream keys (context_info, max_tokens) and ours (model,
    prompt for the hotwords, seed, mean_latents, sample_rate, format, repetition_guard). Without `model`, the first
    ASR-Streaming model served."""
    if not isinstance(config, dict):
        raise ApiError(400, "the first message is a JSON object of settings ({} for the defaults)")
    unknown = sorted(set(config) - set(LIVE_FIELDS))
    if unknown:
        raise ApiError(400, f"unknown setting(s) {', '.join(unknown)} (known: {', '.join(LIVE_FIELDS)})", param=unknown[0])
    name = take(config, "model", str)
    model = served_model(models, name, "asr") if name else next(
        (m for m in models.by_id.values() if family(m.kind).streams_audio), None)
    if model is None or not family(model.kind).streams_audio:
        raise ApiError(400, f"model '{model.id if model else 'none'}' is not an ASR-Streaming model: live transcription "
                       "needs one (vibevoice-onnx build on a VibeVoice-ASR-Streaming checkpoint)", param="model")
    hotwords = take(config, "context_info", str) or take(config, "prompt", str)
    per_chunk = option({"max_tokens_per_chunk": config.get("max_tokens")}, "max_tokens_per_chunk", MAX_TOKENS_PER_CHUNK)
    options = {"seed": option(config, "seed"), "mean_latents": take(config, "mean_latents", bool, default=False),
               "max_tokens_per_chunk": per_chunk,
               "repetition_guard": take(config, "repetition_guard", bool, default=True)}
    rate = option(config, "sample_rate", model.bundle.streaming_geometry.sample_rate)
    pcm = take(config, "format", str, default="f32le", choices=tuple(PCM_FORMATS))
    return LiveRequest(model, hotwords, options, rate, PCM_FORMATS[pcm])


END, CLOSE = "end", "close"


def live_job(request: LiveRequest, pieces):
    """The worker's job for a live socket: a session fed the PCM pieces `pieces` (a queue.Queue) hands it,
    each chunk emitted as it is decoded; END flushes the tail and returns the session, CLOSE abandons it."""

    def job(emit):
        session = request.model.runner.session(request.hotwords, **request.options)
        while (piece := pieces.get()) is not CLOSE:
            for chunk in session.finish() if piece is END else session.feed(piece, request.sample_rate):
                emit(chunk)
            if piece is END:
                return session
        return None

    return job
