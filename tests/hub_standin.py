"""Stand-ins for the Hugging Face Hub, for tests on machines that reach no hub.

- StandInHub: an HTTP server on 127.0.0.1 that answers the routes `huggingface_hub` downloads through, as the Hub
  does: the model route (`/api/models/ORG/NAME[/revision/REV]`: the commit and the file list) and the resolve
  route (`/ORG/NAME/resolve/REV/PATH`: HEAD with X-Repo-Commit, ETag and size; GET with Range), with the Hub's
  X-Error-Code answers for a missing, private or gated repository and a missing file. Pointing HF_ENDPOINT at
  it makes `huggingface_hub`'s own client code run, cache and resume. It can cut a file's first download short
  (a dropped connection) and counts every request.
- write_offline_cache: a Hugging Face cache written in the library's own layout (models--ORG--NAME/{blobs,
  refs/REV, snapshots/COMMIT/...}), for HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def commit_of(repo_id: str, folder: Path) -> str:
    """A repository snapshot's commit id: 40 hex digits from its files (stable across runs)."""
    digest = hashlib.sha1(repo_id.encode())
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def repo_files(folder: Path) -> dict[str, Path]:
    return {p.relative_to(folder).as_posix(): p for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def file_etag(path: Path) -> str:
    from vibevoice_onnx.outputs import file_sha256

    return file_sha256(path)


class StandInHub:
    def __init__(self):
        self.repos: dict[str, dict] = {}  # repo id -> {"refs": {name: commit}, "commits": {commit: {path: Path}}, ...}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request
        self.ranges: list[tuple[str, str]] = []  # (path, Range header) of every GET that asked for part of a file
        self.files: dict[str, Path] = {}  # plain files by URL path (add_file)
        self.cut: dict[str, int] = {}  # file path in repo -> bytes sent before the first GET is dropped
        self._etags: dict[Path, str] = {}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def add_repo(self, repo_id: str, folder: Path, revision: str = "main", access: str = "public") -> str:
        """Serve `folder` as `repo_id` at `revision`; access "public", "private" or "gated" (no token has
        access). Returns the commit id."""
        commit = commit_of(repo_id, folder)
        repo = self.repos.setdefault(repo_id, {"refs": {}, "commits": {}, "access": access})
        repo["refs"][revision] = commit
        repo["commits"][commit] = repo_files(folder)
        return commit

    def add_file(self, url_path: str, path: Path) -> None:
        """Serve one plain file at `url_path` (a voice preset published outside the Hub, say)."""
        self.files[url_path] = Path(path)

    def downloads(self, name: str | None = None) -> list[str]:
        """The GET requests for files (of the file `name`, if given)."""
        return [path for method, path in self.requests if method == "GET" and "/resolve/" in path
                and (name is None or path.endswith("/" + name))]

    def _etag(self, path: Path) -> str:
        if path not in self._etags:
            self._etags[path] = file_etag(path)
        return self._etags[path]

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet: the tests read hub.requests instead
                pass

            def do_HEAD(self):
                self._route(body=False)

            def do_GET(self):
                self._route(body=True)

            def _error(self, status: int, code: str, extra: dict | None = None):
                payload = json.dumps({"error": code}).encode()
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for key, value in (extra or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            def _repo(self, repo_id: str):
                repo = hub.repos.get(repo_id)
                if repo is None or repo["access"] == "private":
                    self._error(401, "RepoNotFound")
                    return None
                if repo["access"] == "gated":
                    self._error(401, "GatedRepo")
                    return None
                return repo

            def _route(self, body: bool):
                path = self.path.split("?")[0]
                hub.requests.append((self.command, path))
                info = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/(.+))?", path)
                resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
                if info:
                    repo = self._repo(info.group(1))
                    if repo is None:
                        return
                    commit = self._commit(repo, info.group(2) or "main")
                    if commit is None:
                        return
                    payload = json.dumps({"id": info.group(1), "sha": commit, "private": False,
                                          "siblings": [{"rfilename": name} for name in repo["commits"][commit]]}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if body:
                        self.wfile.write(payload)
                    return
                if resolve:
                    repo = self._repo(resolve.group(1))
                    if repo is None:
                        return
                    commit = self._commit(repo, resolve.group(2))
                    if commit is None:
                        return
                    self._file(repo["commits"][commit], resolve.group(3), commit, body)
                    return
                if path in hub.files:
                    self._file({path: hub.files[path]}, path, "0" * 40, body)
                    return
                self._error(404, "NotFound")

            def _commit(self, repo: dict, revision: str):
                from urllib.parse import unquote

                revision = unquote(revision)
                commit = repo["refs"].get(revision, revision if revision in repo["commits"] else None)
                if commit is None:
                    self._error(404, "RevisionNotFound")
                return commit

            def _file(self, files: dict, name: str, commit: str, body: bool):
                path = files.get(name)
                if path is None:
                    self._error(404, "EntryNotFound", {"X-Repo-Commit": commit})
                    return
                size = path.stat().st_size
                start = 0
                ranged = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
                if ranged and body:
                    start = int(ranged.group(1))
                    hub.ranges.append((name, self.headers["Range"]))
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", commit)
                self.send_header("ETag", f'"{hub._etag(path)}"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(size - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
                self.end_headers()
                if not body:
                    return
                with open(path, "rb") as f:
                    f.seek(start)
                    data = f.read()
                cut = hub.cut.pop(name, None)
                if cut is not None and cut < len(data):
                    self.wfile.write(data[:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)  # the connection drops mid-file, as a flaky network does
                    return
                self.wfile.write(data)

        return Handler


def write_offline_cache(cache: Path, repo_id: str, folder: Path, revision: str = "main") -> str:
    """`folder` as repository `repo_id` in a Hugging Face cache at `cache`, in the library's own layout: blobs named
    by their etag, refs/REVISION holding the commit, snapshots/COMMIT/PATH linking to the blobs. Returns the commit."""
    commit = commit_of(repo_id, folder)
    storage = Path(cache) / f"models--{repo_id.replace('/', '--')}"
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    (storage / "refs" / revision).write_text(commit)
    for name, path in repo_files(folder).items():
        blob = storage / "blobs" / file_etag(path)
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.write_bytes(path.read_bytes())
        link = storage / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return commit


# -- running the CLI as a user does, against the stand-ins ----------------------------------------------------
REALTIME_ID, TTS15B_ID, ASR_ID = "microsoft/VibeVoice-Realtime-0.5B", "microsoft/VibeVoice-1.5B", "microsoft/VibeVoice-ASR"


def environment(tmp: Path, endpoint: str | None = None, offline: bool = False, home: Path | None = None,
                hf_cache: Path | None = None, base_install: bool = False) -> dict:
    """A user's environment with its own caches under `tmp`; `base_install`: torch and transformers cannot be
    imported (`pip install vibevoice-onnx` alone), so a first use writes its graphs."""
    from helpers import torch_blocked_environment

    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and k != "VIBEVOICE_ONNX_HOME"}
    if base_install:
        env["PYTHONPATH"] = torch_blocked_environment(tmp)["PYTHONPATH"]
    env.update(HF_HUB_CACHE=str(hf_cache or tmp / "hf"), VIBEVOICE_ONNX_HOME=str(home or tmp / "home"),
               HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_DISABLE_TELEMETRY="1", PYTHONUNBUFFERED="1")
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    else:
        env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens there: any request fails at once
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def cli(*args, env: dict, ok: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "vibevoice_onnx.cli", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if ok:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def audio(path: Path):
    """A WAV file's samples as the integers it holds."""
    import soundfile as sf

    return sf.read(str(path), dtype="int16")[0]


def repo_folder(checkpoint: Path, folder: Path, keep_tokenizer: bool = False) -> Path:
    """A checkpoint as its Hub repository holds it: no tokenizer (unless kept), a README and a file no build needs."""
    shutil.copytree(checkpoint, folder, ignore=shutil.ignore_patterns("voices", *([] if keep_tokenizer else ["tokenizer.json"])))
    (folder / "README.md").write_text("---\nlicense: mit\n---\n# a model card\n")
    (folder / "unused.bin").write_bytes(b"\0" * 4096)
    return folder


def tokenizer_folder(checkpoint: Path, folder: Path) -> Path:
    folder.mkdir(parents=True)
    shutil.copyfile(checkpoint / "tokenizer.json", folder / "tokenizer.json")
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return folder
