"""Small helpers for tests: modified copies of synthetic checkpoints, running without torch, and a real
`vibevoice-onnx serve` process."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file


def copy_checkpoint(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("voices"))
    return dst


def set_tensor(checkpoint: Path, name: str, value: np.ndarray) -> None:
    path = checkpoint / "model.safetensors"
    tensors = load_file(path)
    tensors[name] = np.asarray(value).astype(tensors[name].dtype)
    save_file(tensors, path, metadata={"format": "pt"})


def set_config(checkpoint: Path, section: str, key: str, value) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    (config[section] if section else config)[key] = value
    (checkpoint / "config.json").write_text(json.dumps(config, indent=2))


BLOCK_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):  # as Python says it of a package not installed
            raise ModuleNotFoundError(f"blocked import of {name}", name=name.split(".")[0])
sys.meta_path.insert(0, Block())
"""


def run_torch_free(code: str):
    """Run `code` in a fresh interpreter where torch and transformers cannot be imported; it must end with
    neither loaded. Returns the completed process (stdout has "torch-free ok" when all went well)."""
    import subprocess
    import sys

    check = """
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
assert not loaded, loaded
print("torch-free ok")
"""
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH + code + check], capture_output=True, text=True)


def torch_blocked_environment(folder: Path) -> dict:
    """The environment of a process (and of every Python process it starts: Ray's workers too) in which torch and
    transformers cannot be imported: a sitecustomize that installs BLOCK_TORCH, first on PYTHONPATH."""
    import os

    site = folder / "torch-blocked"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCK_TORCH)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}


KEY = "test-key"


def fuzz_examples(default: int) -> int:
    """Examples a fuzzing test runs: its CI budget, times VIBEVOICE_FUZZ_SCALE (benchmarks/fuzz.py's long run)."""
    import os

    return default * int(os.environ.get("VIBEVOICE_FUZZ_SCALE", "1"))


def fuzz_seed() -> int:
    import os

    return int(os.environ.get("VIBEVOICE_FUZZ_SEED", "1"))


def cli(*args: str) -> bytes:
    """A vibevoice-onnx command in its own process, on one thread: its standard output; it must succeed."""
    done = subprocess.run([sys.executable, "-m", "vibevoice_onnx.cli", *args, "--threads", "1"], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout


def cli_run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """A vibevoice-onnx command in its own process, as a user runs it: its exit status and text output."""
    return subprocess.run([sys.executable, "-m", "vibevoice_onnx.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def dead_pid() -> int:
    """The id of a process that has ended and been reaped: a killed writer's, for its leftover partials."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`vibevoice-onnx serve` in its own process; stopped with SIGTERM, as a service manager does."""

    command = "serve"

    def __init__(self, bundles: list[Path], log: Path, *options: str, threads: str | None = "1",
                 start_seconds: float = 90, env: dict | None = None, key: str | None = KEY):
        self.port, self.log, self.key = free_port(), log, key
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "vibevoice_onnx.cli", self.command, *map(str, bundles), *self.address(),
             *(["--threads", threads] if threads else []), *options],
            stdout=subprocess.DEVNULL, stderr=open(log, "wb"), env=env)
        deadline = time.monotonic() + start_seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited: {log.read_text()}")
            if self.ready():
                return
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"the server did not start in {start_seconds:g} s: {log.read_text()}")

    def address(self) -> list[str]:
        return ["--port", str(self.port), *(["--api-key", self.key] if self.key else [])]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return json.load(r)["status"] == "ok"
        except OSError:
            return False

    def client(self, **options):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=KEY, max_retries=0, timeout=60, **options)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, then the exit status; whatever the tests sent, the log must hold no traceback."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
            raise AssertionError("the server did not stop within 30 s of SIGTERM") from None
        assert "Traceback" not in self.log.read_text(), self.log.read_text()
        return status


class WyomingServer(Server):
    """`vibevoice-onnx wyoming` in its own process (helpers.Server: started, then stopped with SIGTERM, its log
    free of tracebacks); ready once it answers describe."""

    command = "wyoming"

    def address(self) -> list[str]:
        return ["--uri", f"tcp://127.0.0.1:{self.port}"]

    def ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                s.sendall(b'{"type": "describe"}\n')
                return b'"info"' in s.makefile("rb").readline()
        except OSError:
            return False


