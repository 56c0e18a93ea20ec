"""outputs.py, the one way every command writes: a failure leaves nothing behind and the previous output as it was,
a killed run's leftovers are told from a live one's, a rerun touches nothing unchanged, and every failed write is
one sentence naming the file the user asked for (StorageFull where there was no room). Tiny files, no model."""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from vibevoice_onnx import outputs
from helpers import dead_pid
from vibevoice_onnx.errors import StorageFull, VibeVoiceError
from vibevoice_onnx.outputs import (atomic_directory, atomic_file, check_output_file, file_error, file_sha256,
                                    os_error_message, os_error_or, remove_stale_partials, storage_full,
                                    write_if_changed, writer_os_error)


class SafetensorError(Exception):
    """Named as safetensors' Rust error is: its OS error only in its text."""


def failing(number: int, path):
    """A stand-in for tempfile's mkstemp or mkdtemp on a file system that refuses with `number`."""
    def refused(*args, **kwargs):
        raise OSError(number, os.strerror(number), str(path))

    return refused


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_write_if_changed_leaves_the_same_bytes_and_writes_any_change_of_the_same_size(tmp_path):
    target = tmp_path / "manifest.jsonl"
    assert write_if_changed(target, b'{"id": "a", "status": "ok"}\n')
    before = target.stat()
    assert not write_if_changed(target, b'{"id": "a", "status": "ok"}\n')
    after = target.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not even rewritten in place
    assert write_if_changed(target, b'{"id": "b", "status": "ok"}\n')  # one byte changed, the same size
    assert target.read_bytes() == b'{"id": "b", "status": "ok"}\n'
    assert write_if_changed(target, b'{"id": "b"}\n') and target.read_bytes() == b'{"id": "b"}\n'
    assert listing(tmp_path) == ["manifest.jsonl"]


def test_a_file_error_is_one_sentence_naming_the_file_the_action_and_the_reason():
    full = OSError(errno.ENOSPC, "No space left on device.", "/out/a.wav")
    assert os_error_message(full, "writing the WAV file") == "/out/a.wav: writing the WAV file failed: no space left on device"
    assert os_error_message(full) == "/out/a.wav: no space left on device"
    renamed = OSError(errno.EXDEV, "Invalid cross-device link", "/a", None, "/b")
    assert os_error_message(renamed, "moving") == "/a -> /b: moving failed: invalid cross-device link"
    unnamed = OSError(errno.EACCES, "Permission denied")
    assert os_error_message(unnamed, "", "/given") == "/given: permission denied"  # the path where it names none
    assert os_error_message(unnamed) == "(unnamed file): permission denied"
    assert os_error_message(OSError("Odd Failure")) == "(unnamed file): odd failure"  # no strerror: its text
    assert os_error_message(OSError()) == "(unnamed file): oserror"


@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_no_room_is_storage_full_and_any_other_failure_is_not(number):
    error = file_error(OSError(number, os.strerror(number), "/out/x"), "writing")
    assert type(error) is StorageFull and str(error) == f"/out/x: writing failed: {os.strerror(number).lower()}"
    assert storage_full(OSError(number, "full")) and storage_full(error)
    assert storage_full(SafetensorError(f"Error while serializing: IoError(Os {{ code: {number} }}) (os error {number})"))
    denied = file_error(OSError(errno.EACCES, "Permission denied", "/out/x"), "writing")
    assert type(denied) is VibeVoiceError and str(denied) == "/out/x: writing failed: permission denied"
    assert not storage_full(OSError(errno.EACCES, "Permission denied")) and not storage_full(ValueError("no"))
    assert not storage_full(SafetensorError("header too large"))


def test_the_os_error_behind_a_writer_of_its_own_is_found_or_none():
    error = OSError(errno.EIO, "I/O error")
    assert writer_os_error(error) is error
    found = writer_os_error(SafetensorError("failed (os error 28)"))
    assert (found.errno, found.strerror) == (28, os.strerror(28))
    assert writer_os_error(SafetensorError("no number here")) is None
    assert writer_os_error(SafetensorError("(os error 0)")) is None  # no error at all
    assert writer_os_error(ValueError("(os error 28)")) is None  # only the writers that word it so
    assert os_error_or(error, "unused") is error
    fallback = os_error_or(ValueError("x"), "the WAV file could not be written")
    assert type(fallback) is VibeVoiceError and str(fallback) == "the WAV file could not be written"


