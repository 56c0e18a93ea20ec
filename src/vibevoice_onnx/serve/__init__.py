"""An OpenAI-compatible speech and transcription server over vibevoice-onnx bundles (the `serve` extra:
FastAPI, uvicorn, PyAV). Above the runtime: it imports the runtime, never torch."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from ..families import family
from .app import API_KEY_ENV, Settings, create_app
from .models import Models

__all__ = ["API_KEY_ENV", "Models", "Settings", "create_app", "open_models", "run"]


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
    streams end at their next frame with their encoders flushed, and the process exits."""
    import uvicorn

    models = open_models(bundles, settings, threads, force, aliases, log_level)
    app = create_app(models, settings)
    # said once every bundle is open and admitted: a refused bundle never reads as a server that started
    print(f"serving on http://{host}:{port} (Ctrl-C or SIGTERM stops)", file=sys.stderr, flush=True)
    for model in [] if settings.api_key else models.by_id.values():
        if family(model.kind).capabilities.in_browser:
            print(f"  {model.id} in the browser, computed in the tab: http://{host}:{port}/local/{model.id}/",
                  file=sys.stderr, flush=True)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            settings.stopping.set()  # streams wind down at their next frame, before uvicorn waits for them
            super().handle_exit(sig, frame)

    from uvicorn.config import WS_PROTOCOLS

    ws = "websockets-sansio" if "websockets-sansio" in WS_PROTOCOLS else "websockets"  # the other is deprecated
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, ws=ws,
                            ws_max_size=1 << 20, timeout_graceful_shutdown=shutdown_seconds, timeout_keep_alive=30)
    Server(config).run()
