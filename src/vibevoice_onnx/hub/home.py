"""Where vibevoice-onnx keeps what it fetches and builds: $VIBEVOICE_ONNX_HOME (default ~/.cache/vibevoice-onnx).

Checkpoints, tokenizers and prebuilt bundles from the Hub live in the Hugging Face cache, as every Hub tool
keeps them; this home holds what is ours: bundles built from checkpoints (bundles/) and files downloaded
from plain URLs, such as voice presets (downloads/).
"""

from __future__ import annotations

import hashlib
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from ..errors import VibeVoiceError
from ..outputs import atomic_file, file_sha256

HOME_ENV = "VIBEVOICE_ONNX_HOME"
MAX_DOWNLOAD_BYTES = 256 * 2**20  # a voice preset is ~1-3 MB, a voice sample a few MB: anything larger is refused
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


def home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".cache" / "vibevoice-onnx").expanduser()


def is_url(spec: str) -> bool:
    return str(spec).startswith(("http://", "https://"))


def offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


def fetch_url(url: str, timeout: float = 30.0, sha256: str | None = None, limit: int = MAX_DOWNLOAD_BYTES,
              what: str = "a voice file") -> Path:
    """The file at an http(s) URL, downloaded once into downloads/ (keyed by the URL) and reused from there,
    also offline. The content is untrusted: whoever reads it (the preset allow-list, the audio decoder) checks it;
    here it is bounded in size (`limit` bytes, else it is not `what`), checked against `sha256` where the caller
    pins one (on download and on reuse), and written atomically, so a broken download never looks complete."""
    name = _SAFE_NAME.sub("_", Path(urllib.parse.urlparse(url).path).name) or "download"
    target = home() / "downloads" / hashlib.sha256(url.encode()).hexdigest()[:16] / name
    if target.is_file():
        if sha256 is None or file_sha256(target) == sha256:
            return target
        target.unlink()  # changed since it was checked: fetched again, and checked again
    if offline():
        raise VibeVoiceError(f"{url}: not downloaded yet, and HF_HUB_OFFLINE is set; fetch it once with network, "
                             "or give a local file")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "vibevoice-onnx"}),
                                    timeout=timeout) as response, atomic_file(target, "downloading") as partial:
            digest, size = hashlib.sha256(), 0
            with open(partial, "wb") as out:
                while block := response.read(2**20):
                    size += len(block)
                    if size > limit:
                        raise VibeVoiceError(f"{url}: larger than {limit // 2**20} MB, so it is not {what}; refused")
                    digest.update(block)
                    out.write(block)
            if sha256 is not None and digest.hexdigest() != sha256:
                raise VibeVoiceError(f"{url}: its sha256 is {digest.hexdigest()}, not the {sha256} this version pins: "
                                     "changed or damaged on the way, so it is refused")
    except urllib.error.HTTPError as e:
        raise VibeVoiceError(f"{url}: the server answered {e.code} {e.reason}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
        reason = getattr(e, "reason", e)
        raise VibeVoiceError(f"{url}: cannot be downloaded ({reason})") from None
    return target


def local_file(spec: str | Path) -> Path:
    """A local path as it is, or an http(s) URL's file from the download cache."""
    return fetch_url(str(spec)) if is_url(str(spec)) else Path(spec)
