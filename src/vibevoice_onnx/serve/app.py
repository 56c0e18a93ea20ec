"""The HTTP app: OpenAI's audio routes, the voices and models lists, health, and the text-in/audio-out
websocket, over bundles opened once per process (serve.models)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect

from ..audio import SAMPLE_RATE
from ..errors import StorageFull, VibeVoiceError
from ..families import family
from ..outputs import file_error, writer_os_error
from ..runtime.bundle import voice_path
from . import schema
from . import speech as speech_route
from . import transcriptions as asr_route
from .fields import served_model
from .http import (Admission, ApiError, ClientGone, Pump, RequestBody, bounded, read_json, receive_message, sse_event,
                   too_large, with_timeout)
from .local import add_local_routes
from .models import Models
from .web import add_page_routes, is_open

log = logging.getLogger("vibevoice_onnx.serve")
REQUEST_ID = "vibevoice.request_id"  # scope keys: the id every log line and answer of a request carries,
LOGGED = "vibevoice.logged"  # and whether its failure was logged already
API_KEY_ENV = "VIBEVOICE_API_KEY"
FORM_OVERHEAD = 64 * 1024  # multipart boundaries and text fields, beyond the upload itself
# A browser's websocket offers PAGE_PROTOCOL (and the key as KEY_PROTOCOL + base64url(KEY)); the server accepts
# with PAGE_PROTOCOL, never echoing the key, and answers a refusal as an error message the page can read.
PAGE_PROTOCOL = "vibevoice"
KEY_PROTOCOL = "vibevoice-key."
NEED_KEY = "a valid API key is needed: send 'Authorization: Bearer KEY'"


@dataclass
class Settings:
    max_active: int = 4  # generations at once (each a worker thread)
    max_batch: int = 4  # generations of one bundle batched step by step (bench --streams measures it)
    max_queue: int = 16  # requests that may wait for one; beyond, 429
    max_input_chars: int = 4096
    max_frames: int | None = None  # latent frames a speech request may generate (7.5 a second); None: the context
    max_upload_mb: float = 25.0  # OpenAI's own limit
    api_key: str | None = None
    body_timeout: float = 30.0  # seconds for a request body (or a websocket message) to arrive
    stopping: threading.Event = field(default_factory=threading.Event)  # set on SIGTERM: streams end cleanly

    def __post_init__(self):
        for name, least in (("max_active", 1), ("max_batch", 1), ("max_queue", 0), ("max_input_chars", 1),
                            ("max_upload_mb", 1e-3), ("body_timeout", 1e-3), ("max_frames", 1)):
            if getattr(self, name) is not None and not getattr(self, name) >= least:
                flag = "--" + name.replace("_", "-")
                raise VibeVoiceError(f"{flag} must be at least {least:g}, got {getattr(self, name)}")


def create_app(models: Models, settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    state = ServerState.open(models, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        settings.stopping.set()
        state.workers.shutdown(wait=False, cancel_futures=True)

    app = _Guarded(title="vibevoice-onnx", docs_url=None, redoc_url=None, openapi_url="/openapi.json", lifespan=lifespan)
    app.state.vibevoice = state
    _errors(app)
    _auth_and_log(app, settings)
    voices = sorted({v for m in models.doing("tts") for v in m.voices()})
    add_page_routes(app)
    add_local_routes(app, models, settings.api_key)

    @app.get("/health", **schema.health())
    async def health():
        return {"status": "stopping" if settings.stopping.is_set() else "ok", "models": list(models.by_id)}

    @app.get("/v1/models", **schema.models_list())
    async def list_models():
        return {"object": "list", "data": [m.describe() for m in models.by_id.values()]}

    @app.get("/v1/models/{model_id}", **schema.model())
    async def get_model(model_id: str):
        if model_id not in models.by_id:
            raise ApiError(404, f"no model '{model_id}' here (served: {', '.join(models.by_id)})", param="model",
                           code="model_not_found")
        return models.by_id[model_id].describe()

    @app.get("/v1/audio/voices", **schema.voices_list())
    async def list_voices(model: str | None = None):
        chosen = [served_model(models, model, "tts")] if model else models.doing("tts")
        return {"voices": [{"id": v, "name": v, "model": m.id} for m in chosen for v in m.voices()]}

    @app.post("/v1/audio/voices", **schema.voice_upload(models.names("tts")))
    async def add_voice(request: Request):
        return await _add_voice(request, state)

    @app.post("/v1/audio/speech", **schema.speech(settings, models.names("tts"), voices))
    async def speech(request: Request):
        return await _speech(request, state)

    @app.post("/v1/audio/transcriptions", **schema.transcription(models.names("asr")))
    async def transcriptions(request: Request):
        return await _transcription(request, state)

    @app.websocket("/v1/audio/speech/stream")
    async def speech_stream(websocket: WebSocket):
        await _speech_socket(websocket, state)

    @app.websocket("/v1/stream")  # upstream's path for live transcription (its vLLM server's)
    async def live_transcription(websocket: WebSocket):
        await _live_socket(websocket, state)

    return app


@dataclass
class ServerState:
    """What every front-end of a server runs its jobs through (HTTP, the websockets, Wyoming): the models, the
    limits, the worker threads and one admission for them all."""

    models: Models
    settings: Settings
    workers: ThreadPoolExecutor
    admission: Admission | None = None

    @classmethod
    def open(cls, models: Models, settings: Settings) -> "ServerState":
        """The state with its worker threads: one per generation slot, and two for the jobs that wait on a client."""
        return cls(models, settings, ThreadPoolExecutor(settings.max_active + 2, thread_name_prefix="generation"))

    async def run(self, job, on_stop=None) -> Pump:
        """`job` in a worker thread once a generation slot is free (else a 429); the slot is freed when it ends."""
        if self.admission is None:  # made in the event loop that serves
            self.admission = Admission(self.settings.max_active, self.settings.max_queue)
        admission = self.admission
        await admission.enter()
        try:
            pump = Pump(job, self.workers, on_stop=on_stop, stopping=self.settings.stopping)
        except BaseException:
            admission.leave()
            raise
        pump.finished.add_done_callback(lambda _: admission.leave())
        return pump


# ---- errors, auth, the log line ----

class _Guarded(FastAPI):
    """The app behind a last line of defence: every request and socket gets an id (the `x-request-id` header,
    and every log line of it); an answer given before its request's body was read reaches the client all the same
    (RequestBody.settle); and an exception that reaches the top is one log line (its traceback at debug level) and
    a 500 in OpenAI's shape, or a close with 1011, never a traceback through uvicorn."""

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await super().__call__(scope, receive, send)
        request_id = scope.setdefault(REQUEST_ID, uuid.uuid4().hex[:12])
        started = False
        body = RequestBody(receive, scope.get("headers", [])) if scope["type"] == "http" else None

        async def send_with_id(message):
            nonlocal started
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
                if not await body.settle(message["status"]):  # answered before the body was read: see RequestBody
                    message["headers"].append((b"connection", b"close"))
            started = started or message["type"] in ("http.response.start", "websocket.accept", "websocket.close")
            await send(message)

        try:
            await super().__call__(scope, body.receive if body else receive, send_with_id)
        except Exception as error:  # noqa: BLE001 - the point of this class
            if not scope.get(LOGGED):
                log_failure(scope, "the request", error)
            if not started:
                with contextlib.suppress(Exception):  # the client may be gone too
                    await _answer_failure(scope, send_with_id)