def eventually(condition, deadline: float, every: float = 0.1) -> bool:
    """Whether `condition()` holds before `deadline` seconds pass: a wait for an event, whose deadline only bounds
    a failure (it is no measurement: it passes as soon as the event comes, however loaded the machine)."""
    end = time.monotonic() + deadline
    while True:
        if condition():
            return True
        if time.monotonic() > end:
            return False
        time.sleep(every)


def live_streams(url: str, model: str = "vibevoice-realtime-cpu-fp32") -> int:
    """The generations of `model` running now, as the server reports them (GET /v1/models/ID, its batching)."""
    request = urllib.request.Request(f"{url}/v1/models/{model}", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["batching"]["streams"]


LONG_SPEECH = 100_000  # frames: minutes of work even for a tiny bundle, so a gathered answer could not come early


def assert_audio_streams_while_it_is_made(client, text: str, url: str | None = None, log: Path | None = None) -> None:
    """Speech is streamed as it decodes, not gathered: the first audio of a request for LONG_SPEECH frames comes
    within the client's timeout (a server that gathered would send nothing before the end, minutes later), and,
    where `url` is the server itself (not a proxy in front of replicas, which routes a look to an idle one),
    while it reports that generation running (held there by the client that reads nothing more: serve.http.Pump).
    Judged by events, not by timing. `log`: the server's, whose lines of this request a failure shows."""
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=text, response_format="pcm",
            extra_body={"seed": 1, "max_frames": LONG_SPEECH}) as response:
        assert next(response.iter_bytes())  # the client reads nothing more while it looks
        if url is not None:
            if not eventually(lambda: live_streams(url) >= 1, 60):
                request = response.headers.get("x-request-id", "?")
                lines = [line for line in log.read_text().splitlines() if request in line] if log else []
                raise AssertionError(f"no generation running while its audio streams (request {request}; the "
                                     f"server's log of it: {lines})")


# The per-graph gate that judges each realtime graph a gain is put into on purpose
# (verify.calibration.REALTIME_GAIN_POINTS: gained_copy)
GAINED_GATES = {"acoustic_decoder_stream": "acoustic_decoder_stream (3 frames, states)",
                "diffusion_head_step": "diffusion_head", "acoustic_connector": "acoustic_connector",
                "upper_lm": "upper_lm (past 11, new 5)"}


def gained_copy(bundle: Path, dst: Path, factor: float) -> Path:
    """A copy of a realtime `bundle` with each gain point's output multiplied by `factor` (a gain, which no
    cosine sees): each is judged by its GAINED_GATES gate."""
    from vibevoice_onnx.verify.calibration import REALTIME_GAIN_POINTS, scaled_output

    assert REALTIME_GAIN_POINTS.keys() == GAINED_GATES.keys()
    shutil.copytree(bundle, dst)
    for graph, output in REALTIME_GAIN_POINTS.items():
        scaled_output(dst / f"{graph}.onnx", output, factor)
    return dst


CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


def chromium(folder: Path, script_timeout: float, *flags: str):
    """Debian's headless Chromium under Selenium (web.check's), its profile and driver log in `folder`."""
    from vibevoice_onnx.web.check import headless_chromium

    return headless_chromium(folder, script_timeout, *flags)


NODE, NPM = shutil.which("node"), shutil.which("npm")
STATIC = Path(__file__).parents[1] / "src" / "vibevoice_onnx" / "web" / "static"  # the JavaScript module's package


