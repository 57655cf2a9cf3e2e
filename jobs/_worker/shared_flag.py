"""A flag shared by a process and the children it forks, without a lock.

A warm shutdown sets it in the worker's main process; the prefork pool children read it
before each step. ``multiprocessing.Event`` guards its flag with a lock shared by every
process: a child killed (SIGKILL, the OOM killer) or frozen (SIGSTOP) while holding it
leaves the lock held, and the main process's ``set()`` then waits forever, which hangs
the shutdown. Here the flag is one byte of an anonymous shared memory mapping, made
before the fork: a write is a store of one byte, a read a load; nothing is ever held, so
no process's death or pause can block another.
"""

from __future__ import annotations

import mmap


class SharedFlag:
    """One lock-free boolean shared across ``fork``: create it before the children are
    forked (at import), then :meth:`set` and :meth:`is_set` from any of the processes."""

    def __init__(self) -> None:
        # fileno -1: anonymous; MAP_SHARED is mmap's default on Unix, so children forked
        # after this line see the parent's writes and the parent sees theirs.
        self._memory = mmap.mmap(-1, 1)

    def set(self) -> None:
        """Raise the flag (visible at once to every process sharing the mapping)."""
        self._memory[0] = 1

    def clear(self) -> None:
        """Lower the flag (tests; a worker that starts over)."""
        self._memory[0] = 0

    def is_set(self) -> bool:
        """Whether the flag is raised; never blocks."""
        return self._memory[0] == 1