async def _answer_failure(scope, send) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1011, "reason": "internal error"})
        return
    body = _internal_error(scope).response()
    await send({"type": "http.response.start", "status": 500, "headers": body.raw_headers})
    await send({"type": "http.response.body", "body": body.body})


def _internal_error(scope) -> ApiError:
    return ApiError(500, f"internal error; the server log has the details under request id {scope.get(REQUEST_ID)}")


def log_failure(scope, what: str, error: BaseException) -> None:
    """One line for a failure (whitespace folded, so a multi-line message stays one line); the traceback
    only at debug level (`--log-level debug`)."""
    scope[LOGGED] = True
    message = " ".join(str(error).split()) or "(no message)"
    log.warning("%s failed: %s: %s [request %s]", what, type(error).__name__, message, scope.get(REQUEST_ID, "-"))
    log.debug("the traceback of request %s", scope.get(REQUEST_ID, "-"), exc_info=error)


def _errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request, error: ApiError):
        return error.response()

    @app.exception_handler(VibeVoiceError)
    async def user_error(request, error: VibeVoiceError):
        return ApiError(400, str(error)).response()

    @app.exception_handler(StorageFull)
    async def storage_full(request, error: StorageFull):  # the path stays in the log: it is the server's business
        log.warning("%s %s: %s [request %s]", request.method, request.url.path, error, request.scope.get(REQUEST_ID))
        reason = str(error).rsplit(": ", 1)[-1]
        return ApiError(507, f"the server has no room to store this: {reason}", code="insufficient_storage").response()

    @app.exception_handler(ClientGone)
    async def client_gone(request, error: ClientGone):
        return Response(status_code=499)  # nobody reads it: for the log line

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, error: RequestValidationError):
        first = error.errors()[0] if error.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return ApiError(422, first.get("msg", "invalid request"), param=param, code="invalid_type").response()

    @app.exception_handler(HTTPException)
    async def http_error(request, error: HTTPException):
        message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
        return ApiError(error.status_code, message.get(error.status_code, str(error.detail))).response()

    @app.exception_handler(Exception)
    async def server_error(request, error: Exception):
        log_failure(request.scope, f"{request.method} {request.url.path}", error)
        return _internal_error(request.scope).response()