def node_project(folder: Path, timeout: float) -> dict:
    """A Node.js project in `folder` as a developer makes one: the module's `npm pack` and onnxruntime-node from the
    npm registry installed (its install script, which fetches CUDA binaries from outside the registry, skipped: the
    CPU binaries are in the package), and tests/javascript/driver.mjs beside them. {folder, packed: npm pack's
    record}."""
    from vibevoice_onnx.web.npm import ONNXRUNTIME_WEB

    def npm(*args: str) -> str:
        done = subprocess.run([NPM, *args], cwd=folder, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    packed = json.loads(npm("pack", str(STATIC), "--json", "--pack-destination", str(folder)))[0]
    (folder / "package.json").write_text(json.dumps({"name": "user-project", "private": True, "type": "module"}))
    npm("install", "--ignore-scripts", "--no-audit", "--no-fund", "--no-package-lock", str(folder / packed["filename"]),
        f"onnxruntime-node@{ONNXRUNTIME_WEB.version}")
    shutil.copy(Path(__file__).parent / "javascript" / "driver.mjs", folder / "driver.mjs")
    return {"folder": folder, "packed": packed}


FAILED_PARITY = {"passed": False, "gates": [{"name": "upper_lm (past 11, new 5)", "passed": False}]}


def with_parity(bundle: Path, parity: dict | None) -> Path:
    """`bundle` (a copy) with its manifest's parity record replaced: FAILED_PARITY, or None for one never verified."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["parity"] = parity
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return bundle


def tiny_sites(root: Path, fp32: Path, int8: Path, scratch: Path) -> Path:
    """The sites `web` writes, under `root`, for a tiny realtime bundle at fp32 and int8 and for a copy of the fp32
    one (made in `scratch`) whose gates failed: root/fp32, root/int8, root/failed."""
    from vibevoice_onnx.web.site import write_site

    write_site(fp32, root / "fp32", log=lambda _: None)
    write_site(int8, root / "int8", log=lambda _: None)
    failed = with_parity(Path(shutil.copytree(fp32, scratch / "cpu_fp32")), FAILED_PARITY)
    write_site(failed, root / "failed", log=lambda _: None)
    return root


@contextlib.contextmanager
def hosted(folder: Path, shared: bool = False):
    """`folder` served on 127.0.0.1 (any free port: an origin of its own) with the cross-origin isolation headers,
    for the block: its URL, and the paths asked for, in order. `shared`: pages of other origins may read its files
    too (CORS, and the resource policy an isolated page needs), as the Hub's resolve URLs let them."""
    import functools
    import http.server
    import threading

    from vibevoice_onnx.web.site import IsolatedHandler

    asked = []

    class Logged(IsolatedHandler):
        def do_GET(self):
            asked.append(self.path.lstrip("/"))
            super().do_GET()

        def end_headers(self):
            if shared:
                self.send_header("Access-Control-Allow-Origin", "*")
                self.send_header("Cross-Origin-Resource-Policy", "cross-origin")
            super().end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Logged, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


FIREFOX = Path("/usr/bin/firefox-esr")


class Firefox:
    """Debian's headless Firefox ESR driven through Marionette (the marionette-driver package: no geckodriver
    package is reachable here), answering as Selenium's driver does where web.check's gates call it: get,
    execute_script, execute_async_script (the callback last among the arguments), quit. Scripts run in the page's
    own scope, not a sandbox, so they see what the page's module set."""

    def __init__(self, folder: Path, script_timeout: float):
        from marionette_driver.marionette import Marionette

        self.client = Marionette(host="127.0.0.1", port=free_port(), bin=str(FIREFOX), headless=True,
                                 gecko_log=str(folder / "gecko.log"), startup_timeout=120)
        self.client.start_session()
        self.client.timeout.script = script_timeout
        self.client.timeout.page_load = 30

    def get(self, url: str) -> None:
        self.client.navigate(url)

    def execute_script(self, script: str, *args):
        return self.client.execute_script(script, script_args=args, sandbox=None)

    def execute_async_script(self, script: str, *args):
        return self.client.execute_async_script(script, script_args=args, sandbox=None)

    def quit(self) -> None:
        self.client.cleanup()


def open_sessions(monkeypatch) -> list[set]:
    """From now on, each time a bundle opens a graph's session: the (precision, graph) of every onnxruntime session
    alive at that moment (a session closed, or no longer referenced, is gone)."""
    import weakref

    from vibevoice_onnx.runtime.bundle import Bundle

    live, moments = set(), []
    original = Bundle.session

    def session(self, name):
        made = name not in self._sessions
        opened = original(self, name)
        if made:
            key = (self.info.precision, name, id(opened.session))
            live.add(key)
            weakref.finalize(opened.session, live.discard, key)
            moments.append({(precision, graph) for precision, graph, _ in live})
        return opened

    monkeypatch.setattr(Bundle, "session", session)
    return moments
