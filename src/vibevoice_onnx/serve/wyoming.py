"""Home Assistant's Wyoming protocol over the served models (the `wyoming` extra; `vibevoice-onnx wyoming`).

`describe` → `info`; `synthesize` (and its streaming form) → audio as the frames decode; `transcribe` and audio →
a `transcript` (ASR-Streaming: its chunks too, as they decode). The events are the `wyoming` package's; requests
go through the server's request layer (the same fields, limits and sentences as HTTP's) and their jobs through
the same admission and worker threads (ServerState). What is ours: reading events with a bound on every length
(the package's reader trusts the lengths a client sends), and a connection's state."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import re
import socket
from dataclasses import dataclass, field
from importlib.metadata import version

import numpy as np
from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import AsrModel, AsrProgram, Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from ..errors import VibeVoiceError, cannot_listen, listen_address
from ..families import family
from ..generation.asr_streaming import MAX_TOKENS_PER_CHUNK
from ..requests import RequestError, Spelling, TranscriptionRequest, checked
from ..runtime.asr import MAX_NEW_TOKENS
from ..script import parse_script
from . import transcriptions as asr_route
from .app import ServerState, Settings
from .http import ApiError, parse_json
from .models import Models, ServedModel
from .speech import encode_job, parse_speech, start

log = logging.getLogger("vibevoice_onnx.serve.wyoming")
RATE, WIDTH, CHANNELS = 24000, 2, 1  # what the speaking models decode: 24 kHz 16-bit mono
MAX_LINE = 64 * 1024  # an event's header line (asyncio's own default limit, said here)
MAX_DATA = MAX_PAYLOAD = 1 << 20  # its extra JSON data, and its payload (an audio chunk is a few KiB)
SAMPLE_TYPES = {2: "<i2", 4: "<i4"}  # audio-start's width: 16-bit (what satellites send) or 32-bit PCM
MAX_CHANNELS = 8
SPELLING = Spelling(name=lambda name: {"sample_rate": "audio-start's rate"}.get(name, name))
ATTRIBUTION = Attribution(name="Microsoft VibeVoice, run by vibevoice-onnx", url="https://github.com/microsoft/VibeVoice")
EVENTS = ("describe", "synthesize", "synthesize-start/chunk/stop", "transcribe", "audio-start/chunk/stop", "ping")


# ---- what the server offers ----

def voice_languages(model: ServedModel, voice: str) -> list[str]:
    """A voice's language: its name's prefix where it has one (upstream's presets: en-Carter_man, de-Spk0_man),
    else the languages of its model's kind."""
    prefix = re.match(r"([a-z]{2})-", voice)
    return [prefix.group(1)] if prefix else list(family(model.kind).languages)


def info(models: Models) -> Info:
    """A TTS program per speaking model with its voices (realtime: streamed text), an ASR program per transcribing
    model (ASR-Streaming: streamed transcripts)."""
    package = version("vibevoice-onnx")

    def described(model: ServedModel) -> dict:
        return dict(name=model.id, attribution=ATTRIBUTION, installed=True, version=package,
                    description=f"{family(model.kind).title}, {model.bundle.info.precision}")

    tts = [TtsProgram(**described(model), supports_synthesize_streaming=family(model.kind).capabilities.streams,
                      voices=[TtsVoice(name=voice, attribution=ATTRIBUTION, installed=True, version=None,
                                       description=None, languages=voice_languages(model, voice))
                              for voice in model.voices()])
           for model in models.doing("tts")]
    asr = [AsrProgram(**described(model), supports_transcript_streaming=family(model.kind).streams_audio,
                      models=[AsrModel(**described(model), languages=list(family(model.kind).languages))])
           for model in models.doing("asr")]
    return Info(tts=tts, asr=asr)


def choose_voice(models: Models, voice) -> tuple[ServedModel, str]:
    """The speaking model and its voice(s) for a synthesize event's `voice` ({name, language}): the model that has
    the (first) named voice, a comma list giving a script's speakers in order; without a name, the first voice in
    the language asked, else the first speaking model's first voice."""
    candidates = [model for model in models.doing("tts") if model.voices()]
    if not candidates:
        raise ApiError(400, "no served model has a voice: import one with `vibevoice-onnx voices import`",
                       code="no_voices")
    name = getattr(voice, "name", None)
    if not name:
        language = (getattr(voice, "language", None) or "").split("-")[0].split("_")[0].lower()
        for model in candidates:
            for known in model.voices():
                if language in voice_languages(model, known):
                    return model, known
        return candidates[0], candidates[0].voices()[0]
    if not isinstance(name, str):
        raise ApiError(400, f"voice.name must be text, got {name!r}", code="invalid_value")
    first = name.split(",")[0].strip()
    for model in candidates:
        if model.alias(first) in model.voices():
            return model, name
    known = sorted({v for m in candidates for v in m.voices()})
    raise ApiError(400, f"voice {first!r} is no voice of this server (voices: {', '.join(known)})",
                   code="voice_not_found")


def transcribing_model(models: Models, name: str | None) -> ServedModel:
    """The model a transcribe event names (a served id, or OpenAI's whisper-1 ...), else the first one served."""
    if name:
        return models.get(name, "asr")
    served = models.doing("asr")
    if not served:
        raise ApiError(400, "this server transcribes nothing: serve a VibeVoice-ASR or ASR-Streaming model as well",
                       code="no_transcription")
    return served[0]


# ---- reading events, every length bounded ----

class Refused(Exception):
    """A client's bytes that are no Wyoming event: answered with an error event, then the connection closes."""


async def read_event(reader: asyncio.StreamReader) -> Event | None:
    """The next event, None at the end of the stream. Each length is checked before anything is read, so a client
    gets no further than MAX_LINE + MAX_DATA + MAX_PAYLOAD bytes into the server's memory per event."""
    try:
        line = await reader.readline()
    except ValueError:  # asyncio's LimitOverrunError: no newline within the reader's limit
        raise Refused(f"an event's header line is longer than {MAX_LINE // 1024} KiB") from None
    if not line.endswith(b"\n"):
        return None  # the end of the stream, or a line cut short by it
    header = _json_object(line, "header line")
    if not isinstance(header.get("type"), str):
        raise Refused("an event's header line needs a string \"type\"")
    data = header.get("data") or {}
    if not isinstance(data, dict):
        raise Refused("an event's \"data\" is a JSON object")
    extra = await _part(reader, header, "data_length", MAX_DATA)
    if extra:
        data = {**data, **_json_object(extra, "data")}
    payload = await _part(reader, header, "payload_length", MAX_PAYLOAD)
    return Event(type=header["type"], data=data, payload=payload or None)


def _json_object(raw: bytes, what: str) -> dict:
    try:
        value = parse_json(raw, f"an event's {what}")
    except ApiError as e:
        raise Refused(e.message) from None
    if not isinstance(value, dict):
        raise Refused(f"an event's {what} is a JSON object")
    return value


async def _part(reader: asyncio.StreamReader, header: dict, key: str, limit: int) -> bytes:
    length = header.get(key)
    if length is None:
        return b""
    if not isinstance(length, int) or isinstance(length, bool) or not 0 <= length <= limit:
        raise Refused(f"\"{key}\" must be a whole number of bytes from 0 to {limit}, got {length!r}")
    return await reader.readexactly(length)  # IncompleteReadError: the client left in the middle of the event


def parsed(kind, event: Event):
    """The event as the `wyoming` package reads it, or a 400 naming the field it lacks."""
    try:
        return kind.from_event(event)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ApiError(400, f"a {event.type} event with a missing or malformed field ({type(e).__name__}: {e})",
                       code="invalid_event") from None


# ---- one connection ----

@dataclass
class Service:
    """What every connection shares: the server's state (models, limits, workers, admission), the seed, and
    the cap on a transcript's tokens."""

    state: ServerState
    seed: int | None = None
    max_new_tokens: int | None = None
    connections: set = field(default_factory=set)


@dataclass
class Speaking:
    """A streamed synthesis: its generation, fed as synthesize-chunks come, and the task sending its audio."""

    generation: object
    sending: asyncio.Task


@dataclass
class Listening:
    """Audio coming in for a transcription: its format, what has come so far, and (ASR-Streaming) the session's
    job and the task sending its chunks."""

    model: ServedModel
    asked: Transcribe
    hotwords: str | None
    rate: int
    width: int
    channels: int
    pieces: list = field(default_factory=list)  # non-streaming: the samples, kept for audio-stop
    received: int = 0  # bytes, against --max-upload-mb
    live: queue.Queue | None = None  # ASR-Streaming: the session's input
    sending: asyncio.Task | None = None

    def samples(self, chunk: AudioChunk) -> np.ndarray:
        """The chunk as float mono samples, its format checked against audio-start's."""
        if (chunk.rate, chunk.width, chunk.channels) != (self.rate, self.width, self.channels):
            raise ApiError(400, f"an audio-chunk of {chunk.rate} Hz, {chunk.width} bytes, {chunk.channels} channel(s) "
                           f"inside audio-start's {self.rate} Hz, {self.width} bytes, {self.channels} channel(s)",
                           code="invalid_audio")
        data = chunk.audio or b""
        frame = self.width * self.channels
        if len(data) % frame:
            raise ApiError(400, f"an audio-chunk holds whole frames of {frame} bytes ({self.width}-byte samples, "
                           f"{self.channels} channel(s)): {len(data)} bytes is not a multiple", code="invalid_audio")
        pcm = np.frombuffer(data, SAMPLE_TYPES[self.width]).reshape(-1, self.channels)
        return (pcm.mean(axis=1) / float(2 ** (8 * self.width - 1))).astype(np.float32)


class Connection(AsyncEventHandler):
    """One client: its events answered in order. A wrong request is an error event and the connection goes on;
    bytes that are no event, an unexpected failure or a stream left silent for --body-timeout close it; each of
    these is one log line, never a traceback."""

    def __init__(self, service: Service, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        super().__init__(reader, writer)
        self.service, self.state = service, service.state
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "client")
        self.speaking: Speaking | None = None
        self.asked: Transcribe | None = None
        self.listening: Listening | None = None
        self.pumps: set = set()
        self.in_event, self.task = False, None

    async def run(self) -> None:
        self.task = asyncio.current_task()
        self.service.connections.add(self)
        try:
            while not self.state.settings.stopping.is_set():
                event = await self._next()
                if event is None:
                    break
                self.in_event = True
                try:
                    await self.handle_event(event)
                finally:
                    self.in_event = False
        except Refused as e:
            log.warning("wyoming %s: %s; closing the connection", self.peer, e)
            await self._say(Error(text=str(e), code="invalid_event"))
        except (ConnectionError, asyncio.IncompleteReadError):
            log.info("wyoming %s: the client went away", self.peer)
        except Exception as e:  # noqa: BLE001 - the last line of defence: one log line, the client told
            log.error("wyoming %s: %s: %s; closing the connection", self.peer, type(e).__name__, e)
            log.debug("wyoming %s: the failure's traceback", self.peer, exc_info=True)
            await self._say(Error(text="the server failed to answer this request (its log says why)",
                                  code="internal_error"))
        finally:
            self.service.connections.discard(self)
            await self.disconnect()
            self.writer.close()

    async def _next(self) -> Event | None:
        """The next event; while a stream is open it must come within --body-timeout."""
        if self.speaking is None and self.listening is None:
            return await read_event(self.reader)
        timeout = self.state.settings.body_timeout
        try:
            return await asyncio.wait_for(read_event(self.reader), timeout)
        except asyncio.TimeoutError:
            raise Refused(f"nothing came for {timeout:g} s while a stream was open (--body-timeout)") from None

    async def _say(self, event) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.write_event(event.event())

    async def handle_event(self, event: Event) -> bool:
        try:
            await self._answer(event)
        except (RequestError, ApiError, VibeVoiceError) as error:
            text, code = _sentence(error)
            log.info("wyoming %s: %s: %s", self.peer, event.type, text)
            await self.write_event(Error(text=text, code=code).event())
        return True

    async def _answer(self, event: Event) -> None:
        kind = event.type
        if Describe.is_type(kind):
            await self.write_event(info(self.state.models).event())
        elif Ping.is_type(kind):
            await self.write_event(Pong(text=parsed(Ping, event).text).event())
        elif Synthesize.is_type(kind):
            await self._synthesize(parsed(Synthesize, event))
        elif SynthesizeStart.is_type(kind):
            self._start_speaking(parsed(SynthesizeStart, event))
        elif SynthesizeChunk.is_type(kind):
            await self._feed_text(parsed(SynthesizeChunk, event).text)
        elif SynthesizeStop.is_type(kind):
            await self._stop_speaking()
        elif Transcribe.is_type(kind):
            self.asked = parsed(Transcribe, event)
        elif AudioStart.is_type(kind):
            await self._start_listening(parsed(AudioStart, event))
        elif AudioChunk.is_type(kind):
            await self._hear(parsed(AudioChunk, event))
        elif AudioStop.is_type(kind):
            await self._stop_listening()
        else:
            raise ApiError(400, f"unknown event type {kind[:64]!r} (this server answers {', '.join(EVENTS)})",
                           code="unknown_event")

    # -- speech --

    def _speech(self, text, voice, streamed: bool):
        """The generation a synthesize event asks for, through the server's request layer (its fields, limits)."""
        model, names = choose_voice(self.state.models, voice)
        if streamed and not family(model.kind).capabilities.streams:
            raise ApiError(400, f"model '{model.id}' speaks whole texts only: send it one synthesize event (realtime "
                           "models take streamed text)", code="unsupported_value")
        if "," not in names and family(model.kind).capabilities.long_form and not streamed:
            names = ",".join([names] * _speakers(text))  # one voice named for a script: every speaker's
        settings = self.state.settings
        body = {"model": model.id, "input": text, "voice": names, "seed": self.service.seed}
        return start(parse_speech(body, self.state.models, settings.max_input_chars, settings.max_frames,
                                  text_required=not streamed))

    async def _synthesize(self, synthesize: Synthesize) -> None:
        if self.speaking is not None:
            return  # the copy a streaming client also sends, for servers that do not stream: ignored
        await self._send_audio(self._speech(synthesize.text, synthesize.voice, streamed=False))

    def _start_speaking(self, begin: SynthesizeStart) -> None:
        if self.speaking is not None:
            raise ApiError(400, "a synthesize-start came while a streamed synthesis was open: send synthesize-stop "
                           "first", code="invalid_event")
        generation = self._speech("", begin.voice, streamed=True)
        self.speaking = Speaking(generation, asyncio.create_task(self._send_audio(generation)))

    async def _feed_text(self, text: str) -> None:
        if self.speaking is None:
            raise ApiError(400, "a synthesize-chunk came outside a streamed synthesis: send synthesize-start first",
                           code="invalid_event")
        try:
            self.speaking.generation.feed(text)
        except BaseException:
            await self._end_speaking()
            raise

    async def _stop_speaking(self) -> None:
        if self.speaking is None:
            raise ApiError(400, "a synthesize-stop came without synthesize-start", code="invalid_event")
        speaking, self.speaking = self.speaking, None
        speaking.generation.finish()
        await speaking.sending
        await self.write_event(SynthesizeStopped().event())

    async def _end_speaking(self) -> None:
        speaking, self.speaking = self.speaking, None
        if speaking is not None:
            speaking.generation.close()
            speaking.sending.cancel()
            with contextlib.suppress(BaseException):
                await speaking.sending

    @contextlib.contextmanager
    def _held(self, pump):
        """A job of this connection's, stopped when its sender is done (or the connection ends: disconnect)."""
        self.pumps.add(pump)
        try:
            yield pump
        finally:
            pump.stop()
            self.pumps.discard(pump)

    async def _send_audio(self, generation) -> None:
        """audio-start, an audio-chunk per decoded piece as it comes, audio-stop; a generation slot held meanwhile."""
        settings = self.state.settings
        with self._held(await self.state.run(encode_job(generation, "pcm", False, settings.stopping),
                                             on_stop=getattr(generation, "close", None))) as pump:
            await self.write_event(AudioStart(rate=RATE, width=WIDTH, channels=CHANNELS).event())
            async for data in pump:
                await self.write_event(AudioChunk(rate=RATE, width=WIDTH, channels=CHANNELS, audio=data).event())
            await self.write_event(AudioStop().event())

    # -- transcription --

    async def _start_listening(self, begin: AudioStart) -> None:
        if self.listening is not None:
            raise ApiError(400, "an audio-start came while audio was coming: send audio-stop first",
                           code="invalid_event")
        if begin.width not in SAMPLE_TYPES or not isinstance(begin.channels, int) or \
                not 1 <= begin.channels <= MAX_CHANNELS:
            raise ApiError(400, f"audio of {begin.width!r}-byte samples and {begin.channels!r} channel(s) is not taken: "
                           f"send 16-bit (width 2) or 32-bit (width 4) PCM, 1 to {MAX_CHANNELS} channels",
                           code="invalid_audio")
        rate = checked("sample_rate", begin.rate)
        asked, self.asked = self.asked or Transcribe(), None
        model = transcribing_model(self.state.models, asked.name)
        hotwords = ", ".join([*(asked.transcript_names or []), *(asked.transcript_terms or [])]) or None
        listening = Listening(model, asked, hotwords, rate, begin.width, begin.channels)
        if family(model.kind).streams_audio:
            await self._open_session(listening)
        self.listening = listening

    async def _open_session(self, listening: Listening) -> None:
        """ASR-Streaming: the session starts with the audio; each chunk's text goes out as it is decoded."""
        per_chunk = min(self.service.max_new_tokens or MAX_TOKENS_PER_CHUNK, MAX_TOKENS_PER_CHUNK)
        options = {"seed": self.service.seed, "mean_latents": False, "max_tokens_per_chunk": per_chunk,
                   "repetition_guard": True}
        request = asr_route.LiveRequest(listening.model, listening.hotwords, options, listening.rate, "<f4")
        listening.live = pieces = queue.Queue()
        pump = await self.state.run(asr_route.live_job(request, pieces), on_stop=lambda: pieces.put(asr_route.CLOSE))
        self.pumps.add(pump)  # held from here: disconnect stops it even before its sender starts
        await self.write_event(TranscriptStart(language=listening.asked.language).event())

        async def send_chunks():
            with self._held(pump):
                async for chunk in pump:
                    await self.write_event(TranscriptChunk(text=chunk.text).event())
                return pump.result

        listening.sending = asyncio.create_task(send_chunks())

    async def _hear(self, chunk: AudioChunk) -> None:
        listening = self.listening
        if listening is None:
            raise ApiError(400, "an audio-chunk came before audio-start: send transcribe (optional), audio-start, "
                           "the chunks, then audio-stop", code="invalid_event")
        limit = int(self.state.settings.max_upload_mb * 2**20)
        try:
            samples = listening.samples(chunk)
            listening.received += len(chunk.audio or b"")
            if listening.received > limit:
                raise ApiError(413, f"the audio is over the limit of {self.state.settings.max_upload_mb:g} MB "
                               "(--max-upload-mb)", code="too_large")
        except ApiError as e:
            await self._end_listening()
            raise ApiError(e.status, e.message + "; the audio is dropped: start again with audio-start",
                           code=e.code) from None
        if listening.live is not None:
            listening.live.put(samples)
        else:
            listening.pieces.append(samples)

    async def _stop_listening(self) -> None:
        listening, self.listening = self.listening, None
        if listening is None:
            raise ApiError(400, "an audio-stop came without audio-start", code="invalid_event")
        language = listening.asked.language
        if listening.live is not None:
            listening.live.put(asr_route.END)
            session = await listening.sending
            text = asr_route.readable_text(session.transcript()) if session is not None else ""
            await self.write_event(Transcript(text=text, language=language).event())
            await self.write_event(TranscriptStop().event())
            return
        await self.write_event(Transcript(text=await self._transcribe(listening), language=language).event())

    async def _transcribe(self, listening: Listening) -> str:
        """The whole recording's text (as HTTP's `text`); silence is an empty transcript, as a voice assistant
        expects when nobody spoke."""
        samples = np.concatenate(listening.pieces) if listening.pieces else np.zeros(0, np.float32)
        if samples.size == 0:
            raise ApiError(400, "no audio came between audio-start and audio-stop", code="empty_audio")
        if not np.any(samples):
            return ""
        options = TranscriptionRequest(listening.hotwords, self.service.seed, self.service.max_new_tokens).options()
        options.setdefault("max_new_tokens", MAX_NEW_TOKENS)
        call = asr_route.TranscriptionCall(listening.model, "json", options.pop("hotwords"), listening.asked.language,
                                           False, options)
        with self._held(await self.state.run(asr_route.transcribe_job(call, samples, listening.rate, False))) as pump:
            async for _ in pump:  # heartbeats while it decodes
                pass
        return asr_route.readable_text(pump.result)

    async def _end_listening(self) -> None:
        listening, self.listening = self.listening, None
        if listening is not None and listening.sending is not None:
            listening.live.put(asr_route.CLOSE)
            listening.sending.cancel()
            with contextlib.suppress(BaseException):
                await listening.sending

    async def disconnect(self) -> None:
        """Whatever the connection had running stops: a client that leaves frees its generation slot at once."""
        await self._end_speaking()
        await self._end_listening()
        for pump in list(self.pumps):
            pump.stop()


def _speakers(text) -> int:
    """How many speakers a script has (1 where it is no script: the request layer then says what is wrong)."""
    try:
        return len(parse_script(text).speakers)
    except (VibeVoiceError, TypeError, AttributeError):
        return 1


def _sentence(error: Exception) -> tuple[str, str]:
    if isinstance(error, RequestError):
        return error.spelled(SPELLING), error.code
    if isinstance(error, ApiError):
        return error.message, error.code or "invalid_request"
    return str(error), "invalid_request"


# ---- serving ----

async def serve(models: Models, settings: Settings, uri: str, seed: int | None = None, announce: str | None = None,
                stop: asyncio.Event | None = None, on_listening=None, shutdown_seconds: float = 10.0,
                max_new_tokens: int | None = None) -> None:
    """Answer Wyoming clients on `uri` (tcp://HOST:PORT or unix://PATH) until `stop` is set (or the task is
    cancelled): then running generations end at their next frame, their audio closed with audio-stop, and idle
    connections close. `announce`: a name to announce the service under with zeroconf (mDNS), as Home
    Assistant discovers Wyoming services."""
    stop = stop or asyncio.Event()
    service = Service(ServerState.open(models, settings), seed, max_new_tokens)
    server = await _listen(uri, lambda reader, writer: Connection(service, reader, writer).run())
    announced = await _announce(announce, uri) if announce else None
    if on_listening is not None:
        on_listening()
    try:
        await stop.wait()
    finally:
        settings.stopping.set()
        server.close()
        for connection in list(service.connections):
            if not connection.in_event:  # waiting for its next event: its reader ends, so it closes
                connection.reader.feed_eof()
        tasks = [c.task for c in service.connections if c.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=shutdown_seconds)
        service.state.workers.shutdown(wait=False, cancel_futures=True)
        if announced is not None:
            await announced.async_unregister_all_services()
            await announced.async_close()


async def _listen(uri: str, on_connect) -> asyncio.AbstractServer:
    scheme, where, port = listen_address(uri)
    try:
        if scheme == "tcp":
            return await asyncio.start_server(on_connect, where, port, limit=MAX_LINE)
        return await asyncio.start_unix_server(on_connect, where, limit=MAX_LINE)
    except OSError as error:
        raise cannot_listen(uri, error, "give another --uri") from None


async def _announce(name: str, uri: str):
    """The service registered with zeroconf as `NAME._wyoming._tcp.local.` at the address it listens on (the
    machine's LAN address where it listens on all of them)."""
    from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

    scheme, host, port = listen_address(uri)
    if scheme != "tcp":
        raise VibeVoiceError("--zeroconf announces a TCP server: give --uri tcp://HOST:PORT")
    if host in ("0.0.0.0", "::"):
        host = _lan_address()
    elif host.startswith("127.") or host == "localhost":
        log.warning("--zeroconf announces %s, which only this machine reaches: listen on tcp://0.0.0.0:%d for Home "
                    "Assistant on another machine", host, port)
    address = socket.gethostbyname(host)
    zeroconf = AsyncZeroconf(interfaces=[address])  # announced where it listens
    await zeroconf.async_register_service(AsyncServiceInfo(
        "_wyoming._tcp.local.", f"{name}._wyoming._tcp.local.", addresses=[socket.inet_aton(address)], port=port))
    log.info("announced as %s._wyoming._tcp.local. at %s:%d (zeroconf)", name, address, port)
    return zeroconf


def _lan_address() -> str:
    """The address this machine reaches the LAN from (a UDP socket's, connected to the mDNS group: nothing sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("224.0.0.251", 5353))
        return probe.getsockname()[0]


def run(bundles: list, settings: Settings, uri: str = "tcp://127.0.0.1:10200", seed: int | None = None,
        announce: str | None = None, max_new_tokens: int | None = None, threads: int | None = None,
        force: bool = False, aliases: dict[str, str] | None = None, log_level: str = "info") -> None:
    """`vibevoice-onnx wyoming`: every bundle opened once, then served until SIGTERM or Ctrl-C."""
    import signal
    import sys

    from . import open_models

    models = open_models(bundles, settings, threads, force, aliases, log_level)

    async def main() -> None:
        stop, loop = asyncio.Event(), asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(models, settings, uri, seed, announce, stop, max_new_tokens=max_new_tokens,
                    on_listening=lambda: print(f"serving Wyoming on {uri} (Ctrl-C or SIGTERM stops)",
                                               file=sys.stderr, flush=True))

    asyncio.run(main())
