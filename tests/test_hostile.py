"""A hostile client against a real `vibevoice-onnx serve` process on tiny bundles: bodies nested thousands of
levels deep, bodies shorter than their Content-Length, clients that vanish mid-stream, binary frames where
JSON is due; Schemathesis (which no one here wrote) fuzzing every route of the served OpenAPI schema; and
Hypothesis driving the speech websocket with random sequences of messages. Whatever comes, the answer is a
status under 500 in OpenAI's error shape (or an error event and a clean close), and the server's log holds
no traceback and no failure line: it ends in `server`'s teardown."""

from __future__ import annotations

import json
import re
import select
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import KEY, Server, fuzz_examples, fuzz_seed

pytest.importorskip("fastapi")
websockets = pytest.importorskip("websockets")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

MAX_FRAMES = 16  # the server's cap: fuzzed requests that speak stay short
MAX_UPLOAD_MB = 5  # the server's upload limit: the over-limit tests send 6 MB
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(tiny_bundle, tiny_15b_bundle, tiny_asr_bundle, tmp_path_factory):
    log = tmp_path_factory.mktemp("hostile") / "server.log"
    running = Server([tiny_bundle, tiny_15b_bundle, tiny_asr_bundle], log, "--max-frames", str(MAX_FRAMES),
                     "--max-input-chars", "300", "--body-timeout", "5", "--max-upload-mb", str(MAX_UPLOAD_MB))
    yield running
    assert running.stop() == 0, log.read_text()  # and no traceback (Server.stop)
    assert " failed: " not in log.read_text(), log.read_text()  # nor a failure's one line: no 5xx


