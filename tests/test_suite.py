"""The suite's own settings (pyproject.toml's pytest section), held to what they promise: a test that hangs, even
inside native code, fails with its stack within the time limit, and a worker that dies ends the run red instead
of holding it. Each runs pytest, with xdist and pytest-timeout as the suite has them, on a folder of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# A deadlock in native code with the GIL released, as a Ray or gRPC shutdown waiting on its threads would be:
# a futex wait the kernel resumes after each signal, so no Python signal handler ever runs in that thread.
NATIVE_HANG = '''
import ctypes


def test_waits_on_a_mutex_it_holds():
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER, a default (non-recursive) mutex
    libc = ctypes.CDLL(None)
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)
'''
DIES = '''
import os


def test_the_worker_dies():
    os._exit(1)


def test_after_it():
    pass
'''
ORDINARY = '''
def test_one():
    pass


def test_two():
    pass
'''


def run_suite(folder: Path, files: dict[str, str], *options: str) -> subprocess.CompletedProcess:
    """pytest with the suite's settings (-c pyproject.toml: two workers, whole files each, the time limit) over
    `files` written into `folder`. Its own limit only catches the hang these settings exist to prevent."""
    for name, text in files.items():
        (folder / name).write_text(text)
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"), "--rootdir", str(folder),
                            "-p", "no:cacheprovider", *options, *map(str, sorted(folder.glob("test_*.py")))],
                           cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = run.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)  # its workers too: a hung one would outlive the test
        raise AssertionError(f"the run hung: {run.communicate()}") from None
    return subprocess.CompletedProcess(run.args, run.returncode, out, err)


def test_a_worker_that_dies_fails_the_run_and_names_the_test_instead_of_hanging_it(tmp_path):
    """pytest-xdist 3.8 with whole files per worker deadlocks when it replaces a dead worker (a Ray job that took
    its worker down once held CI at 94% until it was killed): the suite replaces none, so the run ends, red."""
    done = run_suite(tmp_path, {"test_a.py": ORDINARY, "test_b.py": DIES, "test_c.py": ORDINARY, "test_d.py": ORDINARY})
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "worker 'gw" in output and "crashed while running 'test_b.py::test_the_worker_dies'" in output, output


def test_a_test_hung_in_native_code_fails_with_its_stack_within_the_limit(tmp_path):
    """pytest-timeout raises in the test's thread, which never happens while that thread waits in native code;
    faulthandler's watchdog (a thread of its own that needs no interpreter) then prints every thread's stack and
    ends the worker. The limits here are the suite's two, shortened and in the same order."""
    done = run_suite(tmp_path, {"test_hang.py": NATIVE_HANG, "test_other.py": ORDINARY}, "-o", "timeout=3",
                     "-o", "faulthandler_timeout=6")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Timeout (0:00:06)!" in output, output  # faulthandler's
    stack = output[output.index("Timeout (0:00:06)!"):]
    assert 'test_hang.py", line 9 in test_waits_on_a_mutex_it_holds' in stack, output  # the line it hung on
    assert "crashed while running 'test_hang.py::test_waits_on_a_mutex_it_holds'" in output, output
