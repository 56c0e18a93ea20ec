"""An OpenAI-compatible speech and transcription server over vibevoice-onnx bundles (the `serve` extra:
FastAPI, uvicorn, PyAV). Above the runtime: it imports the runtime, never torch."""

from __future__ import annotations

import logging
import socket
import sys
from pathlib import Path

from ..errors import cannot_listen
from ..families import family
from .app import API_KEY_ENV, Settings, create_app
from .models import Models

__all__ = ["API_KEY_ENV", "Models", "Settings", "create_app", "open_models", "run"]


def bound_socket(host: str, port: int) -> socket.socket:
    """The server's address, taken before its models load (a port in use fails at once, not after minutes of
    loading, and never after "serving on"); it listens once uvicorn serves on it."""
    try:
        family_, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        bound = socket.socket(family_, kind)
    except OSError as error:
        raise cannot_listen(f"{host}:{port}", error, "give another --host") from None
    try:
        bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a restart reuses the port
        bound.bind(address)
    except OSError as error:
        bound.close()
        raise cannot_listen(f"{host}:{port}", error, "give another --port, or 0 for any free one") from None
    return bound


def open_models(bundles: list[Path], settings: Settings, threads: int | None = None, force: bool = False,
                aliases: dict[str, str] | None = None, log_level: str = "info") -> Models:
    """A server's log set up (a line per request; debug: tracebacks too) and every bundle opened once, a line
    each: what every server command does before it listens."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("vibevoice_onnx").setLevel(log_level.upper())
    models = Models.open(bundles, threads=threads, force=force, aliases=aliases, max_batch=settings.max_batch)
    for model in models.by_id.values():
        logging.getLogger("vibevoice_onnx.serve").info("model %s: %s %s, %d voices, from %s", model.id, model.kind,
                                                       model.bundle.info.precision, len(model.voices()),
                                                       model.bundle.path)
    return models


def run(bundles: list[Path], settings: Settings, host: str = "127.0.0.1", port: int = 8000, threads: int | None = None,
        force: bool = False, aliases: dict[str, str] | None = None, shutdown_seconds: float = 10.0,
        log_level: str = "info") -> None:
    """Open every bundle once, then serve until SIGTERM or Ctrl-C: new connections are refused at once, running
    streams end at their next frame with their encoders flushed, and the process exits. Port 0: any free one."""
    with bound_socket(host, port) as listening:
        models = open_models(bundles, settings, threads, force, aliases, log_level)
        server = _server(create_app(models, settings), settings, shutdown_seconds)
        where = f"http://{host}:{listening.getsockname()[1]}"
        # said once every bundle is open and admitted: a refused bundle never reads as a server that started
        print(f"serving on {where} (Ctrl-C or SIGTERM stops)", file=sys.stderr, flush=True)
        for model in [] if settings.api_key else models.by_id.values():
            if family(model.kind).capabilities.in_browser:
                print(f"  {model.id} in the browser, computed in the tab: {where}/local/{model.id}/", file=sys.stderr,
                      flush=True)
        server.run(sockets=[listening])


def _server(app, settings: Settings, shutdown_seconds: float):
    """uvicorn's server for `app`: SIGTERM and Ctrl-C wind the streams down before it waits for them."""
    import uvicorn
    from uvicorn.config import WS_PROTOCOLS

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            settings.stopping.set()  # streams wind down at their next frame, before uvicorn waits for them
            super().handle_exit(sig, frame)

    ws = "websockets-sansio" if "websockets-sansio" in WS_PROTOCOLS else "websockets"  # the other is deprecated
    return Server(uvicorn.Config(app, log_level="warning", access_log=False, ws=ws, ws_max_size=1 << 20,
                                 timeout_graceful_shutdown=shutdown_seconds, timeout_keep_alive=30))
