"""What every route shares: OpenAI's error body, admission (a bounded queue before a bounded number of
generations), bodies read with a size limit and a timeout, and generation run off the event loop."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from typing import Any, AsyncIterator, Callable

from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect
from starlette.websockets import WebSocketDisconnect

ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
               408: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
               429: "rate_limit_error", 500: "server_error", 503: "server_error", 507: "server_error"}
MAX_JSON_DEPTH = 32  # our bodies nest 3 levels; json.loads recurses once a level and fails near 1000
LINGER_BYTES = 256 * 2**20  # of a body answered before it was read, read and discarded first (RequestBody.settle)
LINGER_SECONDS = 10.0  # in all
LINGER_IDLE_SECONDS = 2.0  # without a byte of it: the client is not sending (nginx's lingering_timeout)


class ApiError(Exception):
    """An answer other than success, as OpenAI's API gives it: `{"error": {message, type, param, code}}`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": ERROR_TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def sse_event(kind: str, **fields) -> bytes:
    """One server-sent event: `data: {"type": kind, ...}` and the blank line that ends it."""
    return f"data: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n".encode()


class Admission:
    """At most `active` generations at once; up to `queue` more requests wait for one; beyond, a 429 with
    Retry-After (which OpenAI's client honours when it retries)."""

    def __init__(self, active: int, queue: int):
        self.active, self.queue = active, queue
        self.free = asyncio.Semaphore(active)
        self.waiting = 0

    async def enter(self) -> None:
        if self.free.locked() and self.waiting >= self.queue:
            raise ApiError(429, f"the server is busy ({self.active} generations running, {self.waiting} waiting); "
                           "retry shortly", code="server_busy", headers={"Retry-After": "1"})
        self.waiting += 1
        try:
            await self.free.acquire()
        finally:
            self.waiting -= 1

    def leave(self) -> None:
        self.free.release()


class ClientGone(Exception):
    """The client went away before its request was whole: nobody is left to answer."""


async def read_body(request, limit: int, timeout: float) -> bytes:
    """The whole body, refused with a 413 past `limit` bytes and a 408 if it has not arrived in `timeout` s."""
    try:
        return await with_timeout(_collect(bounded(request.stream(), limit)), timeout)
    except ClientDisconnect:
        raise ClientGone() from None


async def read_json(request, limit: int, timeout: float):
    """The body as JSON, bounded in size, time and depth before it is parsed (see parse_json)."""
    return parse_json(await read_body(request, limit, timeout), "the body")


def parse_json(raw: bytes | str, what: str):
    """JSON from a client: its nesting measured before json.loads recurses into it, and every way it can be
    malformed (bad UTF-8, bad syntax, an integer of more digits than Python converts) one 400."""
    try:
        text = raw.decode() if isinstance(raw, bytes) else raw
        if json_depth(text) > MAX_JSON_DEPTH:
            raise ApiError(400, f"{what} nests JSON more than {MAX_JSON_DEPTH} levels deep", code="invalid_json")
        value = json.loads(text)
        if "\\u" in text:  # an escaped lone surrogate ("\ud800") is valid JSON and no text anything can encode
            json.dumps(value, ensure_ascii=False).encode()
        return value
    except UnicodeEncodeError:
        raise ApiError(400, f"{what} holds an unpaired surrogate escape (such as \\ud800), which is not text",
                       code="invalid_json") from None
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError among them
        raise ApiError(400, f"{what} is not valid JSON ({e})", code="invalid_json") from None


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")


def json_depth(text: str) -> int:
    """How deep the arrays and objects of `text` nest (brackets inside strings do not count), stopping
    as soon as it passes MAX_JSON_DEPTH."""
    depth = deepest = 0
    for bracket in _NOT_BRACKETS.sub("", _STRINGS.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        if depth > deepest:
            deepest = depth
            if deepest > MAX_JSON_DEPTH:
                break
    return deepest


async def with_timeout(awaitable, timeout: float | None, what: str = "the request body"):
    if timeout is None:
        return await awaitable
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except asyncio.TimeoutError:
        raise ApiError(408, f"{what} did not arrive within {timeout:g} s") from None


async def receive_message(websocket, timeout: float | None, binary: bool = False, words: tuple[str, ...] = ()):
    """A websocket's next message, through the one door every socket uses: a JSON object (bounded as a body
    is), the raw bytes of a binary message where `binary` allows them, or one of `words` sent as plain text.
    Anything else (a binary message where JSON is due, bad JSON, not an object) is an ApiError, which the
    socket answers with an error event and a close; the client leaving is WebSocketDisconnect."""
    message = await with_timeout(websocket.receive(), timeout, "a message")
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000), message.get("reason"))
    text, data = message.get("text"), message.get("bytes")
    if text is None:
        if binary and data is not None:
            return data
        raise ApiError(400, "this socket takes JSON text messages, and a binary message came", code="invalid_message")
    if text.strip().strip('"') in words:
        return text.strip().strip('"')
    value = parse_json(text, "the message")
    if not isinstance(value, dict):
        raise ApiError(400, f"a message must be a JSON object, not {type(value).__name__}", code="invalid_message")
    return value


