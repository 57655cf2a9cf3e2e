"""What an ``async def`` handler sees: the same recorded steps, awaited.

:class:`AsyncJobContext` wraps the run's :class:`jobs._core.context.JobContext` and keeps
none of the recording logic itself: each call that records something or reads the
database (``step``, ``sleep``, ``wait_for_approval``, ``spawn``, ``map``, ``wait_for`` …)
runs the sync context's own method in a thread of the event loop's executor
(``asyncio.to_thread``), so a store round trip never blocks the loop; replay, held
completions, NonDeterministic positions, idempotency keys and progress are the sync
context's, unchanged.

A step whose function is a coroutine function runs on the loop: the thread that runs the
sync ``step`` hands the coroutine to the loop (``asyncio.run_coroutine_threadsafe``) and
waits for it. A sync step function runs in that thread, off the loop, as it would in a
sync handler (so it blocks none of the loop's other coroutines, and polls
``ctx.cancelled`` or uses ``ctx.on_cancel`` to stop early). A step that is recorded already
replays inline, on the loop: it reads nothing.

The calls of one job run one at a time, in the order they were made (an
``asyncio.Lock``, which is first come first served): ``asyncio.gather`` of two steps records
them at the places they were asked for, one after the other. Work in parallel within one
job is done inside one step, or by children (``spawn``/``map``).

When the run learns its lease is gone (a cancel, a time limit, another owner), the step
coroutine running now is cancelled (``asyncio.CancelledError`` inside it) and the call
raises the reason (:class:`jobs.JobCancelled`, :class:`jobs.LeaseLost`); a handler
awaiting something outside any step (``asyncio.sleep``, a client of its own) is cancelled
where it waits. A sync step or store round trip in its thread is not interrupted: it
checks the lease when it returns, as in a sync handler.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Concatenate, ParamSpec, TypeVar, overload

from jobs._core.context import JobContext
from jobs._core.errors import LeaseLost, StepError
from jobs._core.interrupts import TimedOut

P = ParamSpec("P")
T = TypeVar("T")

#: Set inside a step's coroutine: a context call there would wait for itself.
_IN_STEP: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "jobs_async_step", default=None
)


def _awaited(
    method: Callable[Concatenate[JobContext, P], T],
) -> Callable[Concatenate[AsyncJobContext, P], Coroutine[Any, Any, T]]:
    """The awaitable form of a sync context method that records or reads: it runs in a
    thread, one call of the job at a time (see the module's docstring)."""

    async def in_thread(self: AsyncJobContext, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.call_recorded(functools.partial(method, self.context, *args, **kwargs))

    functools.update_wrapper(in_thread, method)  # its name, docstring and signature
    return in_thread


def is_async_handler(handler: Callable[..., Any]) -> bool:
    """Whether ``handler`` (a kind's, maybe wrapped by ``@jobs.job``'s task) is an
    ``async def``: the runner then gives it an :class:`AsyncJobContext` on a loop."""
    return inspect.iscoroutinefunction(inspect.unwrap(handler))


class AsyncJobContext:
    """What an ``async def`` handler gets as its first argument; chosen by the runner when
    the handler is a coroutine function. ``await ctx.step(name, fn, *args)`` records as
    :meth:`jobs._core.context.JobContext.step` does, with ``fn`` an ``async def`` (run on
    the loop) or a plain function (run in a thread). The waits, timers and children are
    the sync context's, awaited: ``await ctx.sleep(...)``, ``await ctx.map(...)``. What
    never waits on the database is the sync context's as it is: ``ctx.progress``,
    ``ctx.cancelled``, ``ctx.on_cancel``, ``ctx.idempotency_key``, ``ctx.patched``."""

    def __init__(self, context: JobContext) -> None:
        self.context = context
        # Held between the heartbeat's thread (lease_lost) and the calls' threads.
        self._lock = threading.Lock()
        self._stopped = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handler_task: asyncio.Task[Any] | None = None
        self._one_at_a_time: asyncio.Lock | None = None
        self._calls_in_threads = 0
        self._step_future: concurrent.futures.Future[Any] | None = None
        # What never waits on the database: the sync context's own methods.
        self.progress = context.progress
        self.on_cancel = context.on_cancel
        self.idempotency_key = context.idempotency_key
        self.patched = context.patched
        self.deprecate_patch = context.deprecate_patch
        self.is_recorded = context.replay.is_recorded

    @property
    def job_id(self) -> str:
        """The job being run."""
        return self.context.job_id

    @property
    def attempt(self) -> int:
        """This run's attempt number (1 for the first)."""
        return self.context.attempt

    @property
    def owner(self) -> str:
        """Who holds the claim: ``<celery node or host>:<pid>``."""
        return self.context.owner

    @property
    def cancelled(self) -> bool:
        """Whether this job was cancelled while this run holds it (see
        :attr:`jobs._core.context.JobContext.cancelled`)."""
        return self.context.cancelled

    @property
    def last_progress(self) -> dict[str, Any] | None:
        """The latest progress reported, written or not; ``None`` when none was."""
        return self.context.progress_reporter.latest

    # -- the run -------------------------------------------------------------------------

    async def run(self, handler: Callable[..., Awaitable[Any]], inputs: Mapping[str, Any]) -> Any:
        """Await ``handler(self, **inputs)`` on the running loop (the runner's call). A
        cancel of the run for a lost lease raises the reason instead."""
        self._loop = asyncio.get_running_loop()
        self._handler_task = asyncio.current_task()
        self._one_at_a_time = asyncio.Lock()
        with self._lock:
            stopped = self._stopped
        if stopped:
            self.context.check_lease()
        try:
            return await handler(self, **inputs)
        except asyncio.CancelledError:
            self.context.check_lease()  # cancelled for a lost lease: raise its reason
            raise StepError(f"job {self.job_id!r}: the handler was cancelled") from None

    def lease_lost(self, reason: LeaseLost) -> None:
        """From the heartbeat's thread: the sync context's :meth:`lease_lost`, then the
        step coroutine running now is cancelled, or else the handler where it awaits
        (unless a call of the context is in its thread: it checks the lease itself)."""
        self.context.lease_lost(reason)
        with self._lock:
            self._stopped = True
            step, loop, task = self._step_future, self._loop, self._handler_task
            in_thread = self._calls_in_threads > 0
        if step is not None:
            step.cancel()
        elif not in_thread and loop is not None and task is not None and not task.done():
            with contextlib.suppress(RuntimeError):  # the loop closed: the run is over
                loop.call_soon_threadsafe(task.cancel)

    async def call_recorded(self, call: Callable[[], T]) -> T:
        """``call()`` (a sync context method with its arguments) in a thread, after the
        job's earlier calls ended; the job's calls run one at a time."""
        if _IN_STEP.get() is not None:
            raise StepError(
                f"job {self.job_id!r}: a context call inside step {_IN_STEP.get()!r}; "
                "steps, waits and timers are called from the handler, not from a step"
            )
        if self._one_at_a_time is None:
            raise StepError("the async context is used outside its run")
        async with self._one_at_a_time:
            with self._lock:
                self._calls_in_threads += 1
            try:
                return await asyncio.to_thread(call)
            finally:
                with self._lock:
                    self._calls_in_threads -= 1

    # -- steps ---------------------------------------------------------------------------

    @overload
    async def step(
        self,
        name: str,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> T: ...

    @overload
    async def step(
        self,
        name: str,
        fn: Callable[..., T],
        *args: Any,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> T: ...

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` once for this job and record its JSON output, as
        :meth:`jobs._core.context.JobContext.step`; ``fn`` is an ``async def`` (awaited
        on this loop) or a plain function (run in a thread). A recorded step returns its
        output at once. ``timeout`` limits the step as for a sync step; an ``async``
        step is also cancelled at its timeout when no heartbeat watches the run."""
        if self._one_at_a_time is not None and isinstance(name, str) and self.is_recorded(name):
            async with self._one_at_a_time:  # in its place among the job's calls
                return self.context.step(name, fn, timeout=timeout)
        on_loop = functools.partial(self._run_on_loop, name, timeout, fn)
        return await self.call_recorded(
            functools.partial(self.context.step, name, on_loop, *args, timeout=timeout, **kwargs)
        )

    def _run_on_loop(
        self, name: str, timeout: float | None, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """In the step's thread: call ``fn``; a coroutine it returns runs on the loop while
        this thread waits (cancelled by :meth:`lease_lost`)."""
        output = fn(*args, **kwargs)
        if not inspect.isawaitable(output):
            return output
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(_in_step(name, output, timeout), self._loop)
        with self._lock:
            self._step_future = future
            stopped = self._stopped
        if stopped:
            future.cancel()
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            self.context.check_lease()  # cancelled for a lost lease: raise its reason
            raise StepError(f"job {self.job_id!r}: step {name!r} was cancelled") from None
        except _StepTimedOut:
            raise TimedOut(f"step {name!r} passed its timeout of {timeout:g} s") from None
        finally:
            with self._lock:
                self._step_future = None

    sleep = _awaited(JobContext.sleep)
    sleep_until = _awaited(JobContext.sleep_until)
    wait_for_approval = _awaited(JobContext.wait_for_approval)
    wait_for_event = _awaited(JobContext.wait_for_event)
    spawn = _awaited(JobContext.spawn)
    spawn_many = _awaited(JobContext.spawn_many)
    wait_for = _awaited(JobContext.wait_for)
    map = _awaited(JobContext.map)


class _StepTimedOut(TimeoutError):
    """An async step's own time-out (its ``timeout``), told apart from one it raised."""


async def _in_step(name: str, awaitable: Awaitable[T], timeout: float | None) -> T:
    """Await a step's coroutine on the loop, marked as inside step ``name``, under its
    time-out if it has one."""
    _IN_STEP.set(name)
    if timeout is None:
        return await awaitable
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            return await awaitable
    except TimeoutError:
        if scope.expired():
            raise _StepTimedOut(name) from None
        raise


__all__ = ["AsyncJobContext", "is_async_handler"]
