"""Writing results so that a failure leaves nothing behind (torch-free; every command uses this).

Each output is written under a hidden sibling name, `.NAME.partial-PID-RANDOM`, and renamed over its target
only when complete. A failure or a signal removes the partial; a process killed outright (SIGKILL, power
loss) leaves one, and the PID in its name lets a later run tell a dead writer's leftovers from a live one's.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from .errors import StorageFull, VibeVoiceError

_PARTIAL = re.compile(r"^\.(?P<name>.+)\.partial-(?P<pid>\d+)-[A-Za-z0-9_]+$")
FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})  # no room: a full disk, a quota, a file-size limit
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")
_SFE_SYSTEM = 2  # libsndfile's code for a failed system call (its errno is left in errno)


def os_error_message(error: OSError, action: str = "", path: Path | str | None = None) -> str:
    """One sentence for a file-system failure: the file (`path` where the error names none), what we were
    doing, and the system's reason."""
    where = error.filename if error.filename is not None else path if path is not None else "(unnamed file)"
    if error.filename2 is not None:
        where = f"{where} -> {error.filename2}"
    reason = (error.strerror or str(error) or type(error).__name__).rstrip(".").lower()
    return f"{where}: {action + ' failed: ' if action else ''}{reason}"


def writer_os_error(error: BaseException) -> OSError | None:
    """The OSError behind a failed write, or None: the error itself, or the one a writer in C or Rust reports in
    a type of its own (safetensors' SafetensorError names it in its text as "(os error N)"; libsndfile's
    "System error" leaves it in errno, which cffi keeps for the thread)."""
    if isinstance(error, OSError):
        return error
    kind = type(error).__name__
    number = None
    if kind == "SafetensorError":
        match = _RUST_OS_ERROR.search(str(error))
        number = int(match[1]) if match else None
    elif kind == "LibsndfileError" and getattr(error, "code", None) == _SFE_SYSTEM:
        import soundfile

        number = soundfile._ffi.errno or None
    return OSError(number, os.strerror(number)) if number else None


def os_error_or(error: BaseException, message: str) -> Exception:
    """What to raise for a writer's failure: the OSError behind it, which atomic_file and atomic_directory word
    with the output's name (StorageFull where there was no room), else VibeVoiceError(message)."""
    return writer_os_error(error) or VibeVoiceError(message)


def storage_full(error: BaseException) -> bool:
    """Whether `error` says the file system had no room (StorageFull, or an OSError behind it with ENOSPC,
    EDQUOT or EFBIG)."""
    if isinstance(error, StorageFull):
        return True
    cause = writer_os_error(error)
    return cause is not None and cause.errno in FULL


def file_error(error: OSError, action: str = "", path: Path | str | None = None) -> VibeVoiceError:
    """The one-sentence error for a failed file operation: StorageFull when the file system had no room."""
    kind = StorageFull if error.errno in FULL else VibeVoiceError
    return kind(os_error_message(error, action, path))


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def remove_stale_partials(folder: Path, log: Callable[[str], None] | None = None) -> list[Path]:
    """Delete the partial outputs in `folder` whose writing process no longer runs; return what went. One that
    will not go (a file held open on a network file system) stays for a later run, and stops nothing."""
    removed = []
    if not Path(folder).is_dir():
        return removed
    for entry in sorted(Path(folder).iterdir()):
        match = _PARTIAL.match(entry.name)
        if not match or _process_alive(int(match["pid"])):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)  # another run's cleanup may have been first
        if os.path.lexists(entry):
            continue
        removed.append(entry)
        if log:
            log(f"  removed {entry}, left by an earlier run that was killed (process {match['pid']})")
    return removed


def _partial_name(target: Path) -> str:
    return f".{target.name}.partial-{os.getpid()}-"


def check_output_file(target: Path) -> Path:
    """Refuse, before any work, an output path that can never be written as a file."""
    target = Path(target)
    if target.is_dir():
        raise VibeVoiceError(f"{target}: is a directory; give a file name for the output")
    if not target.resolve().parent.is_dir():
        raise VibeVoiceError(f"{target}: its directory does not exist")
    return target