def _authorized(headers, settings: Settings, subprotocols: list[str] = ()) -> bool:
    """The key as `Authorization: Bearer KEY`, or on a websocket as the subprotocol KEY_PROTOCOL +
    base64url(KEY): a browser cannot set headers on a websocket, but it can offer subprotocols."""
    if not settings.api_key:
        return True
    key = settings.api_key.encode()
    if hmac.compare_digest(headers.get("authorization", "").encode(), b"Bearer " + key):
        return True
    encoded = base64.urlsafe_b64encode(key).rstrip(b"=")
    return any(hmac.compare_digest(p.encode(), KEY_PROTOCOL.encode() + encoded) for p in subprotocols
               if p.startswith(KEY_PROTOCOL))


def _auth_and_log(app: FastAPI, settings: Settings) -> None:
    @app.middleware("http")
    async def auth_and_log(request: Request, call_next):
        started = time.perf_counter()
        request.state.model, request.state.audio_seconds, request.state.streamed = None, None, False
        if not is_open(request.url.path) and not _authorized(request.headers, settings):
            response = ApiError(401, NEED_KEY, code="invalid_api_key").response()
        else:
            response = await call_next(request)
        if not request.state.streamed:  # a stream logs its own line when it ends
            log_request(request.scope, request.state.model, response.status_code, time.perf_counter() - started,
                        request.state.audio_seconds)
        return response


def log_request(scope, model, status, seconds: float, audio_seconds=None, note: str = "") -> None:
    method = "WS" if scope["type"] == "websocket" else scope["method"]
    audio = f" audio={audio_seconds:.2f}s" if audio_seconds is not None else ""
    log.info("%s %s model=%s status=%s seconds=%.3f%s%s [request %s]", method, scope["path"], model or "-", status,
             seconds, audio, f" {note}" if note else "", scope.get(REQUEST_ID, "-"))


def _client_error(scope, error: Exception) -> ApiError:
    """What a client is told of a failure after its request was accepted: its own fault in one sentence,
    or an internal error with the request id (the log has the rest)."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, VibeVoiceError):
        return ApiError(400, str(error))
    return _internal_error(scope)


class _Stream(StreamingResponse):
    """A streamed answer whose body is closed however the response ends, so that its generation stops at
    once; a client leaving mid-stream is an ordinary end, which the body's own log line records."""

    async def __call__(self, scope, receive, send):
        async with contextlib.aclosing(self.body_iterator):
            try:
                await super().__call__(scope, receive, send)
            except (ClientDisconnect, OSError):  # ASGI 2.4 servers: the client left while we sent
                scope[LOGGED] = True


