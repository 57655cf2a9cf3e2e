"""What a handler sees while it runs: recorded steps, approvals, timers, and its lease.

A handler is re-run from the top after a crash, an approval, a timer or a hand-back. Steps
already recorded return their recorded output without running, so the handler walks
quickly back to where the last owner stopped. Control-flow signals (wait for approval, sleep,
hand back) derive from BaseException so a handler's ``except Exception`` cannot
swallow them.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from jobs._core import tracing
from jobs._core.errors import EventTimedOut, InvalidInput, LeaseLost, StepError
from jobs._core.validate import (
    NAME_LENGTH,
    check_instant,
    check_name,
    check_text,
    check_timeout,
    seconds_of,
)
from jobs._core.waits import TIMED_OUT, Workflow

if TYPE_CHECKING:  # annotations only: a module that defines jobs need not load SQLAlchemy
    from jobs._core.heartbeat import LeaseHeartbeat
    from jobs._core.outage import LeaseHold
    from jobs._core.records import Ring
    from jobs._core.registry import Registry
    from jobs._store import Claim, JobStore, PendingStep

T = TypeVar("T")


class JobInterrupt(BaseException):
    """Stops a handler at a step boundary; the runner turns it into a state change."""


class WaitingForApproval(JobInterrupt):
    """Raised by :meth:`JobContext.wait_for_approval` on a first run: the runner parks the
    job in WAITING_APPROVAL (lease released) until ``jobs.approve`` or a cancel."""

    def __init__(self, reason: str, step_name: str, timeout: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.step_name = step_name
        self.timeout = timeout


class Sleeping(JobInterrupt):
    """A durable timer: the job goes back to the queue, due at ``wake_at`` (the database's
    clock), with the timer recorded as step ``name`` in the same write."""

    def __init__(self, name: str, wake_at: dt.datetime) -> None:
        super().__init__(f"sleep until {wake_at.isoformat()} (timer {name!r})")
        self.name = name
        self.wake_at = wake_at


#: A timer's recorded output: ``{"wake_at": "<ISO 8601 instant, UTC>"}``.
WAKE_AT = "wake_at"


def wake_at_of(output: Any) -> dt.datetime | None:
    """The wake-up instant of a recorded timer step; ``None`` for any other step."""
    if isinstance(output, dict) and set(output) == {WAKE_AT} and isinstance(output[WAKE_AT], str):
        try:
            return dt.datetime.fromisoformat(output[WAKE_AT])
        except ValueError:
            return None
    return None


class HandBack(JobInterrupt):
    """The run used up its time budget for one delivery: give the job back to the queue."""


class TimedOut(JobInterrupt):
    """The run or a step passed its time limit (noticed by the handler's own thread when no
    heartbeat watches the run): the attempt counts, and the job is retried or FAILED."""


class Unstorable(JobInterrupt):
    """A step name, step output or approval reason that can never be recorded: the job
    fails now with the reason; retrying would only run the step's side effect again."""


def _storable(check: Callable[[], T]) -> T:
    """``check()``'s value; its :class:`InvalidInput` becomes :class:`Unstorable`."""
    try:
        return check()
    except InvalidInput as err:
        raise Unstorable(str(err)) from None