def test_libsndfiles_system_error_is_read_from_errno():
    import soundfile

    soundfile._ffi.errno = errno.ENOSPC
    found = writer_os_error(soundfile.LibsndfileError(2, "Error writing: "))  # SFE_SYSTEM
    assert found is not None and found.errno == errno.ENOSPC and storage_full(soundfile.LibsndfileError(2))
    assert writer_os_error(soundfile.LibsndfileError(3)) is None  # a format error, errno not its reason
    soundfile._ffi.errno = 0
    assert writer_os_error(soundfile.LibsndfileError(2)) is None


def test_an_output_that_can_never_be_a_file_is_refused_before_any_work(tmp_path):
    with pytest.raises(VibeVoiceError, match=r"is a directory; give a file name for the output$"):
        check_output_file(tmp_path)
    with pytest.raises(VibeVoiceError, match=r"/missing/x.wav: its directory does not exist$"):
        check_output_file(tmp_path / "missing" / "x.wav")
    assert check_output_file(str(tmp_path / "x.wav")) == tmp_path / "x.wav"


def test_a_file_appears_whole_and_shared_or_not_at_all(tmp_path):
    target = tmp_path / "speech.wav"
    target.write_bytes(b"before")
    with atomic_file(target) as partial:
        assert partial.parent == tmp_path and outputs._PARTIAL.match(partial.name)["name"] == "speech.wav"
        assert int(outputs._PARTIAL.match(partial.name)["pid"]) == os.getpid()
        partial.write_bytes(b"after")
        assert target.read_bytes() == b"before"  # nothing changes until the block completes
    assert target.read_bytes() == b"after" and target.stat().st_mode & 0o777 == 0o644
    assert listing(tmp_path) == ["speech.wav"]
    with pytest.raises(KeyError):  # any other failure goes on as it was
        with atomic_file(target) as partial:
            partial.write_bytes(b"half")
            raise KeyError("stop")
    assert target.read_bytes() == b"after" and listing(tmp_path) == ["speech.wav"]


def test_a_failed_write_names_the_file_asked_for_not_the_partial(tmp_path):
    target = tmp_path / "speech.wav"
    with pytest.raises(StorageFull) as raised:
        with atomic_file(target, "writing the WAV file") as partial:
            raise OSError(errno.ENOSPC, "No space left on device", str(partial))
    assert str(raised.value) == f"{target}: writing the WAV file failed: no space left on device"
    with pytest.raises(VibeVoiceError) as raised:
        with atomic_file(target) as partial:
            raise OSError(errno.EACCES, "Permission denied", "/elsewhere/file", None, "/also")
    assert str(raised.value) == "/elsewhere/file -> /also: writing failed: permission denied"  # another file: its name
    with pytest.raises(StorageFull, match=rf"^{target}: writing failed"):
        with atomic_file(target):
            raise SafetensorError("(os error 28)")
    assert listing(tmp_path) == []


def test_a_partial_file_that_cannot_even_be_made_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setattr(outputs.tempfile, "mkstemp", failing(errno.EROFS, tmp_path))
    with pytest.raises(VibeVoiceError, match=rf"^{tmp_path}: saving failed: read-only file system$"):
        with atomic_file(tmp_path / "x.wav", "saving"):
            pass


