"""Errors that the CLI reports as one sentence, without a traceback."""


class VibeVoiceError(Exception):
    """A problem the user can act on: bad input, a file that is not what it claims, a failed gate."""


class CheckpointError(VibeVoiceError):
    """A checkpoint directory that cannot be recognised or read."""


class BundleError(VibeVoiceError):
    """An ONNX bundle that is missing, incomplete or of the wrong kind."""


class StorageFull(VibeVoiceError):
    """A write the file system refused for want of room: a full disk (ENOSPC), a quota (EDQUOT) or a file-size
    limit (EFBIG). What was being written is gone and what was there before is as it was; the server answers 507,
    and a batch job stops here rather than failing every item after."""


def listen_address(uri: str) -> tuple[str, str, int | None]:
    """A server's --uri read once for every place that takes one: ("tcp", HOST, PORT) with a port from 1 to 65535,
    or ("unix", PATH, None); anything else refused in one sentence."""
    from urllib.parse import urlparse

    where = urlparse(uri)
    try:
        port = where.port if where.scheme == "tcp" else None
    except ValueError:  # not a number, or past 65535
        port = -1
    if where.scheme == "unix" and where.path:
        return "unix", where.path, None
    if where.scheme == "tcp" and where.hostname and port is not None and 1 <= port <= 65535:
        return "tcp", where.hostname, port
    raise VibeVoiceError(f"{uri}: give tcp://HOST:PORT with a port from 1 to 65535 (tcp://0.0.0.0:10200 listens on "
                         "the LAN) or unix://PATH")


def cannot_listen(where: str, error: OSError, instead: str) -> VibeVoiceError:
    """A server's address refused (taken, not this machine's, not allowed), in the one sentence every server gives."""
    import os

    reason = os.strerror(error.errno) if error.errno else str(error)  # asyncio's errors carry no strerror
    return VibeVoiceError(f"{where}: cannot listen there ({reason}); {instead}")