async def _streamed(scope, body, pump: Pump, model: str, started: float, sse: bool, audio_seconds=lambda: None):
    """A streamed answer's bytes, from `body`, with what every stream shares: a failure after the first byte
    is an SSE error event (or, for raw audio, a cut stream), a client that leaves stops the generation, and
    one log line at the end."""
    status, note = 200, ""
    try:
        async for data in body:
            yield data
    except (asyncio.CancelledError, GeneratorExit):
        status, note = 499, "client disconnected"
        raise
    except Exception as e:  # noqa: BLE001 - after the first byte there is no status to change
        status, note = 500, "failed mid-stream"
        log_failure(scope, f"{scope['method']} {scope['path']}", e)
        if not sse:
            raise  # the response is cut short, and the guard knows it was logged
        yield sse_event("error", **_client_error(scope, e).body())
    finally:
        pump.stop()
        log_request(scope, model, status, time.perf_counter() - started, audio_seconds(), note)


# ---- speech ----

async def _speech(request: Request, state: ServerState):
    started = time.perf_counter()
    body = await read_json(request, state.settings.max_input_chars * 4 + 64 * 1024, state.settings.body_timeout)
    parsed = speech_route.parse_speech(body, state.models, state.settings.max_input_chars, state.settings.max_frames)
    request.state.model = parsed.model.id
    generation = speech_route.start(parsed)
    sse = parsed.stream_format == "sse"
    pump = await state.run(speech_route.encode_job(generation, parsed.response_format, sse, state.settings.stopping),
                           on_stop=getattr(generation, "close", None))
    request.state.streamed = True

    async def audio():
        async for data in pump:
            yield data
        if sse:
            yield sse_event("speech.audio.done", usage=speech_route.usage(parsed.model, parsed.text,
                                                                          generation.result.frames))

    headers = {"x-vibevoice-seed": str(generation.seed)} if generation.seed is not None else {}
    return _Stream(_streamed(request.scope, audio(), pump, parsed.model.id, started, sse,
                             lambda: generation.audio_seconds), media_type=parsed.media_type, headers=headers)


@dataclass
class _SocketRun:
    """One websocket exchange: what the log line says of it, the generation to stop, and its one answer to
    a failure (see fail)."""
    websocket: WebSocket
    model: str | None = None
    pump: Pump | None = None
    audio_seconds: object = lambda: None  # called for the log line once the exchange is over
    status: object = "done"
    closed: bool = False

    async def fail(self, error: Exception) -> None:
        """Answer the first failure, and only the first: the client leaving ends the exchange; anything else is
        an error event in OpenAI's shape and a close whose code says whose fault it was (1008 the client's,
        1011 ours) and whose reason is the sentence."""
        if self.closed:
            return
        self.closed = True
        if isinstance(error, WebSocketDisconnect):
            self.status = "client disconnected"
            return
        scope = self.websocket.scope
        answer = _client_error(scope, error)
        if answer.status >= 500:
            log_failure(scope, f"WS {scope['path']}", error)
        self.status = answer.status
        with contextlib.suppress(Exception):  # the client may have gone meanwhile
            await self.websocket.send_json({"type": "error", **answer.body()})
            await self.websocket.close(code=1008 if answer.status < 500 else 1011, reason=_close_reason(answer.message))

    def listen(self, receive_loop, stop) -> asyncio.Task:
        """`receive_loop()` reading the client's messages beside the outgoing stream; when it fails (a bad
        message, the client gone) the failure is answered and `stop()` ends the generation."""
        async def listening():
            try:
                await receive_loop()
            except Exception as e:  # noqa: BLE001 - WebSocketDisconnect and ApiError among them
                await self.fail(e)
                stop()

        return asyncio.create_task(listening())


