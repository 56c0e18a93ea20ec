"""A full disk (issue 36, item 6): `build`, `speak -o`, `voices import`, `transcribe -o`, a batch job and the
server's voice upload, each on a file system that fills up mid-write, fail with one sentence, leave no partial
file or bundle, and leave what was there before byte for byte as it was.

Two ways to fill up, each test run with both where it can:
- tmpfs: a small tmpfs mounted for the test, filled to leave `room` bytes (a real ENOSPC, from every writer
  at once). Mounting needs CAP_SYS_ADMIN: root here; skipped where it fails (CI containers, non-root users).
- rlimit: the command in a subprocess whose RLIMIT_FSIZE is `room` bytes. Python ignores SIGXFSZ, so a write
  past the limit fails with EFBIG in every writer, Python or C or Rust (onnx, safetensors, libsndfile), after
  the bytes below the limit went to the file, as on a disk that fills up mid-file. It always works, so it is
  what CI runs.
The batch job runs once, under rlimit set in its Ray worker only (a whole Ray cluster does not run under one).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import copy_bundle, write_voice_sample

REASONS = {"tmpfs": "no space left on device", "rlimit": "file too large"}
_LIMITED = ("import os, resource, sys; n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); "
            "os.execv(sys.argv[2], sys.argv[2:])")


@dataclass
class Disk:
    """The folder a test writes into (`root`) and how a command runs with only `room` bytes left to write."""

    method: str  # "tmpfs" or "rlimit"
    root: Path

    @property
    def reason(self) -> str:
        return REASONS[self.method]

    def run(self, args: list, room: int) -> subprocess.CompletedProcess:
        command = [sys.executable, *map(str, args)]
        if self.method == "rlimit":  # a wrapper that execs: no preexec_fn in a process that may have threads
            command = [sys.executable, "-S", "-c", _LIMITED, str(room), *command]
            return subprocess.run(command, capture_output=True, text=True, timeout=300)
        filler = self.fill(room)
        try:
            return subprocess.run(command, capture_output=True, text=True, timeout=300)
        finally:
            filler.unlink()

    def cli(self, *args, room: int) -> subprocess.CompletedProcess:
        return self.run(["-m", "vibevoice_onnx.cli", *args], room)

    def fill(self, room: int) -> Path:
        """A file taking all the tmpfs's free space but `room` bytes (rounded up to its pages)."""
        stat = os.statvfs(self.root)
        size = max(0, stat.f_bavail * stat.f_frsize - room) // stat.f_frsize * stat.f_frsize
        filler = self.root / ".filler"
        with open(filler, "wb") as f:
            for start in range(0, size, 2**20):
                f.write(b"\xff" * min(2**20, size - start))
        return filler


def mount_tmpfs(folder: Path, size: str) -> None:
    folder.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(folder)],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot mount a tmpfs here ({e})")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode})")


@pytest.fixture(params=["tmpfs", "rlimit"])
def disk(request, tmp_path):
    if request.param == "rlimit":
        root = tmp_path / "disk"
        root.mkdir()
        yield Disk("rlimit", root)
        return
    root = tmp_path / "tmpfs"
    mount_tmpfs(root, "48m")
    try:
        yield Disk("tmpfs", root)
    finally:
        if subprocess.run(["umount", str(root)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(root)], capture_output=True)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file and folder under `folder`, hidden ones included, with its contents' digest."""
    return {p.relative_to(folder).as_posix(): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))}


def the_error(done: subprocess.CompletedProcess) -> str:
    """The command's error: exit status 2, one "error:" line, the last, and never a traceback."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr, done.stderr
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == lines[-1:], done.stderr
    return errors[0]


# ---- speak -o, transcribe -o, voices import, build: the command line ----

def test_speak_o_on_a_full_disk_keeps_the_previous_wav(disk, tiny_bundle):
    out = disk.root / "speech.wav"
    out.write_bytes(b"RIFF, the previous take" * 1000)
    before = snapshot(disk.root)
    done = disk.cli("speak", tiny_bundle, "Hello there, how are you?", "--voice", "synthetic", "--seed", "1",
                    "--max-frames", "12", "-o", out, room=20_000)  # 12 frames: 77 kB
    assert the_error(done) == f"error: {out}: writing the WAV file failed: {disk.reason}"
    assert snapshot(disk.root) == before


def test_transcribe_o_on_a_full_disk_keeps_the_previous_transcript(disk, tiny_asr_bundle, tmp_path):
    audio = write_voice_sample(tmp_path / "talk.wav", seconds=1.0, rate=24000, channels=1)
    out = disk.root / "talk.json"
    out.write_text('{"text": "the previous transcript"}\n')
    before = snapshot(disk.root)
    done = disk.cli("transcribe", tiny_asr_bundle, audio, "--seed", "1", "--max-new-tokens", "64", "-o", out,
                    room=0 if disk.method == "tmpfs" else 64)  # 161 bytes
    assert the_error(done) == f"error: {out}: writing the json transcript failed: {disk.reason}"
    assert snapshot(disk.root) == before


def test_voices_import_on_a_full_disk_keeps_the_voice_and_manifest_it_would_replace(disk, tiny_bundle, tiny_preset):
    bundle = copy_bundle(tiny_bundle, disk.root / "bundle")
    voice = bundle / "voices" / "synthetic.safetensors"
    before = snapshot(disk.root)
    if disk.method == "tmpfs":  # room for the new voice (its pages) but not for the manifest recording it
        page = os.statvfs(disk.root).f_frsize
        room, expected = -(-voice.stat().st_size // page) * page, f"{bundle / 'manifest.json'}: recording the voice in"
        expected += " the manifest"
    else:  # the voice itself stops mid-file
        room, expected = voice.stat().st_size // 2, f"{voice}: writing the voice"
    done = disk.cli("voices", "import", bundle, tiny_preset, "--name", "synthetic", "--force", room=room)
    assert the_error(done) == f"error: {expected} failed: {disk.reason}"
    assert snapshot(disk.root) == before


def test_a_rebuild_on_a_full_disk_leaves_the_previous_bundle_as_it_was(disk, tiny_checkpoints, tiny_bundle):
    """Fails in the first graph (lower_lm, 0.5 MB), so it costs an export's start (8 s), not a whole build."""
    previous = copy_bundle(tiny_bundle, disk.root / "onnx" / "realtime" / "cpu_fp32")
    before = snapshot(disk.root)
    done = disk.cli("build", tiny_checkpoints["realtime"], "-o", disk.root / "onnx", room=100_000)
    assert re.fullmatch(rf"error: {re.escape(str(previous))}(/\w+\.\w+)?: writing the bundle failed: {disk.reason}",
                        the_error(done)), done.stderr
    assert snapshot(disk.root) == before


