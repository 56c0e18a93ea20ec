"""Serve a bundle with `vibevoice-onnx serve` and call it with the official `openai` client.

    python examples/serve_openai.py BUNDLE speech.wav [--text "Hello there."]

Needs the `serve` extra and `openai`. The server runs on 127.0.0.1 on a free port, and is stopped (SIGTERM, as a
service manager stops it) when the call is done, whatever happened.
"""

import argparse, signal, socket, subprocess, sys, time, urllib.request

from openai import OpenAI

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("bundle")
parser.add_argument("out", help="the WAV file to write")
parser.add_argument("--text", default="Hello there.")
parser.add_argument("--max-frames", type=int, default=None)
args = parser.parse_args()

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
server = subprocess.Popen([sys.executable, "-m", "vibevoice_onnx.cli", "serve", args.bundle, "--host", "127.0.0.1",
                           "--port", str(port), "--threads", "1"])
try:
    for _ in range(300):  # at most about a minute for the server to load the bundle
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            break
        except OSError:
            assert server.poll() is None, "the server exited"
            time.sleep(0.2)
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=120)
    extra = {"seed": 7} | ({"max_frames": args.max_frames} if args.max_frames else {})
    with client.audio.speech.with_streaming_response.create(model="tts-1", voice="alloy", input=args.text,
                                                            response_format="wav", extra_body=extra) as response:
        response.stream_to_file(args.out)
    print(f"{args.out}: written by the server ({response.headers.get('x-vibevoice-seed')} was the seed)")
finally:
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(5)