def _close_reason(message: str) -> str:
    return message.encode()[:123].decode(errors="ignore")  # a close frame's reason holds at most 123 bytes


async def _socket(websocket: WebSocket, settings: Settings, exchange) -> None:
    """What every websocket shares: the API key, accept, any failure answered once (_SocketRun.fail), the
    generation stopped at the end, one log line. `exchange(run)` does the route's own work."""
    started = time.perf_counter()
    run = _SocketRun(websocket)
    try:
        offered = websocket.scope.get("subprotocols") or []
        protocol = PAGE_PROTOCOL if PAGE_PROTOCOL in offered else None
        if not _authorized(websocket.headers, settings, offered):
            run.status = 401
            if protocol is None:
                await websocket.close(code=1008, reason=NEED_KEY)
                return
            await websocket.accept(subprotocol=protocol)  # a browser sees no reason for a refused handshake
            raise ApiError(401, f"{NEED_KEY}, or from a browser the subprotocol '{KEY_PROTOCOL}' + base64url(KEY)",
                           code="invalid_api_key")
        await websocket.accept(subprotocol=protocol)
        await exchange(run)
    except Exception as e:  # noqa: BLE001 - one bad stream never takes the server down
        await run.fail(e)
    finally:
        if run.pump is not None:
            run.pump.stop()
        log_request(websocket.scope, run.model, run.status, time.perf_counter() - started, run.audio_seconds())


async def _speech_socket(websocket: WebSocket, state: ServerState) -> None:
    """First a JSON message with the speech fields (no `input` needed), then `input_text.delta` messages and
    `input_text.done`; binary audio goes back as it decodes, then `audio.done` with the usage."""
    settings = state.settings

    async def exchange(run: _SocketRun) -> None:
        first = await receive_message(websocket, settings.body_timeout)
        parsed = speech_route.parse_speech(first, state.models, settings.max_input_chars, settings.max_frames,
                                           text_required=False)
        run.model = parsed.model.id
        if not family(parsed.model.kind).capabilities.streams:
            raise ApiError(400, f"model '{run.model}' is a {parsed.model.kind} model: text streams into realtime models "
                           "only", param="model")
        generation = speech_route.start(parsed)
        if parsed.text:
            generation.feed(parsed.text)
        run.audio_seconds = lambda: generation.audio_seconds
        run.pump = await state.run(speech_route.encode_job(generation, parsed.response_format, False, settings.stopping),
                                   on_stop=generation.close)
        listener = run.listen(lambda: _receive_text(websocket, generation), generation.close)
        try:
            async for data in run.pump:
                await websocket.send_bytes(data)
        finally:
            listener.cancel()
        if not run.closed:
            await websocket.send_json({"type": "audio.done", "usage": speech_route.usage(
                parsed.model, generation.text.text, generation.result.frames)})
            await websocket.close()

    await _socket(websocket, settings, exchange)


async def _receive_text(websocket: WebSocket, generation) -> None:
    """Feed the text messages to the generation until `input_text.done`; then listen on, so that a client
    that leaves stops it (and a message after the end is refused)."""
    done = False
    while True:
        event = await receive_message(websocket, None)
        kind = event.get("type")
        if done:
            raise ApiError(400, f"a '{kind}' message came after input_text.done: the text was over",
                           code="invalid_message")
        if kind == "input_text.delta" and isinstance(event.get("delta"), str):
            generation.feed(event["delta"])
        elif kind == "input_text.done":
            generation.finish()
            done = True
        else:
            raise ApiError(400, "messages must be JSON {\"type\": \"input_text.delta\", \"delta\": TEXT} or "
                           "{\"type\": \"input_text.done\"}", code="invalid_message")


