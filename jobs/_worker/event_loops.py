"""The event loops ``async def`` handlers run on: one per thread of a process, reused by
every job that thread runs, never used across a fork.

A prefork pool child runs its jobs on its main thread's loop; a threads pool gives each
of its threads a loop of its own (so one job's blocking code never stalls another's); a
gevent pool, whose ``threading.local`` is per greenlet, one per greenlet. The loops belong
to the :class:`jobs._worker.process.ProcessRuntime` a process builds afresh after a fork,
and each is also stamped with the process ID that made it: a loop (its selector's file
descriptor, its executor's threads) inherited through a fork is dropped, never run.

Between two jobs a loop is left clean: tasks a handler started and did not await are
cancelled when its run ends, so nothing of one job runs inside the next.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class EventLoops:
    """This process's event loops, one per thread (see the module's docstring)."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._local = threading.local()
        self._made: list[asyncio.AbstractEventLoop] = []
        self._lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        """This thread's loop, made on first need (and again in a forked child)."""
        if os.getpid() != self._pid:  # inherited through a fork: start over, run none
            self._pid, self._local, self._made = os.getpid(), threading.local(), []
        loop: asyncio.AbstractEventLoop | None = getattr(self._local, "loop", None)
        if loop is None or loop.is_closed():
            loop = asyncio.new_event_loop()
            self._local.loop = loop
            with self._lock:
                self._made.append(loop)
        return loop

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` to its end on this thread's loop; then cancel what it left
        running, so the loop is clean for the next job."""
        loop = self.loop()
        try:
            return loop.run_until_complete(coroutine)
        finally:
            _cancel_left_over(loop)

    def close(self) -> None:
        """Close the loops this process made (its runtime's close); closing a loop that
        another thread runs now is left to that thread's end."""
        with self._lock:
            made, self._made = self._made, []
        for loop in made:
            if os.getpid() == self._pid and not loop.is_running() and not loop.is_closed():
                loop.close()


def _cancel_left_over(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks still pending on ``loop`` and let them end."""
    left = [task for task in asyncio.all_tasks(loop) if not task.done()]
    if not left:
        return
    for task in left:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))


__all__ = ["EventLoops"]