def test_only_a_dead_writers_partials_are_removed(tmp_path):
    dead, alive = dead_pid(), os.getpid()
    stale_file = tmp_path / f".a.wav.partial-{dead}-x1"
    stale_dir = tmp_path / f".bundle.partial-{dead}-x2"
    live = tmp_path / f".b.wav.partial-{alive}-x3"
    unrelated = tmp_path / f"c.partial-{dead}-x4"  # not hidden: not ours
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep")
    stale_link = tmp_path / f".d.partial-{dead}-x5"
    stale_link.symlink_to(elsewhere)  # the link goes, never what it points to
    stale_file.write_text("half")
    (stale_dir / "sub").mkdir(parents=True)
    (stale_dir / "sub" / "graph.onnx").write_text("half")
    live.write_text("being written")
    unrelated.write_text("mine")
    said = []
    removed = remove_stale_partials(tmp_path, said.append)
    assert removed == sorted([stale_file, stale_dir, stale_link])
    assert listing(tmp_path) == sorted([live.name, unrelated.name, "elsewhere"])
    assert (elsewhere / "keep.txt").read_text() == "keep"
    assert said == [f"  removed {p}, left by an earlier run that was killed (process {dead})" for p in removed]
    assert remove_stale_partials(tmp_path) == []
    assert remove_stale_partials(tmp_path / "no-such-folder") == []
    assert remove_stale_partials(live) == []  # a file: nothing to look in


def test_a_directory_appears_whole_and_shared_and_replaces_the_old_one(tmp_path):
    target = tmp_path / "a" / "b" / "bundle"
    with atomic_directory(target) as partial:
        assert partial.parent == target.parent and outputs._PARTIAL.match(partial.name)["name"] == "bundle"
        (partial / "graphs").mkdir()
        (partial / "graphs" / "lm.onnx").write_bytes(b"lm")
        os.chmod(partial / "graphs" / "lm.onnx", 0o600)  # a writer that makes private files (safetensors)
        assert not target.exists()
    assert (target / "graphs" / "lm.onnx").read_bytes() == b"lm"
    assert {p.name: p.stat().st_mode & 0o777 for p in [target, *target.rglob("*")]} == \
        {"bundle": 0o755, "graphs": 0o755, "lm.onnx": 0o644}
    carried = []
    with atomic_directory(target, keep=lambda old, new: carried.append((old, new)) or
                          (new / "voice.bin").write_bytes((old / "graphs" / "lm.onnx").read_bytes())) as partial:
        (partial / "manifest.json").write_text("{}")
    assert carried and carried[0][0] == target and not carried[0][1].exists()  # the partial, swapped in since
    assert listing(target) == ["manifest.json", "voice.bin"] and (target / "voice.bin").read_bytes() == b"lm"
    assert listing(target.parent) == ["bundle"]  # neither the partial nor the old one left beside it


def test_keep_is_not_asked_without_a_previous_directory(tmp_path):
    asked = []
    with atomic_directory(tmp_path / "new", keep=lambda old, new: asked.append(old)) as partial:
        (partial / "x").write_text("x")
    assert asked == [] and listing(tmp_path / "new") == ["x"]


def test_a_failed_directory_leaves_the_old_one_and_no_folder_it_made(tmp_path):
    (tmp_path / "keep").mkdir()
    target = tmp_path / "keep" / "new" / "deeper" / "bundle"
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as partial:
            (partial / "half").write_text("half")
            raise RuntimeError("stop")
    assert listing(tmp_path) == ["keep"] and listing(tmp_path / "keep") == []  # the folders it made are gone too
    old = tmp_path / "old"
    old.mkdir()
    (old / "graph.onnx").write_text("old")
    with pytest.raises(KeyboardInterrupt):  # a signal, as Ctrl-C or SIGTERM raises it
        with atomic_directory(old) as partial:
            (partial / "graph.onnx").write_text("new")
            raise KeyboardInterrupt
    assert listing(old) == ["graph.onnx"] and (old / "graph.onnx").read_text() == "old"
    assert listing(tmp_path) == ["keep", "old"]


def test_a_folder_someone_else_filled_meanwhile_is_left_with_its_parents(tmp_path):
    target = tmp_path / "made" / "bundle"
    with pytest.raises(RuntimeError):
        with atomic_directory(target):
            (tmp_path / "made" / "theirs.txt").write_text("someone else's")
            raise RuntimeError("stop")
    assert listing(tmp_path / "made") == ["theirs.txt"]


