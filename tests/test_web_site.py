"""`vibevoice-onnx web` without a browser: what it refuses, what the site holds, and the pinned npm downloads'
check (against a stand-in registry on 127.0.0.1, started and stopped here)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import threading

import pytest

from conftest import copy_bundle
from helpers import cli_run


def test_web_refuses_a_bundle_of_another_kind(tiny_asr_bundle, tmp_path):
    done = cli_run("web", str(tiny_asr_bundle), "-o", str(tmp_path / "site"))
    assert done.returncode == 2 and "realtime" in done.stderr, done.stderr
    assert not (tmp_path / "site").exists()


@pytest.mark.parametrize("change", [{"profile": {"name": "fixed"}}, {"device": "cuda"}])
def test_web_refuses_a_profile_or_device_the_page_does_not_run(tiny_bundle, tmp_path, change):
    """The page's loop grows the LMs' caches call by call on fp32 inputs: the fixed profile's static caches and a
    CUDA build's fp16 graphs are refused in one sentence, before anything is written."""
    bundle = copy_bundle(tiny_bundle, tmp_path / "cpu_fp32")
    manifest = json.loads((bundle / "manifest.json").read_text())
    (bundle / "manifest.json").write_text(json.dumps({**manifest, **change}))
    done = cli_run("web", str(bundle), "-o", str(tmp_path / "site"))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    if "profile" in change:
        assert "the fixed profile built for cpu; the page runs bundles of the dynamic profile built for the CPU" in done.stderr
    else:  # refused when opened where onnxruntime has no CUDA, by the page's rule where it has
        assert "is built for CUDA" in done.stderr or "profile built for cuda; the page runs" in done.stderr
    assert not (tmp_path / "site").exists()


def test_web_writes_the_bundle_the_scripts_and_a_record_and_keeps_a_folder_it_did_not_make(tiny_bundle, tmp_path):
    from vibevoice_onnx.runtime.bundle import Bundle, bundle_files
    from vibevoice_onnx.web.npm import PACKAGES

    bundle = copy_bundle(tiny_bundle, tmp_path / "cpu_fp32")
    site = tmp_path / "site"
    done = cli_run("web", str(bundle), "-o", str(site))
    assert done.returncode == 0, done.stderr
    for name in bundle_files(bundle):
        assert (site / "bundle" / name).read_bytes() == (bundle / name).read_bytes(), name
    record = json.loads((site / "site.json").read_text())
    assert record["kind"] == "realtime" and record["refused"] is None and record["voices"] == Bundle(bundle).voices()
    assert set(record["graphs"]) == set(Bundle(bundle).info.graphs)
    assert record["packages"] == {p.name: p.version for p in PACKAGES}
    for package in PACKAGES:
        for _, target in package.files:
            assert (site / target).stat().st_size > 0, target
    assert (site / "index.html").is_file() and (site / "vibevoice.mjs").is_file()
    # `web --check` or `--preview` after `web`, as a user runs them: the site is this one, so it stays with its record
    (site / "browser-gates.json").write_text('{"passed": true, "checked": "by web --check"}\n')
    kept = cli_run("web", str(bundle), "-o", str(site))
    assert kept.returncode == 0 and "holds this site already" in kept.stderr, kept.stderr
    assert json.loads((site / "browser-gates.json").read_text())["checked"] == "by web --check"
    (site / "mine.txt").write_text("a file of the user's")
    again = cli_run("web", str(bundle), "-o", str(site))
    assert again.returncode == 2 and "--force" in again.stderr and (site / "mine.txt").is_file()
    assert cli_run("web", str(bundle), "-o", str(site), "--force").returncode == 0
    assert not (site / "mine.txt").exists()


