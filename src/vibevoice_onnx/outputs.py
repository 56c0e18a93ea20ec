"""Writing results so that a failure leaves nothing behind (torch-free; every command uses this).

Each output is written under a hidden sibling name, `.NAME.partial-PID-RANDOM`, and renamed over its target
only when complete. A failure or a signal removes the partial; a process killed outright (SIGKILL, power
loss) leaves one, and the PID in its name lets a later run tell a dead writer's leftovers from a live one's.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from .errors import VibeVoiceError

_PARTIAL = re.compile(r"^\.(?P<name>.+)\.partial-(?P<pid>\d+)-[A-Za-z0-9_]+$")


def os_error_message(error: OSError, action: str = "") -> str:
    """One sentence for a file-system failure: the file, what we were doing, and the system's reason."""
    where = error.filename if error.filename is not None else "(unnamed file)"
    if error.filename2 is not None:
        where = f"{where} -> {error.filename2}"
    reason = (error.strerror or str(error) or type(error).__name__).rstrip(".").lower()
    return f"{where}: {action + ' failed: ' if action else ''}{reason}"


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
    """Delete the partial outputs in `folder` whose writing process no longer runs; return what went."""
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
            entry.unlink(missing_ok=True)
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
        raise VibeVoiceError(os_error_message(e, action)) from None
    os.close(fd)
    partial = Path(name)
    try:
        yield partial
        os.chmod(partial, 0o644)  # mkstemp makes files private; outputs are meant to be shared
        os.replace(partial, target)
    except OSError as e:
        if e.filename in (None, str(partial)):  # name the file the user asked for, not our temporary one
            e.filename, e.filename2 = str(target), None
        raise VibeVoiceError(os_error_message(e, action)) from None
    finally:
        partial.unlink(missing_ok=True)


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
                     keep: Callable[[Path, Path], None] | None = None) -> Iterator[Path]:
    """Yield a partial directory beside `target` that replaces it only if the block completes.

    Stale partials of killed runs beside `target` are removed first. On failure the partial goes, and so do
    the parent directories this call created. `keep(old, new)` may carry files over from the directory
    being replaced before the swap.
    """
    target = Path(target)
    try:
        created = _make_parents(target.parent)
    except OSError as e:
        raise VibeVoiceError(os_error_message(e, "creating the output folder")) from None
    try:
        remove_stale_partials(target.parent, log)
        partial = Path(tempfile.mkdtemp(prefix=_partial_name(target), dir=target.parent))
    except OSError as e:
        _remove_created(created)
        raise VibeVoiceError(os_error_message(e, "creating the output folder")) from None
    try:
        yield partial
        if keep is not None and target.is_dir():
            keep(target, partial)
        _share(partial)
        _swap_in(partial, target)
    except BaseException as e:
        shutil.rmtree(partial, ignore_errors=True)
        _remove_created(created)
        if isinstance(e, OSError):
            raise VibeVoiceError(os_error_message(e, f"writing {target}")) from None
        raise


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