async def bounded(stream: AsyncIterator[bytes], limit: int, refusal: ApiError | None = None) -> AsyncIterator[bytes]:
    """`stream` as it comes, refused once it passes `limit` bytes (`refusal`, default a 413 naming the limit); the
    rest of the body is the server's to read or close on (RequestBody.settle)."""
    size = 0
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            raise refusal or too_large("the request", limit / 2**20)
        yield chunk


def too_large(what: str, megabytes: float) -> ApiError:
    return ApiError(413, f"{what} is larger than the limit of {megabytes:g} MB", code="too_large")


class RequestBody:
    """A request's ASGI `receive`, watched, so that an answer given before the body is read (a 413 over the limit, a
    401, a malformed form) still reaches the client (`settle`)."""

    def __init__(self, receive, headers: list[tuple[bytes, bytes]]):
        self._receive, self.headers = receive, dict(headers)
        self.started = self.ended = False  # some of the body came / all of it did (or the client left)
        self.received = 0  # bytes of it

    async def receive(self):
        message = await self._receive()
        self.started = True
        self.received += len(message.get("body", b""))
        self.ended = self.ended or message["type"] == "http.disconnect" or not message.get("more_body", False)
        return message

    async def settle(self, status: int) -> bool:
        """Read and discard what is left of the body, at most LINGER_BYTES for at most LINGER_SECONDS (and while it
        keeps coming), as the answer `status` starts (nginx's lingering close); whether the connection can stay
        open (False: the answer must close it).

        A client that sends its whole body before it reads the answer (Python's urllib and http.client) otherwise
        meets a connection reset instead of the answer: the server closes while the body still arrives, and the
        kernel answers those bytes with a reset that discards what the server sent. Past the bounds the answer
        closes the connection (uvicorn would otherwise read and discard the rest for as long as it comes), so no
        client holds it with an endless body. A client waiting for `100 Continue` has sent nothing, and a 408's
        client too little: each is answered at once (the first never invited to send)."""
        if self.ended:
            return True
        if status == 408:
            return False
        declared = self.headers.get(b"content-length", b"")
        waiting = not self.started and self.headers.get(b"expect", b"").lower() == b"100-continue"
        if waiting or declared.isdigit() and int(declared) - self.received > LINGER_BYTES:
            return False
        bound, deadline = self.received + LINGER_BYTES, time.monotonic() + LINGER_SECONDS
        while not self.ended:
            wait = min(LINGER_IDLE_SECONDS, deadline - time.monotonic())
            try:
                await asyncio.wait_for(self.receive(), max(wait, 0))
            except asyncio.TimeoutError:
                return False
            if self.received > bound:
                return False
        return True


async def _collect(stream: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in stream])


class Stopped(Exception):
    """The consumer went away: the worker stops at its next item."""


_ITEM, _DONE, _FAILED = range(3)


PUMP_AHEAD = 8  # items a job may emit before the event loop takes them (a frame of audio each, about a second)


class Pump:
    """Runs `job(emit)` in a worker thread; what it emits reaches the event loop as it comes (`async for`),
    and what it returns is `result` afterwards. `stop()` makes the next `emit` raise, so a generation stops
    at its next frame; `on_stop` wakes a job that waits for something else (streamed text); once `stopping` (the
    server's shutdown) is set, a job waits for room no more (it ends at its next item).

    At most PUMP_AHEAD items wait to be taken: past that `emit` waits, so a client that stops reading holds its
    generation where it is (parked in its batch) instead of the server gathering the rest of its audio, up to
    the whole context, in memory."""

    def __init__(self, job: Callable[[Callable[[Any], None]], Any], executor, on_stop: Callable[[], None] | None = None,
                 stopping: threading.Event | None = None):
        loop = asyncio.get_running_loop()
        self.items: asyncio.Queue = asyncio.Queue()
        self.stopped, self.result, self._on_stop = threading.Event(), None, on_stop
        self._room = room = threading.Semaphore(PUMP_AHEAD)
        stopping = stopping or threading.Event()

        def put(kind, value):
            try:
                loop.call_soon_threadsafe(self.items.put_nowait, (kind, value))
            except RuntimeError:  # the event loop is gone (the server is shutting down)
                self.stopped.set()

        def emit(item):
            while not room.acquire(timeout=0.05):
                if self.stopped.is_set():
                    raise Stopped()
                if stopping.is_set():  # the job ends at its next item: what it still emits goes out past the bound
                    break
            if self.stopped.is_set():
                raise Stopped()
            put(_ITEM, item)

        def work():
            try:
                put(_DONE, job(emit))
            except Stopped:
                pass
            except BaseException as e:  # noqa: BLE001 - handed to the event loop, which answers for it
                put(_FAILED, e)

        self.finished = loop.run_in_executor(executor, work)

    def stop(self) -> None:
        self.stopped.set()
        if self._on_stop is not None:
            self._on_stop()

    async def __aiter__(self):
        while True:
            kind, value = await self.items.get()
            if kind == _ITEM:
                self._room.release()
                yield value
            elif kind == _DONE:
                self.result = value
                return
            else:
                raise value
