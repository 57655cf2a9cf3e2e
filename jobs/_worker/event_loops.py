"""The event loops ``async def`` handlers run on: one per thread of a process, reused by
every job that thread runs (one per process under gevent), never used across a fork.

A prefork pool child and the solo pool run their jobs on their main thread's loop; a
threads pool gives each of its threads a loop of its own (so one job's blocking code
never stalls another's). A gevent pool's greenlets share one OS thread, where asyncio
allows one running loop: there the process has one loop, run by a greenlet of its own
(gevent makes its selector cooperative), and each job's coroutine is handed to it; its
executor is large enough for every job's calls in threads at once. The loops belong to
the :class:`jobs._worker.process.ProcessRuntime` a process builds afresh after a fork,
and each is also stamped with the process ID that made it: a loop (its selector's file
descriptor, its executor's threads) inherited through a fork is dropped, never run.

Between two jobs a thread's loop is left clean: tasks a handler started and did not
await are cancelled when its run ends, so nothing of one job runs inside the next. On the
shared loop of a gevent pool, where other jobs' coroutines run at the same time, the loop's
task factory marks each task with the run whose coroutine created it (a context variable,
which tasks inherit), and a run's end cancels its own tasks only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import os
import sys
import threading
import weakref
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")

#: The executor threads (greenlets) of a gevent pool's shared loop: one per job's call in
#: a thread, and a job makes one at a time, so at least the pool's concurrency.
SHARED_EXECUTOR_THREADS = 1024
#: How long :meth:`EventLoops.close` waits for the shared loop's thread to close it.
SHARED_LOOP_CLOSE_SECONDS = 5.0


class _RunTasks:
    """The tasks one run's coroutine started on the shared loop (its own and theirs)."""

    def __init__(self) -> None:
        self.tasks: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()


#: Set inside a run's coroutine on the shared loop; copied into every task it creates.
_RUN: contextvars.ContextVar[_RunTasks | None] = contextvars.ContextVar(
    "jobs_shared_loop_run", default=None
)


def _tracking_task_factory(
    loop: asyncio.AbstractEventLoop,
    coroutine: Coroutine[Any, Any, Any] | Generator[Any, None, Any],
    context: contextvars.Context | None = None,
) -> asyncio.Task[Any]:
    """The shared loop's task factory: a plain task, added to the tasks of the run whose
    code creates it (if any)."""
    task = asyncio.Task(coroutine, loop=loop, context=context)
    run = (context if context is not None else contextvars.copy_context()).get(_RUN)
    if run is not None:
        run.tasks.add(task)
    return task


class EventLoops:
    """This process's event loops, one per thread (see the module's docstring)."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._local = threading.local()
        self._made: list[asyncio.AbstractEventLoop] = []
        self._lock = threading.Lock()
        self._shared: asyncio.AbstractEventLoop | None = None
        self._shared_thread: threading.Thread | None = None

    def loop(self) -> asyncio.AbstractEventLoop:
        """This thread's loop, made on first need (and again in a forked child)."""
        self._forget_if_forked()
        loop: asyncio.AbstractEventLoop | None = getattr(self._local, "loop", None)
        if loop is None or loop.is_closed():
            loop = asyncio.new_event_loop()
            self._local.loop = loop
            with self._lock:
                self._made.append(loop)
        return loop

    def _forget_if_forked(self) -> None:
        if os.getpid() != self._pid:  # inherited through a fork: start over, run none
            self._pid, self._local, self._made = os.getpid(), threading.local(), []
            self._shared, self._shared_thread = None, None

    def shared_loop(self) -> asyncio.AbstractEventLoop:
        """The process's one loop, running in a thread (a greenlet) of its own: made on
        first need, and again in a forked child."""
        with self._lock:
            self._forget_if_forked()
            if self._shared is None or self._shared.is_closed():
                loop = asyncio.new_event_loop()
                loop.set_task_factory(_tracking_task_factory)
                loop.set_default_executor(
                    concurrent.futures.ThreadPoolExecutor(
                        SHARED_EXECUTOR_THREADS, thread_name_prefix="jobs-async"
                    )
                )
                thread = threading.Thread(
                    target=_run_until_stopped, args=(loop,), name="jobs-event-loop", daemon=True
                )
                thread.start()
                self._shared, self._shared_thread = loop, thread
                self._made.append(loop)
            return self._shared

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` to its end on this thread's loop; then cancel what it left
        running, so the loop is clean for the next job. Under gevent, on the shared loop
        (this greenlet waits for it, cooperatively)."""
        if _greenlet_threads():
            return self.run_shared(coroutine)
        loop = self.loop()
        try:
            return loop.run_until_complete(coroutine)
        finally:
            _cancel_left_over(loop)

    def run_shared(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the process's shared loop, this thread (greenlet) waiting
        for it; then cancel the tasks it started and left running, and no other run's."""
        return asyncio.run_coroutine_threadsafe(
            _cancelling_its_tasks(coroutine), self.shared_loop()
        ).result()

    def close(self) -> None:
        """Close the loops this process made (its runtime's close). The shared loop is
        stopped, and its thread closes it (waited for a few seconds); closing a loop that
        another thread runs now is left to that thread's end."""
        with self._lock:
            made, self._made = self._made, []
            shared, thread = self._shared, self._shared_thread
            self._shared = self._shared_thread = None
        if os.getpid() != self._pid:
            return
        for loop in made:
            if loop.is_closed():
                continue
            if loop is shared or loop.is_running():
                loop.call_soon_threadsafe(loop.stop)
            else:
                loop.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join(SHARED_LOOP_CLOSE_SECONDS)


def _run_until_stopped(loop: asyncio.AbstractEventLoop) -> None:
    """The shared loop's thread: run ``loop`` until it is stopped, then close it (an
    unclosed loop's finalizer would run, and warn, wherever the collector finds it)."""
    try:
        loop.run_forever()
    finally:
        loop.close()


def _greenlet_threads() -> bool:
    """Whether gevent made this process's threads greenlets (a gevent pool)."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("threading"))


async def _cancelling_its_tasks(coroutine: Coroutine[Any, Any, T]) -> T:
    """Await ``coroutine`` marked as one run (:data:`_RUN`); then cancel what it left."""
    started = _RunTasks()
    _RUN.set(started)  # in this task's own context: the tasks it creates copy it
    try:
        return await coroutine
    finally:
        this = asyncio.current_task()
        left = [task for task in started.tasks if task is not this and not task.done()]
        for task in left:
            task.cancel()
        if left:
            await asyncio.gather(*left, return_exceptions=True)


def _cancel_left_over(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks still pending on ``loop`` and let them end."""
    left = [task for task in asyncio.all_tasks(loop) if not task.done()]
    if not left:
        return
    for task in left:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))


__all__ = ["EventLoops"]
