"""The web page at `/`: three static files shipped in the package (static/), which use only the server's
public routes. They are open without the API key: the page asks for the key and sends it with every call."""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

from .http import ApiError
from .local import LOCAL_PREFIX

PAGE_PREFIX = "/web/"
PAGE_FILES = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
              "style.css": "text/css; charset=utf-8",
              "capture.js": "text/javascript; charset=utf-8"}  # the microphone's AudioWorklet
# The page loads nothing from elsewhere; audio it builds itself is a blob: URL.
PAGE_HEADERS = {"Content-Security-Policy": "default-src 'self'; media-src 'self' blob:; img-src 'self' data:; "
                                           "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
                "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}


def is_open(path: str) -> bool:
    """Paths served without the API key: health, the page's own files, and the in-browser page's (which refuses
    itself on a server with a key: serve.local)."""
    return path in ("/health", "/") or path.startswith((PAGE_PREFIX, LOCAL_PREFIX.rstrip("/")))


def _page_file(name: str) -> Response:
    if name not in PAGE_FILES:
        raise ApiError(404, f"no route {PAGE_PREFIX}{name}")
    body = resources.files(__package__).joinpath("static", name).read_bytes()
    return Response(body, media_type=PAGE_FILES[name], headers=PAGE_HEADERS)


def add_page_routes(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def page():
        return _page_file("index.html")

    @app.get(PAGE_PREFIX + "{name}", include_in_schema=False)
    async def page_file(name: str):
        return _page_file(name)
