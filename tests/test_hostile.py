"""A hostile client against a real `vibevoice-onnx serve` process on tiny bundles: bodies nested thousands of
levels deep, bodies shorter than their Content-Length, clients that vanish mid-stream, binary frames where
JSON is due; Schemathesis (which no one here wrote) fuzzing every route of the served OpenAPI schema; and
Hypothesis driving the speech websocket with random sequences of messages. Whatever comes, the answer is a
status under 500 in OpenAI's error shape (or an error event and a clean close), and the server's log holds
no traceback and no failure line: it ends in `server`'s teardown."""

from __future__ import annotations

import json
import re
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
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(tiny_bundle, tiny_15b_bundle, tiny_asr_bundle, tmp_path_factory):
    log = tmp_path_factory.mktemp("hostile") / "server.log"
    running = Server([tiny_bundle, tiny_15b_bundle, tiny_asr_bundle], log, "--max-frames", str(MAX_FRAMES),
                     "--max-input-chars", "300", "--body-timeout", "5")
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


@settings(max_examples=fuzz_examples(30), deadline=None, derandomize=fuzz_seed() == 1,
          suppress_health_check=list(HealthCheck))
@given(messages=st.lists(MESSAGES, min_size=1, max_size=6))
def test_random_message_sequences_on_the_speech_socket_end_cleanly(server, messages):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{server.port}/v1/audio/speech/stream", additional_headers=AUTH,
                 max_size=None) as ws:
        try:
            for message in messages:
                ws.send(message)
            while True:
                answer = ws.recv(timeout=5)
                if isinstance(answer, str):
                    event = json.loads(answer)
                    if event["type"] == "error":
                        assert event["error"]["type"] == "invalid_request_error", event
                        openai_error(json.dumps(event).encode())
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd else None
            # a message over the limit is refused with 1009 while the rest of it is still being sent, so the
            # close frame may be lost with the connection's reset
            oversized = any(len(m) > 1 << 20 for m in messages)
            assert code in (1000, 1008, 1009) or code is None and oversized, (code, closed)
        except TimeoutError:
            pass  # the socket waits for more text, as it should: the client leaves