def test_the_site_records_speaks_refusals_without_force_which_a_page_cannot_pass(tiny_bundle, tmp_path):
    """The page refuses what `speak` refuses, in its sentence less the --force it has no way to give: a bundle
    whose gates failed, and a reduced-precision one never verified."""
    from vibevoice_onnx.runtime.bundle import Bundle
    from vibevoice_onnx.web.site import site_record

    for name, change, words in (("failed", {"parity": {"passed": False, "gates": [{"name": "upper_lm", "passed": False}]}},
                                 "failed its parity gates (upper_lm)"),
                                ("unverified", {"parity": None, "precision": "int8"}, "has not been verified")):
        bundle = copy_bundle(tiny_bundle, tmp_path / name)
        manifest = json.loads((bundle / "manifest.json").read_text())
        (bundle / "manifest.json").write_text(json.dumps({**manifest, **change}))
        refused = site_record(Bundle(bundle))["refused"]
        assert words in refused and "--force" not in refused, refused
        assert "--force" in Bundle(bundle).unusable()  # speak's own sentence says how to override it


@pytest.fixture
def registry(tmp_path):
    """A stand-in for the npm registry on 127.0.0.1: serves the files of a folder."""
    root = tmp_path / "registry"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(
        type("Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": lambda *a: None}), directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_a_pinned_download_is_checked_when_fetched_and_when_reused(registry, tmp_path, monkeypatch):
    from vibevoice_onnx.errors import VibeVoiceError
    from vibevoice_onnx.hub.home import fetch_url

    monkeypatch.setenv("VIBEVOICE_ONNX_HOME", str(tmp_path / "home"))
    root, url = registry
    (root / "pkg.tgz").write_bytes(b"the package as published")
    pinned = hashlib.sha256(b"the package as published").hexdigest()
    with pytest.raises(VibeVoiceError, match="sha256 .* not the 0+ this version pins"):
        fetch_url(f"{url}/pkg.tgz", sha256="0" * 64)
    assert not [p for p in (tmp_path / "home").rglob("*") if p.is_file()]  # nothing half-kept
    path = fetch_url(f"{url}/pkg.tgz", sha256=pinned)
    assert path.read_bytes() == b"the package as published"
    path.write_bytes(b"changed in the cache")  # a cached copy that no longer matches is fetched again
    assert fetch_url(f"{url}/pkg.tgz", sha256=pinned).read_bytes() == b"the package as published"
    (root / "pkg.tgz").write_bytes(b"x" * 3000)
    with pytest.raises(VibeVoiceError, match="larger than 0 MB, so it is not an npm package"):
        fetch_url(f"{url}/pkg.tgz?big", sha256=pinned, limit=2000, what="an npm package")