def post(server, path: str, body: bytes, content_type: str = "application/json"):
    request = urllib.request.Request(server.url + path, data=body, headers={**AUTH, "content-type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def openai_error(body: bytes) -> dict:
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    return error


def raw_request(server, head: str, body: bytes) -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    connection.sendall(head.encode() + b"\r\n\r\n" + body)
    return connection


def log_line(server, request_id: str, deadline: float = 30) -> str:
    """The log line of request `request_id`, once it is written (a stream writes it when it ends)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        lines = [line for line in server.log.read_text().splitlines() if f"[request {request_id}]" in line]
        if lines:
            return lines[-1]
        time.sleep(0.1)
    raise AssertionError(f"no log line for request {request_id}: {server.log.read_text()}")


@pytest.mark.parametrize("body,words", [
    (b"[" * 10_000 + b"]" * 10_000, "nests JSON more than 32 levels deep"),
    (b'{"model": "tts-1", "input": "hi", "voice": ' + b'{"id": ' * 5000 + b"1" + b"}" * 5001, "levels deep"),
    (b'{"model": "tts-1", "input": "hi", "seed": ' + b"9" * 5000 + b"}", "not valid JSON"),
    (b'{"model": "tts-1", "input": "\\ud800 [[[[", "voice": "synthetic"}', "unpaired surrogate"),  # valid JSON
    (b'{"model": "tts-1", "input": "[[[[ \\ud83d\\ude00 ' + b"[" * 40 + b'", "voice": "synthetic"}', None),
])
def test_a_body_is_bounded_before_it_is_parsed(server, body, words):
    status, answer = post(server, "/v1/audio/speech", body)
    if words is None:
        assert status == 200  # brackets inside a string are not depth, and a surrogate pair is text
        return
    assert status == 400 and words in openai_error(answer)["message"]


# ---- bodies over the limit: the 413 reaches every client, and no client holds the connection ----

def multipart(fields: dict, file_field: str, size: int) -> tuple[bytes, str]:
    """A multipart form whose file field holds `size` random bytes, and its content type."""
    import os

    boundary = "vibevoice-test-boundary"
    parts = b"".join(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
                     for name, value in fields.items())
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="{file_field}"; filename="big.wav"\r\n'
            "Content-Type: audio/wav\r\n\r\n").encode()
    return parts + head + os.urandom(size) + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


OVER = (MAX_UPLOAD_MB + 1) * 2**20
TOO_LARGE = f"the upload is larger than the limit of {MAX_UPLOAD_MB} MB"


@pytest.mark.parametrize("path, fields, file_field", [
    ("/v1/audio/transcriptions", {"model": "whisper-1"}, "file"),
    ("/v1/audio/voices", {"name": "big"}, "audio_sample"),
])
def test_a_client_that_sends_its_whole_body_first_reads_the_413(server, path, fields, file_field):
    """urllib (and http.client under it) sends the whole body before it reads a byte of the answer: the server reads
    and discards the rest of an over-limit body before it answers, so that client gets the 413 and its sentence, not
    a connection reset (the server used to answer and close while the body was still arriving)."""
    body, content_type = multipart(fields, file_field, OVER)
    status, answer = post(server, path, body, content_type)
    assert status == 413 and openai_error(answer)["message"] == TOO_LARGE
    chunked = urllib.request.Request(server.url + path, data=iter([body[:2**20], body[2**20:]]), method="POST",
                                     headers={**AUTH, "content-type": content_type, "transfer-encoding": "chunked"})
    with pytest.raises(urllib.error.HTTPError) as refused:  # no Content-Length: refused as the limit is passed
        urllib.request.urlopen(chunked, timeout=60)
    assert refused.value.code == 413 and openai_error(refused.value.read())["message"] == TOO_LARGE
    speech = json.dumps({"model": "tts-1", "input": "x" * 2**20}).encode()  # past the speech body's own limit
    status, answer = post(server, "/v1/audio/speech", speech)
    assert status == 413 and "is larger than the limit" in openai_error(answer)["message"]


def test_curl_and_the_openai_client_read_the_413_of_an_upload_over_the_limit(server, tmp_path):
    import openai

    big = tmp_path / "big.wav"
    big.write_bytes(b"\0" * OVER)
    done = subprocess.run(["curl", "-sS", "-o", str(tmp_path / "answer.json"), "-w", "%{http_code}",
                           "-H", f"Authorization: Bearer {KEY}", "-F", "model=whisper-1", "-F", f"file=@{big}",
                           server.url + "/v1/audio/transcriptions"], capture_output=True, text=True, timeout=60)
    assert done.stdout == "413", done.stderr
    assert openai_error((tmp_path / "answer.json").read_bytes())["message"] == TOO_LARGE
    with pytest.raises(openai.APIStatusError) as refused, open(big, "rb") as audio:
        server.client().audio.transcriptions.create(model="whisper-1", file=audio)
    assert refused.value.status_code == 413 and TOO_LARGE in refused.value.message


@pytest.mark.parametrize("answer", [413, 400])
def test_an_endless_body_is_cut_off_after_a_bounded_amount(server, answer):
    """What is left of a body answered early (a 413 past the limit, a 400 for a form that is no form) is read only
    up to a bound: a client that keeps sending is cut off once it is passed, and cannot hold the connection (uvicorn
    would read and discard it for as long as it came)."""
    from vibevoice_onnx.serve.http import LINGER_BYTES

    form, content_type = multipart({"model": "whisper-1"}, "file", 0)
    head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: {content_type}\r\nTransfer-Encoding: chunked")
    start = form[: form.rindex(b"\r\n--")] if answer == 413 else b"not a form"  # then zeros that never end
    before = transcription_lines(server)
    connection = raw_request(server, head, b"%x\r\n%s\r\n" % (len(start), start))
    chunk, sent, reply = b"%x\r\n%s\r\n" % (2**20, b"\0" * 2**20), 0, b""
    with pytest.raises(OSError):  # a reset or a broken pipe: the server closed the connection
        while sent < 4 * LINGER_BYTES:
            connection.sendall(chunk)
            sent += 2**20
            if select.select([connection], [], [], 0)[0]:
                reply += connection.recv(65536)
    connection.close()
    assert sent < MAX_UPLOAD_MB * 2**20 + LINGER_BYTES + 16 * 2**20, sent  # the bound, and the sockets' buffers
    # the answer went out before the close, but the reset of the bytes still arriving may discard it before the
    # client reads it: the log says what it was
    assert reply == b"" or reply.startswith(b"HTTP/1.1 %d" % answer) and b"connection: close" in reply.lower(), reply
    deadline = time.monotonic() + 30
    while len(logged := transcription_lines(server)) == len(before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(logged) == len(before) + 1 and f"status={answer}" in logged[-1], logged[len(before):]


def test_a_client_that_stalls_mid_body_after_an_early_answer_gets_it_and_is_closed(server):
    """A form that is no form, its body declared at 1 MB, a kilobyte of it sent, then nothing while the client still
    holds the connection: the 400 goes out and the connection closes once the client has been silent a moment
    (serve.http.LINGER_IDLE_SECONDS), neither held open for the rest nor kept alive for a next request."""
    _, content_type = multipart({"model": "whisper-1"}, "file", 0)
    head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {2**20}")
    connection = raw_request(server, head, b"not a form" + b"\0" * 1024)
    connection.settimeout(120)  # catches a connection held open: the server waits seconds of silence, not minutes
    reply = b""
    with connection:
        while chunk := connection.recv(65536):  # to the server's close
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400") and b"connection: close" in reply.lower(), reply


def transcription_lines(server) -> list[str]:
    return [line for line in server.log.read_text().splitlines() if "POST /v1/audio/transcriptions" in line]


def test_a_client_that_waits_for_100_continue_is_answered_at_once_and_never_invited_to_send(server):
    """curl asks before it sends a large body (Expect: 100-continue): a body over the limit is refused then and
    there, and the server never sends the `100 Continue` that would make the client send it all."""
    content_type = multipart({"model": "whisper-1"}, "file", 0)[1]
    head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {OVER}\r\nExpect: 100-continue")
    connection = raw_request(server, head, b"")
    reply = b""
    while b"\r\n\r\n" not in reply and (data := connection.recv(4096)):
        reply += data
    connection.close()
    assert reply.startswith(b"HTTP/1.1 413") and b"connection: close" in reply.lower(), reply


def test_a_body_shorter_than_its_length_from_a_client_that_leaves_is_one_line(server):
    head = (f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000")
    raw_request(server, head, b'{"model": "tts-1", "inp').close()
    deadline = time.monotonic() + 30
    while "status=499" not in server.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    line = next(line for line in server.log.read_text().splitlines() if "status=499" in line)
    assert "POST /v1/audio/speech model=- status=499" in line, line


def test_a_client_that_vanishes_mid_stream_cancels_its_generation(server):
    body = json.dumps({"model": "tts-1", "input": "A long sentence to speak slowly. " * 4, "voice": "synthetic",
                       "response_format": "pcm", "steps": 999, "seed": 3}).encode()
    head = (f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}")
    connection = raw_request(server, head, body)
    start = connection.recv(4096).decode("latin-1")  # the head and, perhaps, the first audio
    request_id = re.search(r"x-request-id: (\w+)", start).group(1)
    connection.close()
    line = log_line(server, request_id)
    assert "status=499" in line and "client disconnected" in line, line
    audio = float(re.search(r"audio=([\d.]+)s", line).group(1))
    assert audio < MAX_FRAMES / 7.5  # stopped before the frames it would have made


@pytest.mark.parametrize("path", ["/v1/audio/speech/stream", "/v1/stream"])
def test_a_binary_frame_where_json_is_due_is_an_error_event_and_a_clean_close(server, path):
    from websockets.exceptions import ConnectionClosedError
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{server.port}{path}", additional_headers=AUTH) as ws:
        ws.send(b"\x00\x01binary")
        error = json.loads(ws.recv(timeout=30))
        with pytest.raises(ConnectionClosedError) as closed:
            ws.recv(timeout=30)
    assert error["type"] == "error" and "binary message" in error["error"]["message"]
    assert closed.value.rcvd.code == 1008 and closed.value.rcvd.reason == error["error"]["message"]


# ---- Schemathesis: every route of the served schema ----

def test_schemathesis_finds_no_server_error_and_no_answer_outside_the_schema(server, tmp_path):
    pytest.importorskip("schemathesis")
    request = urllib.request.Request(server.url + "/openapi.json", headers=AUTH)
    with urllib.request.urlopen(request, timeout=30) as response:
        document = json.load(response)
    assert {"/v1/audio/speech", "/v1/audio/transcriptions", "/v1/audio/voices"} <= set(document["paths"])
    (tmp_path / "openapi.json").write_text(json.dumps(document))
    command = [str(Path(sys.executable).parent / "st"), "run", "openapi.json", "--url", server.url,
               "-H", f"Authorization: Bearer {KEY}", "--checks", "not_a_server_error,status_code_conformance,"
               "content_type_conformance,response_schema_conformance", "--max-examples", str(fuzz_examples(25)),
               "--seed", str(fuzz_seed()),
               "--workers", "1", "--request-timeout", "60", "--no-color"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=fuzz_examples(600))
    print(done.stdout[-1500:])  # the long run (benchmarks/fuzz.py) reports Schemathesis' summary
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert re.search(r"\b(\d+) generated, \1 passed", done.stdout), done.stdout[-3000:]


# ---- Hypothesis: the speech websocket ----

def _valid_start():
    return json.dumps({"model": "tts-1", "voice": "synthetic", "response_format": "pcm", "seed": 1})


MESSAGES = st.one_of(
    st.just(_valid_start()),
    st.builds(lambda t: json.dumps({"type": "input_text.delta", "delta": t}), st.text(max_size=40)),
    st.just(json.dumps({"type": "input_text.done"})),
    st.builds(lambda text, cut: text[:cut], st.just(_valid_start()), st.integers(1, 40)),  # truncated JSON
    st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                 max_leaves=8).map(json.dumps),
    st.text(max_size=30),
    st.binary(max_size=64),
    st.just("x" * ((1 << 20) + 1)),  # over the server's 1 MiB message limit
    st.just(json.dumps({"type": "input_text.delta", "delta": "long " * 100})),  # over --max-input-chars
)


ANSWER_WITHIN = 60  # seconds: a socket silent this long after the client's last word is hung, not waiting


@settings(max_examples=fuzz_examples(30), deadline=None, derandomize=fuzz_seed() == 1,
          suppress_health_check=list(HealthCheck))
@given(messages=st.lists(MESSAGES, min_size=1, max_size=6))
def test_random_message_sequences_on_the_speech_socket_end_cleanly(server, messages):
    """Random messages, then `input_text.done` (the client's last word, so no answer is owed to a text still
    coming): the server must end the exchange, with audio and `audio.done` or an error event, and close. Every
    answer has the socket's shape; a wait that ends without an answer or a close is a failure (a hang)."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{server.port}/v1/audio/speech/stream", additional_headers=AUTH,
                 max_size=None) as ws:
        try:
            for message in [*messages, json.dumps({"type": "input_text.done"})]:
                ws.send(message)
            while True:
                speech_socket_answer(ws.recv(timeout=ANSWER_WITHIN))
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd else None
            # a message over the limit is refused with 1009 while the rest of it is still being sent, so the
            # close frame may be lost with the connection's reset
            oversized = any(len(m) > 1 << 20 for m in messages)
            assert code in (1000, 1008, 1009) or code is None and oversized, (code, closed)


def speech_socket_answer(answer) -> None:
    """One message of the speech socket, as its contract has them: audio (16-bit PCM, whole samples), the final
    `audio.done` with its usage, or an error event in OpenAI's shape."""
    if isinstance(answer, bytes):
        assert answer and len(answer) % 2 == 0, len(answer)
        return
    event = json.loads(answer)
    if event["type"] == "audio.done":
        usage = event["usage"]
        assert set(usage) == {"input_tokens", "output_tokens", "total_tokens"}, event
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] and usage["output_tokens"] > 0
        return
    assert event["type"] == "error" and event["error"]["type"] == "invalid_request_error", event
    openai_error(json.dumps(event).encode())
