"""A static site for a realtime bundle: the bundle's files, onnxruntime-web and a JavaScript tokenizer from the npm
registry (web.npm), and the page with its script (web/static). Nothing is computed on a server: any static host
serves it (with the cross-origin isolation headers, WASM runs multi-threaded; see docs/browser.md)."""

from __future__ import annotations

import contextlib
import filecmp
import functools
import http.server
import threading
import json
import os
import shutil
from importlib import resources
from pathlib import Path

from ..errors import VibeVoiceError, cannot_listen
from ..families import kinds_that
from ..outputs import atomic_directory
from ..runtime.bundle import Bundle, bundle_files
from .npm import PACKAGES, unpack

BUNDLE_FOLDER = "bundle"  # the bundle's files, as the bundle has them
SITE_RECORD = "site.json"
GATES_RECORD = "browser-gates.json"  # web --check's record (web.check); until it runs, UNCHECKED
UNCHECKED = {"passed": None, "note": "not checked in a browser: vibevoice-onnx web --check holds this page to the "
                                    "Python runtime"}
# The headers a host must send for WASM threads (SharedArrayBuffer): without them the page runs on one thread.
ISOLATION_HEADERS = {"Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp"}
# What a host must call the site's files: browsers run modules and compile WebAssembly only with these types.
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".mjs": "text/javascript", ".json": "application/json",
                 ".wasm": "application/wasm", ".onnx": "application/octet-stream"}


def write_site(bundle_dir: Path, out: Path, force: bool = False, log=print) -> Path:
    """The site for the bundle at `bundle_dir` (a kind whose loop runs in the browser: realtime), written into
    `out`: new or empty, or holding exactly this site already (then its browser gates record is kept: `web --check`
    or `--preview` after `web`), or anything (`force`: replaced). Whole or not at all."""
    bundle = Bundle(Path(bundle_dir))
    bundle.require_kind(*kinds_that(in_browser=True))
    if (bundle.info.profile_name, bundle.info.device) != ("dynamic", "cpu"):
        raise VibeVoiceError(f"{bundle.path}: a bundle of the {bundle.info.profile_name} profile built for "
                             f"{bundle.info.device}; the page runs bundles of the dynamic profile built for the CPU "
                             "(fp32, int8-decoder, int8 or int4-mixed; build --profile dynamic --device cpu)")
    bundle.check_files()  # what the page is given is what was built and verified
    out = Path(out)
    with atomic_directory(out, action="writing the site") as partial:
        copy_bundle_files(bundle.path, partial / BUNDLE_FOLDER)
        for package in PACKAGES:
            log(f"  {package.name} {package.version} (npm, sha256 checked)")
            unpack(package, partial)
        static = resources.files(__package__) / "static"
        for name in ("index.html", "vibevoice.mjs"):
            (partial / name).write_bytes((static / name).read_bytes())
        (partial / SITE_RECORD).write_text(json.dumps(site_record(bundle), indent=2) + "\n")
        (partial / GATES_RECORD).write_text(json.dumps(UNCHECKED) + "\n")
        if out.is_dir() and any(out.iterdir()):
            if same_site(partial, out):
                shutil.copyfile(out / GATES_RECORD, partial / GATES_RECORD)
                log(f"  {out} holds this site already: its browser gates record kept")
            elif not force:
                raise VibeVoiceError(f"{out}: is not empty; give a new folder, or --force to replace what is there")
    return out


def same_site(written: Path, there: Path) -> bool:
    """Whether `there` holds the files of the site just `written` and no other (its gates record aside)."""
    def files(root: Path) -> set[Path]:
        return {p.relative_to(root) for p in root.rglob("*") if p.is_file()}

    names = files(written)
    return names == files(there) and all(
        os.path.samefile(written / name, there / name) or filecmp.cmp(written / name, there / name, shallow=False)
        for name in names - {Path(GATES_RECORD)})


def site_record(bundle: Bundle) -> dict:
    """What the page reads first: the bundle, its gates and whether `speak` would refuse it, the voices (a static
    host cannot list a folder) and the JavaScript's versions."""
    parity = bundle.info.parity
    return {"bundle": BUNDLE_FOLDER, "kind": bundle.kind, "precision": bundle.info.precision,
            "gates": "not verified" if not parity else "passed" if parity["passed"] else "failed",
            "refused": bundle.unusable(forcible=False),  # speak's sentence, less --force: the page has none
            "voices": bundle.voices(), "max_positions": bundle.dims.tts_lm.max_positions,
            "graphs": {name: {"file": graph["file"], "data": external_data(bundle.path, graph["file"])}
                       for name, graph in bundle.info.graphs.items()},
            "packages": {p.name: p.version for p in PACKAGES}}


def external_data(bundle_dir: Path, graph_file: str) -> str | None:
    """The file holding a graph's large weights, beside it (the exporter's name), which onnxruntime-web is given
    explicitly: a browser cannot look beside a URL."""
    data = f"{graph_file}.data"
    return data if (Path(bundle_dir) / data).is_file() else None


def copy_bundle_files(source: Path, target: Path) -> None:
    """The bundle's files (those its manifest records, and the manifest), hard-linked where the file system allows."""
    target.mkdir(parents=True, exist_ok=True)
    for name in [*bundle_files(source), "manifest.json"]:
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source / name, destination)
        except OSError:
            shutil.copyfile(source / name, destination)


class IsolatedHandler(http.server.SimpleHTTPRequestHandler):
    """A static host as a site needs: the cross-origin isolation headers on every file, modules and WebAssembly
    with their types."""

    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, **CONTENT_TYPES}

    def end_headers(self):
        for name, value in ISOLATION_HEADERS.items():
            self.send_header(name, value)
        super().end_headers()

    def log_message(self, *args):  # a page loads dozens of files: no line each
        pass


def site_server(site: Path, port: int, host: str = "127.0.0.1") -> http.server.ThreadingHTTPServer:
    """A local static server for `site` (port 0: any free one); serve_forever() runs it."""
    if not 0 <= port <= 65535:
        raise VibeVoiceError(f"port {port}: a port is a number from 0 to 65535 (0: any free one)")
    try:
        return http.server.ThreadingHTTPServer((host, port), functools.partial(IsolatedHandler, directory=str(site)))
    except OSError as e:
        raise cannot_listen(f"{host}:{port}", e, "give another port, or 0 for any free one") from None


@contextlib.contextmanager
def served(site: Path):
    """`site` served on 127.0.0.1 (any free port) in a thread for the block: its URL, without a trailing slash;
    stopped, its port closed, when the block ends."""
    server = site_server(Path(site), 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
