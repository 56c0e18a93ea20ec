"""The in-browser page of `vibevoice-onnx web` at /local/MODEL/, for each served realtime bundle: the same page,
script and site record as a written site, the bundle's own files, and onnxruntime-web and the tokenizer from the
npm registry (pinned, sha256-checked, fetched on the first request that needs them). The page computes everything
in the tab; the server only hands out files, with the cross-origin isolation headers that WASM threads need."""

from __future__ import annotations

import json
import tempfile
import threading
from importlib import resources
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse, Response

from ..errors import VibeVoiceError
from ..families import family
from ..web.npm import PACKAGES, unpack
from ..web.site import (BUNDLE_FOLDER, CONTENT_TYPES, GATES_RECORD, ISOLATION_HEADERS, SITE_RECORD, UNCHECKED,
                        site_record)
from .http import ApiError

LOCAL_PREFIX = "/local/"
HEADERS = {**ISOLATION_HEADERS, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
# The key cannot travel with what a page loads by itself (modules, WebAssembly, the graphs).
KEYED = ("this server has an API key, and the in-browser page would hand the bundle's files to anyone without it: "
         "host the site `vibevoice-onnx web` writes instead")


class Packages:
    """The npm packages' files, unpacked once per server into a folder that lives as long as it does."""

    def __init__(self):
        self.lock, self.folder = threading.Lock(), None

    def path(self, relative: str) -> Path:
        with self.lock:
            if self.folder is None:
                folder = tempfile.TemporaryDirectory(prefix="vibevoice-local-page-")
                try:
                    for package in PACKAGES:
                        unpack(package, Path(folder.name))
                except VibeVoiceError as e:
                    folder.cleanup()
                    raise ApiError(503, f"the in-browser page's scripts are not available: {e}") from None
                self.folder = folder
        return Path(self.folder.name) / relative


def add_local_routes(app: FastAPI, models, api_key: str | None) -> None:
    """/local/ (the first served realtime bundle's page) and /local/MODEL/... (each one's)."""
    local = {m.id: m.bundle for m in models.by_id.values() if family(m.kind).capabilities.in_browser}
    package_files = {target for package in PACKAGES for _, target in package.files}
    packages = Packages()

    def bundle_of(model: str | None):
        if api_key:
            raise ApiError(403, KEYED)
        if model not in local:
            served = ", ".join(local) or "none"
            raise ApiError(404, f"no in-browser page {'for ' + repr(model) if model else 'here'}: the page runs "
                                f"realtime models (served: {served})")
        return local[model]

    def file(path: Path, name: str) -> FileResponse:
        return FileResponse(path, media_type=CONTENT_TYPES.get(Path(name).suffix, "application/octet-stream"),
                            headers=HEADERS)

    @app.api_route(LOCAL_PREFIX, methods=["GET", "HEAD"], include_in_schema=False)
    def first_page():
        bundle_of(next(iter(local), None))
        return RedirectResponse(f"{LOCAL_PREFIX}{next(iter(local))}/")

    @app.api_route(LOCAL_PREFIX + "{model}", methods=["GET", "HEAD"], include_in_schema=False)
    def page_folder(model: str):
        bundle_of(model)
        return RedirectResponse(f"{LOCAL_PREFIX}{model}/")

    @app.api_route(LOCAL_PREFIX + "{model}/{path:path}", methods=["GET", "HEAD"], include_in_schema=False)
    def page_file(model: str, path: str):
        bundle = bundle_of(model)
        if path in ("", "index.html", "vibevoice.mjs"):
            name = path or "index.html"
            body = resources.files("vibevoice_onnx.web").joinpath("static", name).read_bytes()
            return Response(body, media_type=CONTENT_TYPES[Path(name).suffix], headers=HEADERS)
        if path in (SITE_RECORD, GATES_RECORD):  # a served page is unchecked: web --check checks a written site
            record = site_record(bundle) if path == SITE_RECORD else UNCHECKED
            return Response(json.dumps(record, indent=2), media_type=CONTENT_TYPES[".json"], headers=HEADERS)
        if path in package_files:
            return file(packages.path(path), path)
        inside = path.removeprefix(f"{BUNDLE_FOLDER}/")
        if inside != path and inside in {*bundle.info.files, "manifest.json"}:  # what its manifest records
            return file(bundle.path / inside, inside)
        raise ApiError(404, f"no file {LOCAL_PREFIX}{model}/{path}")
