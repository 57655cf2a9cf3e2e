"""The worker's warm-shutdown flag is lock-free: a pool child killed at any moment while
it reads the flag cannot block the main process setting it (with a
``multiprocessing.Event`` a child killed inside ``is_set()`` left the Event's lock held,
and the next ``set()``, the start of every warm shutdown, waited forever)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from jobs._worker.installed import installed_on
from jobs._worker.shared_flag import SharedFlag
from jobs.celery_app import app

# The children only read or write one byte of shared memory and exit: a fork from a process
# that other tests left with threads is safe here.
pytestmark = pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")


def _fork_reader(flag: object) -> int:
    """A child that does nothing but read the flag, as pool children do before each step."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            while True:
                flag.is_set()  # type: ignore[attr-defined]
        finally:
            os._exit(0)
    return pid


def _set_then(flag: object, done: threading.Event) -> None:
    flag.set()  # type: ignore[attr-defined]
    done.set()


def test_a_reader_killed_at_any_moment_never_blocks_the_shutdown_flag() -> None:
    installed = installed_on(app)
    assert installed is not None
    flag = installed.shutting_down  # the worker's own flag, made at install as in a worker
    for attempt in range(30):
        reader = _fork_reader(flag)
        time.sleep(0.01)  # let it read a while
        os.kill(reader, signal.SIGKILL)  # wherever it is in is_set()
        os.waitpid(reader, 0)
        was_set = threading.Event()
        threading.Thread(target=_set_then, args=(flag, was_set), daemon=True).start()
        assert was_set.wait(5), f"set() blocked by a reader killed mid-read (try {attempt})"
        assert flag.is_set()
        flag.clear()  # (a blocked flag is left as it is: clearing would block too)


def test_the_flag_is_shared_both_ways_across_fork() -> None:
    flag = SharedFlag()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        deadline = time.monotonic() + 10
        while not flag.is_set() and time.monotonic() < deadline:
            time.sleep(0.005)
        os._exit(0 if flag.is_set() else 1)
    assert not flag.is_set()
    flag.set()
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0  # the child saw the parent's set()

    flag.clear()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        flag.set()
        os._exit(0)
    os.waitpid(child, 0)
    assert flag.is_set()  # and the parent sees a child's