async def _live_socket(websocket: WebSocket, state: ServerState) -> None:
    """Live transcription as upstream's /v1/stream: a JSON message of settings, then binary PCM frames (float32
    little-endian mono at the model's rate, unless the settings say otherwise); each chunk's text goes back as it
    is decoded ({"chunk", "text", "start", "end", "speaker"}); the text message "end" flushes the tail and
    brings {"done": true, "total_chunks", "text", "segments"}. The session holds a generation slot throughout."""
    import queue

    settings, pieces = state.settings, queue.Queue()

    async def exchange(run: _SocketRun) -> None:
        parsed = asr_route.parse_live(await receive_message(websocket, settings.body_timeout), state.models)
        run.model = parsed.model.id
        stop = lambda: pieces.put(asr_route.CLOSE)  # noqa: E731
        run.pump = await state.run(asr_route.live_job(parsed, pieces), on_stop=stop)
        listener = run.listen(lambda: _receive_pcm(websocket, parsed, pieces, settings), stop)
        try:
            async for chunk in run.pump:
                await websocket.send_json(chunk.message())
        finally:
            listener.cancel()
        if run.pump.result is not None and not run.closed:
            session = run.pump.result
            run.audio_seconds = lambda: session.seconds
            transcript = session.transcript()
            await websocket.send_json({"done": True, "total_chunks": len(session.chunks), "text": transcript.text,
                                       "segments": [asdict(s) for s in transcript.segments]})
            await websocket.close()

    await _socket(websocket, settings, exchange)


async def _receive_pcm(websocket: WebSocket, parsed, pieces, settings: Settings) -> None:
    """The socket's PCM frames onto the session's queue until "end" (then listen on, as _receive_text does);
    a client silent for --body-timeout seconds before its "end" is a 408."""
    limit = int(settings.max_upload_mb * 2**20)
    ended = False
    while True:
        message = await receive_message(websocket, None if ended else settings.body_timeout, binary=True,
                                        words=("end",))
        if ended:
            raise ApiError(400, "a message came after \"end\": the audio was over", code="invalid_message")
        if message == "end":
            pieces.put(asr_route.END)
            ended = True
        elif isinstance(message, bytes) and len(message) <= limit:
            pieces.put(parsed.samples(message))
        else:
            raise ApiError(400, "send binary PCM frames (each at most the upload limit) and the text message \"end\" "
                           "when the audio is over", code="invalid_message")


# ---- uploads: transcriptions and voices ----

async def _form(request: Request, state: ServerState, max_files: int = 1):
    """The multipart form, its size bounded while it arrives (not only by Content-Length) and its time too."""
    limit = int(state.settings.max_upload_mb * 2**20) + FORM_OVERHEAD
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise ApiError(400, "send the upload as multipart/form-data (a 'file' field and the other fields)",
                       code="invalid_content_type")
    refusal = too_large("the upload", state.settings.max_upload_mb)
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise refusal
    parser = MultiPartParser(request.headers, bounded(request.stream(), limit, refusal), max_files=max_files,
                             max_fields=64)
    try:
        return await with_timeout(parser.parse(), state.settings.body_timeout)
    except MultiPartException as e:
        raise ApiError(400, f"the multipart form is malformed ({e.message})", code="invalid_form") from None
    except ClientDisconnect:
        raise ClientGone() from None