def test_web_preview_serves_the_site_with_the_isolation_headers_until_stopped(tiny_bundle, tmp_path):
    """`web --preview PORT`: the site on 127.0.0.1 with COOP/COEP and the types modules and WebAssembly need; it
    stops on SIGINT (Ctrl-C) with exit 0, also where it was started with SIGINT ignored (as a shell's background
    job, or a test runner's worker, starts it)."""
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    from helpers import free_port

    port = free_port()
    bundle = copy_bundle(tiny_bundle, tmp_path / "cpu_fp32")
    process = subprocess.Popen([sys.executable, "-m", "vibevoice_onnx.cli", "web", str(bundle), "-o", str(tmp_path / "site"),
                                "--preview", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline, answered = time.monotonic() + 120, {}
        while time.monotonic() < deadline and not answered:
            try:
                for path in ("/", "/vibevoice.mjs", "/ort/ort-wasm-simd-threaded.wasm"):
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                        answered[path] = response.headers
            except OSError:
                answered = {}
                time.sleep(0.3)
        assert answered, process.stderr.read() if process.poll() is not None else "no answer in 120 s"
        for headers in answered.values():
            assert headers["Cross-Origin-Opener-Policy"] == "same-origin"
            assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"
        assert answered["/vibevoice.mjs"]["Content-Type"] == "text/javascript"
        assert answered["/ort/ort-wasm-simd-threaded.wasm"]["Content-Type"] == "application/wasm"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_web_preview_refuses_a_port_it_cannot_listen_on_in_one_sentence(tiny_bundle, tmp_path):
    import socket

    bundle = copy_bundle(tiny_bundle, tmp_path / "cpu_fp32")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        for port, words in ((taken.getsockname()[1], "cannot listen there"), (99999, "from 0 to 65535")):
            done = cli_run("web", str(bundle), "-o", str(tmp_path / "site"), "--force", "--preview", str(port))
            assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_serve_hands_out_the_pages_files_with_the_isolation_headers_and_nothing_else(tiny_bundle, tiny_asr_bundle,
                                                                                     tmp_path):
    """/local/MODEL/: the page, its script, the site record, the bundle's recorded files and the npm packages, each
    with COOP and COEP and its type; no other file, no page for a model that does not run in a browser, and none
    on a server with an API key (the key cannot travel with what a page loads by itself)."""
    from fastapi.testclient import TestClient

    from vibevoice_onnx.runtime.bundle import Bundle
    from vibevoice_onnx.serve.app import Settings, create_app
    from vibevoice_onnx.serve.models import Models
    from vibevoice_onnx.web.site import ISOLATION_HEADERS

    tiny_bundle = copy_bundle(tiny_bundle, tmp_path / "cpu_fp32")
    (tiny_bundle / "private.txt").write_text("a file in the bundle's folder that its manifest does not record")
    models = Models.open([tiny_bundle, tiny_asr_bundle])
    with TestClient(create_app(models, Settings())) as client:
        page = "/local/vibevoice-realtime-cpu-fp32/"
        assert client.get("/local/", follow_redirects=False).headers["location"] == page
        manifest = Bundle(tiny_bundle).info.graphs["upper_lm"]["file"]
        expected = {"": "text/html; charset=utf-8", "vibevoice.mjs": "text/javascript", "site.json": "application/json",
                    f"bundle/{manifest}": "application/octet-stream", "bundle/manifest.json": "application/json",
                    "ort/ort-wasm-simd-threaded.wasm": "application/wasm", "tokenizers/tokenizers.min.mjs": "text/javascript"}
        for path, content_type in expected.items():
            response = client.get(page + path)
            assert response.status_code == 200, (path, response.text)
            assert response.headers["content-type"].split(";")[0] == content_type.split(";")[0], path
            assert all(response.headers[k] == v for k, v in ISOLATION_HEADERS.items()), path
        assert client.get(page + f"bundle/{manifest}").content == (tiny_bundle / manifest).read_bytes()
        head = client.head(page + f"bundle/{manifest}")  # as a host answers HEAD: the length, no body
        assert head.status_code == 200 and int(head.headers["content-length"]) == (tiny_bundle / manifest).stat().st_size
        record = client.get(page + "site.json").json()
        assert record["bundle"] == "bundle" and record["voices"] == ["synthetic"] and record["refused"] is None
        for path in ("bundle/private.txt", "bundle/%2e%2e/bundle/manifest.json", "ort/package.json.bak", "local.py"):
            assert client.get(page + path).status_code == 404, path
        asr = client.get("/local/vibevoice-asr-cpu-fp32/")
        assert asr.status_code == 404 and "the page runs realtime models (served: vibevoice-realtime-cpu-fp32)" in asr.text
    with TestClient(create_app(models, Settings(api_key="k"))) as client:
        refused = client.get(page)
        assert refused.status_code == 403 and "has an API key" in refused.json()["error"]["message"]


def test_web_check_without_a_browser_says_what_to_install(tiny_bundle, tmp_path):
    """--check on a machine without Chromium: the site is written, then one sentence naming what is missing."""
    import os
    import subprocess
    import sys

    bin_only = tmp_path / "bin"
    bin_only.mkdir()
    done = subprocess.run([sys.executable, "-m", "vibevoice_onnx.cli", "web", str(tiny_bundle), "-o",
                           str(tmp_path / "site"), "--check"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": str(bin_only)})
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "Chromium is not installed (looked for chromium, chromium-browser, google-chrome)" in done.stderr
    assert "apt install chromium chromium-driver" in done.stderr and (tmp_path / "site" / "index.html").is_file()