# ---- the server's voice upload ----

UPLOAD = """
import json, sys
from pathlib import Path
from fastapi.testclient import TestClient
from vibevoice_onnx.serve import Models, Settings, create_app

with TestClient(create_app(Models.open([Path(sys.argv[1])]), Settings())) as client:
    response = client.post("/v1/audio/voices", data={"name": "bob"},
                           files={"audio_sample": ("bob.flac", Path(sys.argv[2]).read_bytes(), "audio/flac")})
    voices = client.get("/v1/audio/voices").json()["voices"]
print(json.dumps({"status": response.status_code, "body": response.json(), "voices": [v["id"] for v in voices]}))
"""


def test_the_servers_voice_upload_on_a_full_disk_is_one_sentence_and_stores_nothing(disk, tiny_15b_bundle, tmp_path):
    """On the tmpfs only the bundle's disk is full (the server's temporary copy of the sample goes to /tmp); under
    rlimit that copy is what fails first, as where the temporary folder shares the full disk."""
    pytest.importorskip("fastapi")
    bundle = copy_bundle(tiny_15b_bundle, disk.root / "bundle")
    sample = write_voice_sample(tmp_path / "bob.flac", seconds=2.0, rate=16000, channels=1)
    before = snapshot(disk.root)
    done = disk.run(["-c", UPLOAD, bundle, sample], room=60_000)  # a 2 s voice: 192 kB at 24 kHz in float32
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["voices"] == ["alice"]
    assert snapshot(disk.root) == before
    message = answer["body"]["error"]["message"]
    assert "\n" not in message and "Traceback" not in done.stderr, answer
    assert answer["status"] == 507 and answer["body"]["error"]["code"] == "insufficient_storage", answer
    assert message.endswith(disk.reason) and str(disk.root) not in message, message


# ---- a batch job ----

def filling_up_worker(room: int):
    """SynthesisWorker making each item with RLIMIT_FSIZE at `room` bytes, in its own (Ray worker) process only;
    a class of this function's own, so Ray gets it pickled by value."""
    from vibevoice_onnx.cluster.workers import SynthesisWorker

    class Worker(SynthesisWorker):
        def make(self, item, start):
            import resource

            soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (room, hard))
            try:
                return super().make(item, start)
            finally:
                resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))

    return Worker


def test_a_batch_job_on_a_full_disk_stops_with_one_sentence_and_keeps_what_was_made(tiny_bundle, tmp_path, monkeypatch,
                                                                                     capsys):
    """The job's first item to find no room stops it (every item after would fail the same way; none is the
    item's fault): that item leaves nothing, not even its row, so the next run makes it; the items made before,
    by this run or an earlier one, and the earlier run's manifest stay as they were."""
    pytest.importorskip("ray")
    from vibevoice_onnx.cli import main
    from vibevoice_onnx.cluster import jobs
    from vibevoice_onnx.cluster.items import JobFolder
    from vibevoice_onnx.cluster.workers import SynthesisWorker

    out = tmp_path / "out"
    earlier = {"id": "earlier", "text": "Made by an earlier run.", "seed": 1, "max_frames": 3}
    folder = JobFolder(out, "synthesize")
    folder.prepare()
    assert SynthesisWorker(str(tiny_bundle), str(out)).run(earlier).status == "ok"  # an earlier run's item
    folder.write_manifest(["earlier"])  # and its manifest
    before = snapshot(out)
    items = [earlier, {"id": "small", "text": "Short.", "seed": 2, "max_frames": 3},  # 19 kB
             {"id": "large", "text": "A longer one.", "seed": 3, "max_frames": 12},  # 77 kB: no room
             {"id": "after", "text": "Also short.", "seed": 4, "max_frames": 3}]
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
    monkeypatch.setitem(jobs.WORKERS, "synthesize", filling_up_worker(40_000))
    capsys.readouterr()
    assert main(["batch", "synthesize", str(tiny_bundle), str(tmp_path / "items.jsonl"), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    error = err.strip().splitlines()[-1]
    large = out.resolve() / "audio" / "large.wav"
    match = re.fullmatch(rf"error: {re.escape(str(large))}: writing the WAV file failed: file too large; the job "
                         r"stopped with (\d) of 4 items complete \(run it again once there is room, and it makes the "
                         r"rest\)", error)
    assert match, err
    after = snapshot(out)
    assert {name: digest for name, digest in after.items() if name in before} == before
    made = {name for name in after if name not in before}  # Ray keeps no order: "small" and "after" may come first
    assert made <= {"audio/small.wav", "rows/small.json", "audio/after.wav", "rows/after.json"}, made
    assert {name.split("/")[1].split(".")[0] for name in made} == folder.complete() - {"earlier"}  # output and row
    assert int(match[1]) == len(folder.complete())