@contextlib.contextmanager
def _writing(action: str):
    """The server's own temporary writes: a failure one sentence (StorageFull where there was no room),
    whichever writer it came from."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - writers in C and Rust raise types of their own
        cause = writer_os_error(e)
        if cause is None:
            raise
        raise file_error(cause, action) from None


async def _spooled(form, name: str, state: ServerState):
    """The upload in `name` decoded to samples; the temporary copy (decoders want a seekable file) is removed."""
    upload = form.get(name)
    if not isinstance(upload, UploadFile):
        raise ApiError(400, f"'{name}' is required: the audio file, as a multipart file field", param=name,
                       code="missing_field")
    suffix = Path(upload.filename or "").suffix[:16]
    with _writing("spooling the upload"):
        handle, path = tempfile.mkstemp(prefix="vibevoice-upload-", suffix=suffix)

    def decode():
        with _writing("spooling the upload"), os.fdopen(handle, "wb") as out:
            upload.file.seek(0)
            shutil.copyfileobj(upload.file, out)
        return asr_route.load_upload(path)

    try:
        return await asyncio.get_running_loop().run_in_executor(None, decode)
    finally:
        os.unlink(path)


async def _transcription(request: Request, state: ServerState):
    started = time.perf_counter()
    form = await _form(request, state)
    try:
        parsed = asr_route.parse_transcription(form, state.models)
        request.state.model = parsed.model.id
        samples, rate = await _spooled(form, "file", state)
    finally:
        await form.close()
    request.state.audio_seconds = len(samples) / rate
    pump = await state.run(asr_route.transcribe_job(parsed, samples, rate, parsed.stream))
    if parsed.stream:
        request.state.streamed = True
        seconds = len(samples) / rate
        return _Stream(_streamed(request.scope, _transcript_events(pump, parsed), pump, parsed.model.id, started, True,
                                 lambda: seconds), media_type="text/event-stream")
    async for _ in pump:  # heartbeats while it decodes: stop if the client has gone
        if await request.is_disconnected():
            pump.stop()
            return Response(status_code=499)
    body = asr_route.respond(pump.result, parsed)
    if isinstance(body, str):
        return PlainTextResponse(body, media_type="text/vtt" if parsed.response_format == "vtt" else "text/plain")
    return JSONResponse(body)


async def _transcript_events(pump: Pump, parsed):
    async for delta, segments in pump:
        for index, segment in segments:
            yield sse_event("transcript.text.segment", id=index, start=segment.start, end=segment.end,
                            text=segment.text, speaker=segment.speaker)
        if delta:
            yield sse_event("transcript.text.delta", delta=delta)
    yield sse_event("transcript.text.done", **asr_route.respond(pump.result, parsed, "json"))
    yield b"data: [DONE]\n\n"


async def _add_voice(request: Request, state: ServerState):
    """OpenAI's custom-voice route on a 1.5B bundle: `name` and `audio_sample`, stored as `voices import` does."""
    from ..runtime.voice_store import import_voice

    form = await _form(request, state)
    try:
        name = form.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ApiError(400, "'name' is required: the new voice's name", param="name", code="missing_field")
        model_name = form.get("model")
        candidates = [m for m in state.models.by_id.values() if family(m.kind).voices == "audio"]
        model = served_model(state.models, model_name, "tts") if isinstance(model_name, str) and model_name else (
            candidates[0] if candidates else None)
        if model is None or family(model.kind).voices != "audio":
            raise ApiError(400, "voices are added to VibeVoice-1.5B and Large models only (a realtime voice is a cached prompt "
                           "made by upstream's tools: import presets with `vibevoice-onnx voices import`)", param="model")
        try:
            voice_path(model.bundle.path, name.strip())
        except VibeVoiceError as e:
            raise ApiError(400, str(e), param="name", code="invalid_value") from None
        if name.strip() in model.voices():
            raise ApiError(400, f"model '{model.id}' already has a voice '{name.strip()}'", param="name",
                           code="voice_exists")
        samples, rate = await _spooled(form, "audio_sample", state)
    finally:
        await form.close()

    def store():
        import soundfile as sf

        with tempfile.TemporaryDirectory(prefix="vibevoice-voice-") as folder:
            sample = Path(folder) / "audio_sample.wav"
            with _writing("writing the voice sample"):
                sf.write(str(sample), samples, rate, subtype="FLOAT")
            return import_voice(model.bundle.path, sample, name.strip())

    try:
        voice, summary = await asyncio.get_running_loop().run_in_executor(None, store)
    except StorageFull:
        raise  # a 507, not the client's fault
    except VibeVoiceError as e:
        raise ApiError(400, str(e), param="audio_sample") from None
    request.state.model, request.state.audio_seconds = model.id, summary["seconds"]
    return {"id": voice, "name": voice, "object": "audio.voice", "model": model.id, "seconds": summary["seconds"],
            "sample_rate": SAMPLE_RATE}