class JobContext(Workflow):
    """What a handler gets as its first argument: the claimed job and its recorded steps.

    ``ctx.step(name, fn, *args)`` runs ``fn`` once per job: its output is recorded under
    ``name`` and a later run (after a crash, a retry, a sleep or an approval) returns the
    recorded output instead of calling ``fn`` again. ``ctx.wait_for_approval(...)``,
    ``ctx.sleep(...)`` and ``ctx.sleep_until(...)`` park the job without holding a worker;
    so do ``ctx.wait_for(...)``/``ctx.map(...)`` (children) and ``ctx.wait_for_event(...)``
    (:class:`jobs._core.waits.Workflow`).
    Every write the context makes is fenced by the claim: once the lease is lost, the next
    step stops the handler and nothing more is written.
    """

    def __init__(
        self,
        store: JobStore,
        claim: Claim,
        recorded: dict[str, Any],
        *,
        lost: threading.Event | None = None,
        deadline: float | None = None,
        stopping: Callable[[], bool] | None = None,
        heartbeat: LeaseHeartbeat | None = None,
        run_deadline: tuple[float, str] | None = None,
        hold: LeaseHold | None = None,
        registry: Registry | None = None,
        default_max_attempts: int = 5,
        ring: Ring | None = None,
    ) -> None:
        self.store = store
        self.claim = claim
        self._recorded = recorded
        self._used: set[str] = set()
        self._approvals = 0
        self._lost = lost or threading.Event()
        self.lost_reason: LeaseLost | None = None
        self._deadline = deadline
        self._stopping = stopping
        self.ran_steps: list[str] = []
        self.replayed_steps: list[str] = []
        # A step that ran, its output checked, waiting to be recorded with the job's next
        # write (the next step's start, or the run's outcome): one write fewer per job.
        self._pending: list[PendingStep] = []
        # Held while pending steps are written, by this thread or the heartbeat's.
        self._pending_lock = threading.Lock()
        self._heartbeat = heartbeat
        # The run's time limit as (monotonic deadline, why); enforced here at step
        # boundaries, and by the heartbeat (which can stop a stuck step) when there is one.
        self._run_deadline = run_deadline
        # Holds this thread's writes through a database outage while the lease can be live
        # (jobs._core.outage); None writes once and lets the error go.
        self.hold = hold
        # The kinds children take their defaults from (attempts, priority, queue, version),
        # and the attempts of a child whose kind sets none (JOBS_DEFAULT_MAX_ATTEMPTS).
        self.registry = registry
        self.default_max_attempts = default_max_attempts
        # Rings the doorbells of the children a spawn inserted, after its commit; None
        # rings none (the sweeper rings them once they wait long enough).
        self.ring = ring

    @property
    def job_id(self) -> str:
        """The job being run."""
        return self.claim.job_id

    @property
    def attempt(self) -> int:
        """This run's attempt number (1 for the first; a hand-back or sleep gives it back)."""
        return self.claim.job.attempts

    @property
    def owner(self) -> str:
        """Who holds the claim: ``<celery node or host>:<pid>``."""
        return self.claim.owner

    def is_recorded(self, name: str) -> bool:
        """Whether step ``name`` already has a recorded output (it will not run again)."""
        return name in self._recorded

    def lease_lost(self, reason: LeaseLost) -> None:
        """Called by the heartbeat when a renewal is refused: the next step stops the handler."""
        self.lost_reason = reason
        self._lost.set()

    def _storable_name(self, value: object, what: str) -> None:
        """A name the run is about to record (a step's, a key's): one that can never be
        stored fails the job now (:class:`Unstorable`) instead of at each retry."""
        _storable(lambda: check_name(value, what))

    def _use(self, name: str) -> None:
        # Derived names (``spawn:<key>``, ``event:<name>:2``) can outgrow the column.
        shown = "step name" if len(name) <= NAME_LENGTH else f"step name {name[:40]!r}…"
        self._storable_name(name, shown)
        if name in self._used:
            raise StepError(
                f"job {self.job_id!r}: step name {name!r} used twice in one run; "
                "step names must be unique within a job"
            )
        self._used.add(name)

    def check_lease(self) -> None:
        """Raise :class:`LeaseLost` if the heartbeat was refused: stop, write nothing."""
        if self._lost.is_set():
            raise self.lost_reason or LeaseLost(self.job_id, self.owner, self.claim.fence)

    def take_pending(self) -> list[PendingStep]:
        """The steps that ran but are not recorded yet, handed to the write that records
        them (the runner's outcome); the context forgets them. Waits for a write of them
        the heartbeat may have in flight."""
        if self._heartbeat is not None:
            self._heartbeat.cancel_flush(id(self))
        with self._pending_lock:
            pending, self._pending = self._pending, []
        return pending

    def take_pending_and_record(self) -> None:
        """Record the pending steps now, in this thread (the start of the next step)."""
        if self._heartbeat is not None:
            self._heartbeat.cancel_flush(id(self))
        self.flush(held=True)

    def flush(self, *, held: bool = False) -> None:
        """Record the steps that ran and wait for the job's next write: before another
        step starts (a step never begins while an earlier one is unrecorded), or from the
        heartbeat thread when the handler runs on for long without a step. ``held`` (the
        handler's own thread): through a database outage, keep the outputs and try again
        while the lease can be live (:class:`jobs._core.outage.LeaseHold`)."""
        with self._pending_lock:
            if self._pending:
                pending = self._pending
                try:
                    if held and self.hold is not None:
                        self._record_held(pending)
                    else:
                        self.store.ownership.record_steps(self.claim, pending)
                except LeaseLost as lost:  # refused by the fence: the handler stops too
                    self.lease_lost(lost)
                    raise
                self._pending = []

    def _record_held(self, pending: list[PendingStep]) -> None:
        """Record ``pending`` through an outage (:meth:`jobs._core.outage.LeaseHold.write`):
        an attempt whose acknowledgement was lost had landed when this claim's owner has
        every one of them recorded."""
        assert self.hold is not None
        claim, names = self.claim, [step.name for step in pending]

        def record() -> bool:
            self.store.ownership.record_steps(claim, pending)
            return True

        def landed() -> bool | None:
            recorded = self.store.reads.steps_recorded_by(
                claim.job_id, claim.owner, claim.fence, names
            )
            return True if recorded else None

        self.hold.write(record, renew_after=True, landed=landed)

    def _check_time(self, step: tuple[float, str] | None = None) -> None:
        """Raise :class:`TimedOut` if the run (or the step just run) is past its limit."""
        now = time.monotonic()
        for limit in (self._run_deadline, step):
            if limit is not None and now >= limit[0]:
                raise TimedOut(limit[1])

    def step(
        self,
        name: str,
        fn: Callable[..., T],
        *args: Any,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> T:
        """Run ``fn(*args, **kwargs)`` once for this job and record its JSON output.

        On a re-run the recorded output is returned without calling ``fn``. A first run
        returns the output as it will be replayed (through JSON), so both paths see the
        same value. If the process dies after ``fn`` ran but before the record commits,
        ``fn`` runs again: make such steps idempotent.

        ``timeout`` (seconds) is the step's time limit: past it the run stops, the attempt
        counts, and the job is retried with backoff (or FAILED once its attempts are used
        up) with the reason; a worker's pool child stuck in the step is ended. It is not
        passed to ``fn`` (wrap ``fn`` with ``functools.partial`` to give it a ``timeout``).
        """
        _storable(lambda: check_name(name, "step name"))  # before the function runs
        if timeout is not None:
            _storable(lambda: check_timeout(timeout, f"timeout of step {name!r}"))
        self._use(name)
        if name in self._recorded:
            self.replayed_steps.append(name)
            if tracing.ENABLED:
                tracing.replayed_step(name)
            replayed: T = self._recorded[name]
            return replayed
        self.check_lease()
        if self._deadline is not None and time.monotonic() >= self._deadline:
            raise HandBack(f"delivery time budget used up before step {name!r}")
        if self._stopping is not None and self._stopping():
            raise HandBack(f"worker shutting down; handed back before step {name!r}")
        if self._run_deadline is not None:
            self._check_time()
        self.take_pending_and_record()
        if tracing.ENABLED:
            with tracing.step_span(name):
                output = self._call_step(name, timeout, fn, *args, **kwargs)
        else:
            output = self._call_step(name, timeout, fn, *args, **kwargs)
        self.check_lease()
        try:
            pending = self.store.ownership.pending_step(name, output)
        except InvalidInput as err:
            raise Unstorable(str(err)) from None
        with self._pending_lock:
            self._pending.append(pending)
        if self._heartbeat is not None:
            self._heartbeat.flush_later(id(self), self.flush)
        else:
            self.flush(held=True)  # no heartbeat thread to bound the wait: record at once
        self._recorded[name] = pending.output
        self.ran_steps.append(name)
        result: T = json.loads(pending.text)  # the handler's copy: mutating it changes no record
        return result

    def _call_step(
        self, name: str, timeout: float | None, fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T:
        if timeout is None:
            return fn(*args, **kwargs)
        return self._run_timed(name, timeout, fn, *args, **kwargs)

    def _run_timed(
        self, name: str, timeout: float, fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T:
        """Run a step's function under its time limit: the heartbeat (if any) watches the
        deadline while it runs; a function that returns late is a time-out too."""
        limit = (time.monotonic() + timeout, f"step {name!r} passed its timeout of {timeout:g} s")
        if self._heartbeat is not None:
            self._heartbeat.step_started(self.claim, name, timeout)
        try:
            output = fn(*args, **kwargs)
        finally:
            if self._heartbeat is not None:
                self._heartbeat.step_ended(self.claim)
        self.check_lease()  # the heartbeat may have timed the run out already
        self._check_time(limit)
        return output

    def wait_for_approval(
        self, reason: str, *, key: str | None = None, timeout: float | None = None
    ) -> dict[str, Any]:
        """Park the job in WAITING_APPROVAL until :func:`jobs.approve`; returns who approved.

        The approval is recorded as a step (``key``, by default ``approval-1``, ``approval-2``
        … in call order), so the re-run after approval continues past this call. With
        ``timeout`` (seconds, on the database clock) the sweeper ends the wait then, and
        this call raises :class:`jobs.EventTimedOut` (catch it to escalate).
        """
        self._approvals += 1
        name = key or f"approval-{self._approvals}"
        _storable(lambda: check_name(name, "approval key"))
        _storable(lambda: check_text(reason, "approval reason"))
        self._use(name)
        if timeout is not None:
            _storable(lambda: check_timeout(timeout, "approval timeout"))
        if name in self._recorded:
            self.replayed_steps.append(name)
            if tracing.ENABLED:
                tracing.replayed_step(name)
            approval: dict[str, Any] = self._recorded[name]
            if isinstance(approval, dict) and approval.get(TIMED_OUT):
                raise EventTimedOut(self.job_id, f"approval {name!r}")
            return approval
        self.check_lease()
        raise WaitingForApproval(reason, name, timeout)

    def sleep(self, name: str, seconds: float | dt.timedelta) -> None:
        """Sleep durably for ``seconds`` (a number or a ``timedelta``), holding no worker,
        lease or message: the job goes back to QUEUED due at the database's now plus
        ``seconds``, and the sweeper rings it. The handler is then run again
        from the top; recorded steps replay, and this call (recorded as step ``name`` with
        ``{"wake_at": …}``) returns at once. ``seconds <= 0`` returns at once, recording
        nothing."""
        _storable(lambda: check_name(name, "timer name"))
        span = _storable(lambda: seconds_of(seconds, f"timer {name!r}: seconds"))
        if self._replayed_timer(name) or span <= 0:
            return
        raise Sleeping(name, self.store.reads.now() + dt.timedelta(seconds=span))

    def sleep_until(self, name: str, when: dt.datetime) -> None:
        """Sleep durably until ``when`` (an aware ``datetime``, compared with the database's
        clock); like :meth:`sleep`. An instant already past returns at once."""
        _storable(lambda: check_name(name, "timer name"))
        wake_at = _storable(lambda: check_instant(when, f"timer {name!r}: when"))
        if self._replayed_timer(name):
            return
        now = self.store.reads.now()
        _storable(
            lambda: seconds_of(wake_at - now, f"timer {name!r}: time until {wake_at.isoformat()}")
        )
        if wake_at > now:
            raise Sleeping(name, wake_at)

    def _replayed_timer(self, name: str) -> bool:
        """True when timer ``name`` is recorded: its wake-up came (a claim takes a QUEUED job
        only once its ``run_after``, the timer's instant, has passed), so do not sleep again."""
        self._use(name)
        if name not in self._recorded:
            self.check_lease()
            if self._run_deadline is not None:
                self._check_time()  # a run past its time limit fails rather than sleeps
            return False
        if wake_at_of(self._recorded[name]) is None:
            raise Unstorable(
                f"job {self.job_id!r}: step {name!r} is recorded but is not a timer; "
                "a timer needs a step name of its own"
            )
        self.replayed_steps.append(name)
        if tracing.ENABLED:
            tracing.replayed_step(name)
        return True