def test_a_failed_directory_write_names_the_file_as_it_would_be_in_the_target(tmp_path):
    target = tmp_path / "bundle"
    with pytest.raises(StorageFull) as raised:
        with atomic_directory(target, action="writing the graphs") as partial:
            raise OSError(errno.ENOSPC, "No space left on device", str(partial / "graphs" / "lm.onnx"),
                          None, str(partial / "lm.onnx.data"))
    assert str(raised.value) == (f"{target / 'graphs' / 'lm.onnx'} -> {target / 'lm.onnx.data'}: writing the graphs "
                                 "failed: no space left on device")
    with pytest.raises(VibeVoiceError) as raised:
        with atomic_directory(target):
            raise OSError(errno.EACCES, "Permission denied")  # names no file: the target
    assert str(raised.value) == f"{target}: writing failed: permission denied"
    with pytest.raises(VibeVoiceError) as raised:
        with atomic_directory(target):
            raise OSError(errno.EACCES, "Permission denied", "/etc/elsewhere")  # not ours: as it is
    assert str(raised.value) == "/etc/elsewhere: writing failed: permission denied"
    assert listing(tmp_path) == []


def test_an_output_folder_that_cannot_be_made_is_one_sentence(tmp_path):
    (tmp_path / "file").write_text("a file, not a folder")
    with pytest.raises(VibeVoiceError, match=r"creating the output folder failed: "):
        with atomic_directory(tmp_path / "file" / "sub" / "bundle"):
            pass
    assert listing(tmp_path) == ["file"]


def test_a_partial_folder_that_cannot_be_made_removes_the_folders_made_for_it(tmp_path, monkeypatch):
    monkeypatch.setattr(outputs.tempfile, "mkdtemp", failing(errno.ENOSPC, tmp_path / "new"))
    with pytest.raises(StorageFull, match=r"/new: creating the output folder failed: no space left on device$"):
        with atomic_directory(tmp_path / "new" / "bundle"):
            pass
    assert listing(tmp_path) == []


def test_a_swap_that_fails_halfway_puts_the_previous_directory_back(tmp_path, monkeypatch):
    target = tmp_path / "bundle"
    target.mkdir()
    (target / "graph.onnx").write_text("old")
    replace, calls = os.replace, []

    def second_fails(src, dst):
        calls.append((Path(src).name, Path(dst).name))
        if len(calls) == 2:  # the old one is moved aside; the new one's rename fails
            raise OSError(errno.EIO, "Input/output error", str(src))
        replace(src, dst)

    monkeypatch.setattr(outputs.os, "replace", second_fails)
    with pytest.raises(VibeVoiceError, match="failed: input/output error"):
        with atomic_directory(target) as partial:
            (partial / "graph.onnx").write_text("new")
    assert (target / "graph.onnx").read_text() == "old" and listing(tmp_path) == ["bundle"]
    assert len(calls) == 3 and calls[2][1] == "bundle"  # put back