@contextmanager
def atomic_file(target: Path, action: str = "writing") -> Iterator[Path]:
    """Yield a partial path beside `target`; it replaces `target` only if the block completes."""
    target = check_output_file(target)
    try:
        fd, name = tempfile.mkstemp(prefix=_partial_name(target), dir=target.resolve().parent)
    except OSError as e:
        raise file_error(e, action) from None
    os.close(fd)
    partial = Path(name)
    try:
        yield partial
        os.chmod(partial, 0o644)  # mkstemp makes files private; outputs are meant to be shared
        os.replace(partial, target)
    except Exception as e:
        cause = writer_os_error(e)
        if cause is None:
            raise
        if cause.filename in (None, str(partial)):  # name the file the user asked for, not our temporary one
            cause.filename, cause.filename2 = str(target), None
        raise file_error(cause, action) from None
    finally:
        partial.unlink(missing_ok=True)


def write_if_changed(target: Path, data: bytes, action: str = "writing") -> bool:
    """`data` into `target` (atomic_file) unless `target` holds exactly these bytes already, in which case it is
    left as it is, its time stamps too (a rerun of finished work touches nothing); whether it was written."""
    try:
        if target.stat().st_size == len(data) and target.read_bytes() == data:
            return False
    except OSError:  # not there yet, or unreadable: write it
        pass
    with atomic_file(target, action) as partial:
        partial.write_bytes(data)
    return True


def _make_parents(folder: Path) -> list[Path]:
    """mkdir -p that returns the directories it created, outermost first."""
    created = []
    for parent in reversed([folder, *folder.parents]):
        if not parent.exists():
            parent.mkdir()
            created.append(parent)
    return created


@contextmanager
def atomic_directory(target: Path, log: Callable[[str], None] | None = None,
                     keep: Callable[[Path, Path], None] | None = None, action: str = "writing") -> Iterator[Path]:
    """Yield a partial directory beside `target` that replaces it only if the block completes.

    Stale partials of killed runs beside `target` are removed first. On failure the partial goes, and so do
    the parent directories this call created, and a write that fails is one sentence (StorageFull where the
    file system had no room) naming the file as it would have been in `target`, after `action`. `keep(old,
    new)` may carry files over from the directory being replaced before the swap.
    """
    target = Path(target)
    try:
        created = _make_parents(target.parent)
    except OSError as e:
        raise file_error(e, "creating the output folder") from None
    try:
        remove_stale_partials(target.parent, log)
        partial = Path(tempfile.mkdtemp(prefix=_partial_name(target), dir=target.parent))
    except OSError as e:
        _remove_created(created)
        raise file_error(e, "creating the output folder") from None
    try:
        yield partial
        if keep is not None and target.is_dir():
            keep(target, partial)
        _share(partial)
        _swap_in(partial, target)
    except BaseException as e:
        shutil.rmtree(partial, ignore_errors=True)
        _remove_created(created)
        cause = writer_os_error(e) if isinstance(e, Exception) else None
        if cause is None:
            raise
        cause.filename = _as_in_target(cause.filename, partial, target)
        cause.filename2 = _as_in_target(cause.filename2, partial, target) if cause.filename2 else None
        raise file_error(cause, action) from None


def _as_in_target(name: str | None, partial: Path, target: Path) -> str:
    """A file of the partial directory named as it would be in the target (the partial is gone, and was ours)."""
    if name is None:
        return str(target)
    try:
        return str(target / Path(name).relative_to(partial))
    except ValueError:
        return str(name)


def _share(folder: Path) -> None:
    """mkdtemp makes the folder private and some writers (safetensors) make private files; outputs are shared."""
    os.chmod(folder, 0o755)
    for path in folder.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


def _remove_created(created: list[Path]) -> None:
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:
            break  # something else lives there now: leave it and its parents


def _swap_in(partial: Path, target: Path) -> None:
    """Rename the finished directory into place; if the second rename fails, put the previous one back."""
    if not target.exists():
        os.replace(partial, target)
        return
    old = Path(tempfile.mkdtemp(prefix=_partial_name(target), dir=target.parent))
    os.rmdir(old)
    os.replace(target, old)
    try:
        os.replace(partial, target)
    except BaseException:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def file_sha256(path: Path) -> str:
    """A file's sha256 (hex), read in blocks: what bundle manifests record and pinned downloads are checked by."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(16 * 2**20):
            digest.update(block)
    return digest.hexdigest()