def test_a_files_sha256_is_read_in_blocks_and_whole(tmp_path):
    path = tmp_path / "weights.bin"
    data = os.urandom(1000) * (16 * 2**20 // 1000 + 7)  # past one 16 MiB block
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert file_sha256(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()


def test_a_file_error_names_the_path_given_where_the_error_names_none():
    error = file_error(OSError(errno.ENOSPC, "No space left on device"), "writing", "/out/item-07.wav")
    assert type(error) is StorageFull and str(error) == "/out/item-07.wav: writing failed: no space left on device"
    assert str(file_error(OSError(errno.EACCES, "Permission denied", "/x"))) == "/x: permission denied"  # no action


def test_a_live_writers_partial_is_kept_and_the_writer_left_alone(tmp_path):
    """Whether a writer lives is asked with signal 0, which delivers nothing: the writer here waits for a signal
    and says which came first (the one the test sends after the cleanup, or one the cleanup sent)."""
    writer = subprocess.Popen([sys.executable, "-c", (
        "import signal\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.Signals) - {signal.SIGKILL, signal.SIGSTOP})\n"
        "print('ready', flush=True)\n"
        "print(signal.sigwait(set(signal.Signals) - {signal.SIGKILL, signal.SIGSTOP}).name, flush=True)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "ready\n"
        partial = tmp_path / f".speech.wav.partial-{writer.pid}-abc"
        partial.write_text("being written")
        assert remove_stale_partials(tmp_path) == [] and partial.exists()
        writer.send_signal(signal.SIGUSR1)
        assert writer.stdout.readline() == "SIGUSR1\n"  # the first signal it got was ours
    finally:
        writer.kill()
        writer.wait()


def test_another_users_live_writer_is_live(tmp_path, monkeypatch):
    """Signal 0 to another user's process is refused (EPERM): the process exists, so its partial stays."""
    def not_ours(pid, signal_number):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(outputs.os, "kill", not_ours)
    partial = tmp_path / f".speech.wav.partial-{dead_pid()}-abc"
    partial.write_text("theirs")
    assert remove_stale_partials(tmp_path) == [] and partial.exists()


def refusing_rmtree(path, ignore_errors=False, **options):
    """shutil.rmtree on a file system that will not let a folder go (a file held open on NFS, say)."""
    if not ignore_errors:
        raise OSError(errno.EBUSY, "Device or resource busy", str(path))


def test_leftovers_that_will_not_go_never_fail_the_write_or_the_cleanup(tmp_path, monkeypatch):
    """The replaced copy of a directory that cannot be removed stays as a partial (a later run's cleanup tries
    again) and the new one is in place; a stale partial that cannot be removed does not stop a run, nor does one
    another run removed first."""
    monkeypatch.setattr(outputs.shutil, "rmtree", refusing_rmtree)
    target = tmp_path / "bundle"
    target.mkdir()
    with atomic_directory(target) as partial:
        (partial / "graph.onnx").write_text("new")
    assert (target / "graph.onnx").read_text() == "new"
    left = [p.name for p in tmp_path.iterdir() if p != target]
    assert len(left) == 1 and outputs._PARTIAL.match(left[0])["name"] == "bundle"  # recognisable as ours
    dead = dead_pid()
    stale = tmp_path / "other"
    stale.mkdir()
    (stale / f".x.partial-{dead}-a").mkdir()
    assert remove_stale_partials(stale) == [] and listing(stale) == [f".x.partial-{dead}-a"]  # not said to be gone
    (stale / f".y.partial-{dead}-b").write_text("half")
    alive = outputs._process_alive

    def removed_meanwhile(pid):  # another run's cleanup got there first
        for path in stale.glob(".y.partial-*"):
            path.unlink()
        return alive(pid)

    monkeypatch.setattr(outputs, "_process_alive", removed_meanwhile)
    assert remove_stale_partials(stale) == [stale / f".y.partial-{dead}-b"]


def test_the_previous_directory_is_moved_aside_beside_it_under_a_partial_name(tmp_path, monkeypatch):
    """So that a run killed mid-swap leaves a folder the next run recognises and removes, on the same file
    system (a rename, never a copy)."""
    target = tmp_path / "bundle"
    target.mkdir()
    moves, replace = [], os.replace
    monkeypatch.setattr(outputs.os, "replace", lambda src, dst: moves.append(Path(dst)) or replace(src, dst))
    with atomic_directory(target) as partial:
        (partial / "x").write_text("x")
    aside = moves[0]
    assert aside.parent == tmp_path and outputs._PARTIAL.match(aside.name)["name"] == "bundle"
    assert int(outputs._PARTIAL.match(aside.name)["pid"]) == os.getpid() and moves[1] == target


def test_a_write_that_was_not_changed_says_what_it_was_writing_when_it_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(outputs.tempfile, "mkstemp", failing(errno.ENOSPC, tmp_path))
    with pytest.raises(StorageFull, match=r"writing the manifest failed: no space left on device$"):
        write_if_changed(tmp_path / "manifest.jsonl", b"{}\n", "writing the manifest")
    with pytest.raises(StorageFull, match=rf"^{tmp_path}: writing failed: no space left on device$"):
        write_if_changed(tmp_path / "manifest.jsonl", b"{}\n")
