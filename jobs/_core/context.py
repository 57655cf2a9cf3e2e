"""What a handler sees while it runs: recorded steps, approvals, timers, and its lease.

A handler is re-run from the top after a crash, an approval, a timer or a hand-back. Steps
already recorded return their recorded output without running, so the handler walks
quickly back to where the last owner stopped. The context composes the run's parts: its
replay log (:mod:`jobs._core.replay_log`), the steps waiting to be recorded
(:mod:`jobs._core.pending_steps`), its progress (:mod:`jobs._core.progress_reporter`) and
its cancel signal (:mod:`jobs._core.cancel_signal`); the signals that stop a handler live
in :mod:`jobs._core.interrupts`.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from jobs._core import tracing
from jobs._core.cancel_signal import CancelSignal
from jobs._core.deferred_writes import DeferredWrites
from jobs._core.errors import EventTimedOut, InvalidInput, JobCancelled, LeaseLost, StepError
from jobs._core.interrupts import (
    HandBack,
    Sleeping,
    TimedOut,
    Unstorable,
    WaitingForApproval,
    storable,
    wake_at_of,
)
from jobs._core.pending_steps import PendingSteps
from jobs._core.progress import check_progress
from jobs._core.progress_reporter import ProgressReporter
from jobs._core.replay_log import PATCH_PREFIX, ReplayLog
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

#: How an idempotency key starts; the rest is 32 characters of base32 (lower case).
IDEMPOTENCY_KEY_PREFIX = "jk-"


def idempotency_key_of(job_id: str, place: str, name: str | None = None) -> str:
    """The idempotency key of ``place`` (``step:<name>`` or ``position:<n>``) in job
    ``job_id``, under ``name`` (``None``: the place's default key): ``jk-`` and the
    base32 of the first 160 bits of a SHA-256 of the three, 35 characters of ``[a-z0-9-]``."""
    parts = [job_id, place, "" if name is None else f"name:{name}"]
    digest = hashlib.sha256("\0".join(parts).encode()).digest()[:20]
    return IDEMPOTENCY_KEY_PREFIX + base64.b32encode(digest).decode().lower()


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
        positions: Mapping[str, int | None] | None = None,
    ) -> None:
        self.store = store
        self.claim = claim
        # The steps recorded, with where each stands (``positions``, by name), and this
        # run's calls (:class:`jobs._core.replay_log.ReplayLog`).
        self.replay = ReplayLog(claim.job_id, recorded, positions)
        self._lost = lost or threading.Event()
        self.lost_reason: LeaseLost | None = None
        self._deadline = deadline
        self._stopping = stopping
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
        # Steps that ran, waiting to be recorded with the job's next write.
        deferred = DeferredWrites(store, claim, hold, heartbeat, self.lease_lost, self._lost.is_set)
        self.pending = PendingSteps(deferred)
        self.progress_reporter = ProgressReporter(deferred)
        self.cancel_signal = CancelSignal(claim.job_id)
        # The step whose function runs now, with its place (for idempotency keys).
        self._running: tuple[str, int] | None = None

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

    def lease_lost(self, reason: LeaseLost) -> None:
        """Called by the heartbeat when a renewal is refused: the next step stops the
        handler. A cancel (:class:`jobs.JobCancelled`) also sets :attr:`cancelled` and calls
        the :meth:`on_cancel` callbacks, here, in the caller's thread."""
        self.lost_reason = reason
        self._lost.set()
        if isinstance(reason, JobCancelled):
            self.cancel_signal.set()

    @property
    def cancelled(self) -> bool:
        """Whether this job was cancelled while this run holds it (``jobs.cancel``,
        ``jobctl cancel``). A worker's heartbeat learns it within a third of the lease of
        the cancel; a step that runs long can poll this and return early. Whatever the
        step returns then is not recorded: the job is CANCELLED already, and the run's
        next step (or wait, or timer, or its outcome) stops it, writing nothing."""
        return self.cancel_signal.is_set()

    def on_cancel(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` once when this run learns its job was cancelled: from the
        heartbeat's thread, while the handler may be inside a step, so it can unblock a
        blocking call (close a socket, set an event, kill a subprocess). Called at once,
        in this thread, if the cancel is known already. An exception it raises is logged,
        not raised. In a prefork pool child a run still in its handler a moment after the
        callbacks ran is ended with its process (as at a time limit); on a threads pool
        nothing can end the thread, so a step that never looks at :attr:`cancelled` or
        returns on a callback runs to its end (its output is refused)."""
        self.cancel_signal.call_when_set(callback)

    def _storable_name(self, value: object, what: str) -> None:
        """A name the run is about to record (a step's, a key's): one that can never be
        stored fails the job now (:class:`Unstorable`) instead of at each retry."""
        storable(lambda: check_name(value, what))

    def _use(self, name: str) -> int:
        """Take the next place in the handler's sequence for step ``name`` (see
        :meth:`jobs._core.replay_log.ReplayLog.take`), once the name is one that can be
        stored (derived names, ``spawn:<key>`` or ``event:<name>:2``, can outgrow it)."""
        shown = "step name" if len(name) <= NAME_LENGTH else f"step name {name[:40]!r}…"
        self._storable_name(name, shown)
        return self.replay.take(name)

    def idempotency_key(self, name: str | None = None) -> str:
        """A key for the provider's deduplication of this step's side effect: the same
        for this job and step on every attempt, worker and re-run after a crash, and
        different for every other job and step. ``jk-`` and 32 characters of ``[a-z2-7]``
        (35 in all), safe in an HTTP header (``Idempotency-Key``).

        Called inside a step's function (``ctx.step("charge", charge, ...)``), "this step"
        is the step that runs (keyed by the job's ID and the step's name); called from the
        handler itself, it is the next call's place in the sequence (keyed by the job's ID
        and that position: stable while the calls before it do not change). ``name``
        tells several keys of one step apart (``ctx.idempotency_key("refund")``).

        The key only names the effect: the provider must deduplicate by it (most payment
        APIs keep keys for a day or more). A step whose function ran but whose record was
        lost runs again and sends the same key, so the provider answers it once."""
        if name is not None:
            self._storable_name(name, "idempotency key name")
        if self._running is not None:
            place = f"step:{self._running[0]}"
        else:
            place = f"position:{self.replay.next_position}"
        return idempotency_key_of(self.job_id, place, name)

    def patched(self, change_id: str) -> bool:
        """Whether this job runs the new code of change ``change_id`` at this point.

        True on a run that reaches this point for the first time (a job submitted after
        the change, or one that had not got this far): a marker ``patch:<change id>`` is
        recorded here, like a step, so its re-runs answer True again. False on the replay
        of a job that passed this point before the change (a step other than the marker is
        recorded here, or later): run the old code for it. Asked again with the same ID in
        one run, the first answer is returned. See docs/guides/changing-code.md."""
        self._storable_name(change_id, "patch change id")
        marker = PATCH_PREFIX + change_id
        self._storable_name(marker, "patch marker")
        new, asked_before = self.replay.patch_is_new(change_id)
        if asked_before or not new:
            return new
        place = self._use(marker)
        if self.replay.is_recorded(marker):
            self.replay.replayed.append(marker)
            return True
        self.check_lease()
        pending = self.store.ownership.pending_step(marker, {"patch": change_id}, place)
        self.pending.add(pending, record_soon=False)  # recorded with the job's next write
        self.replay.ran_now(marker, pending.output)
        return True

    def deprecate_patch(self, change_id: str) -> None:
        """The patch ``change_id`` once no job that predates it remains: the old code is
        gone and this call stands where ``if ctx.patched(change_id):`` stood. A job that
        recorded the marker here walks past it; any other records nothing."""
        self._storable_name(change_id, "patch change id")
        self.replay.pass_deprecated_patch(change_id)

    def check_lease(self) -> None:
        """Raise :class:`LeaseLost` if the heartbeat was refused: stop, write nothing."""
        if self._lost.is_set():
            raise self.lost_reason or LeaseLost(self.job_id, self.owner, self.claim.fence)

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Report how far a long job is: ``done`` out of ``total`` (leave it out when
        unknown), with a short ``message``. Shown by ``jobctl show``/``explain``, a
        result's ``.info``, Flower's and Django's job pages and the ``jobs_progress``
        metric.

        Call it as often as you like: the value is written to the job's row (fenced, as
        every write of the run) at most once a second, and the latest value at the end of
        each step (whose record keeps it, the job's history of progress) and of the run.
        ``done`` and ``total`` are numbers from 0 to 2**53, ``total`` above 0 and not below
        ``done``; anything else raises :class:`jobs.InvalidInput`. ``message`` is cut to
        200 characters. A lost lease raises :class:`jobs.LeaseLost` (the run stops); a
        database outage only delays the write (progress never fails a job)."""
        value = check_progress(done, total, message)
        self.check_lease()
        self.progress_reporter.report(value)

    def take_pending(self) -> list[PendingStep]:
        """The steps that ran but are not recorded yet, handed to the write that records
        them (the runner's outcome, a wait, a spawn); the context forgets them. The latest
        progress is written first, if the row does not have it yet."""
        self.progress_reporter.flush()
        self.progress_reporter.stop_later_writes()
        return self.pending.take()

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
        atomic: bool = False,
        **kwargs: Any,
    ) -> T:
        """Run ``fn(*args, **kwargs)`` once for this job and record its JSON output.

        On a re-run the recorded output is returned without calling ``fn``. A first run
        returns the output as it will be replayed (through JSON), so both paths see the
        same value. If the process dies after ``fn`` ran but before the record commits,
        ``fn`` runs again: make such steps idempotent.

        ``atomic=True`` runs ``fn`` inside the transaction that records the step, on the
        jobs' database: its writes there and the step's record commit together or not at
        all (docs/guides/transactions.md). ``fn`` takes that transaction's SQLAlchemy
        ``Connection`` first; under Django and Flask-SQLAlchemy it takes nothing more, and
        the ORM is inside the transaction.

        ``timeout`` (seconds) is the step's time limit: past it the run stops, the attempt
        counts, and the job is retried with backoff (or FAILED once its attempts are used
        up) with the reason; a worker's pool child stuck in the step is ended. It is not
        passed to ``fn`` (wrap ``fn`` with ``functools.partial`` to give it a ``timeout``).
        """
        storable(lambda: check_name(name, "step name"))  # before the function runs
        if timeout is not None:
            storable(lambda: check_timeout(timeout, f"timeout of step {name!r}"))
        place = self._use(name)
        if self.replay.is_recorded(name):
            replayed: T = self.replay.replay(name)
            return replayed
        self.check_lease()
        if self._deadline is not None and time.monotonic() >= self._deadline:
            raise HandBack(f"delivery time budget used up before step {name!r}")
        if self._stopping is not None and self._stopping():
            raise HandBack(f"worker shutting down; handed back before step {name!r}")
        if self._run_deadline is not None:
            self._check_time()
        self.pending.record_now()
        if atomic:
            return self._atomic_step(
                name, place, timeout, lambda *leading: fn(*leading, *args, **kwargs)
            )
        output = self._run_function(name, place, timeout, lambda: fn(*args, **kwargs))
        self.check_lease()
        pending = self._record_of(name, output, place)
        self.progress_reporter.flush()  # the step ended: the row gets the latest progress
        self.pending.add(pending, record_soon=True)
        self.replay.ran_now(name, pending.output)
        result: T = json.loads(pending.text)  # the handler's copy: mutating it changes no record
        return result

    def _atomic_step(
        self, name: str, place: int, timeout: float | None, call: Callable[..., T]
    ) -> T:
        """:meth:`step` with ``atomic=True``, once the earlier steps are recorded: ``call``
        (the step's function with its arguments, taking the transaction's leading ones
        first) and the step's record in one transaction
        (:class:`jobs._store.atomic_steps.AtomicSteps`), never held for the job's next
        write."""
        if self._running is not None:
            raise StepError(
                f"job {self.job_id!r}: atomic step {name!r} inside step "
                f"{self._running[0]!r}: an atomic step cannot run inside another step's function"
            )

        def record(leading: tuple[Any, ...]) -> PendingStep:
            output = self._run_function(name, place, timeout, lambda: call(*leading))
            self.check_lease()  # inside the transaction: a lost lease rolls it back
            return self._record_of(name, output, place)

        try:
            pending = self.store.atomic.run(
                self.claim,
                record,
                lease_seconds=None if self.hold is None else self.hold.lease_seconds,
                opener=None if self.registry is None else self.registry.step_transactions,
            )
        except LeaseLost as lost:  # refused by the fence: rolled back, the handler stops
            self.lease_lost(lost)
            raise
        self.progress_reporter.flush()
        self.replay.ran_now(name, pending.output)
        result: T = json.loads(pending.text)
        return result

    def _record_of(self, name: str, output: Any, place: int) -> PendingStep:
        """Step ``name``'s record of ``output`` at ``place``, with the latest progress; an
        output that can never be stored fails the job now (:class:`Unstorable`)."""
        try:
            return self.store.ownership.pending_step(
                name, output, place, self.progress_reporter.latest
            )
        except InvalidInput as err:
            raise Unstorable(str(err)) from None

    def _run_function(
        self, name: str, place: int, timeout: float | None, call: Callable[[], T]
    ) -> T:
        """Call step ``name``'s function (at ``place``; ``call``: with its arguments), in
        its span when tracing is on."""
        self._running = (name, place)
        try:
            if tracing.ENABLED:
                with tracing.step_span(name):
                    return self._call_step(name, timeout, call)
            return self._call_step(name, timeout, call)
        finally:
            self._running = None

    def _call_step(self, name: str, timeout: float | None, call: Callable[[], T]) -> T:
        """Run a step's function (``call``: with its arguments), under its time limit if it
        has one: the heartbeat (if any) watches the deadline while it runs; a function that
        returns late is a time-out too."""
        if timeout is None:
            return call()
        limit = (time.monotonic() + timeout, f"step {name!r} passed its timeout of {timeout:g} s")
        if self._heartbeat is not None:
            self._heartbeat.step_started(self.claim, name, timeout)
        try:
            output = call()
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
        name = key or f"approval-{self.replay.count('approval')}"
        storable(lambda: check_name(name, "approval key"))
        storable(lambda: check_text(reason, "approval reason"))
        place = self._use(name)
        if timeout is not None:
            storable(lambda: check_timeout(timeout, "approval timeout"))
        if self.replay.is_recorded(name):
            approval: dict[str, Any] = self.replay.replay(name)
            if isinstance(approval, dict) and approval.get(TIMED_OUT):
                raise EventTimedOut(self.job_id, f"approval {name!r}")
            return approval
        self.check_lease()
        raise WaitingForApproval(reason, name, timeout, place)

    def sleep(self, name: str, seconds: float | dt.timedelta) -> None:
        """Sleep durably for ``seconds`` (a number or a ``timedelta``), holding no worker,
        lease or message: the job goes back to QUEUED due at the database's now plus
        ``seconds``, and the sweeper rings it. The handler is then run again
        from the top; recorded steps replay, and this call (recorded as step ``name`` with
        ``{"wake_at": …}``) returns at once. ``seconds <= 0`` returns at once, recording
        nothing."""
        storable(lambda: check_name(name, "timer name"))
        span = storable(lambda: seconds_of(seconds, f"timer {name!r}: seconds"))
        if self._replayed_timer(name) or span <= 0:
            return
        wake_at = self.store.reads.now() + dt.timedelta(seconds=span)
        raise Sleeping(name, wake_at, self.replay.place_of(name))

    def sleep_until(self, name: str, when: dt.datetime) -> None:
        """Sleep durably until ``when`` (an aware ``datetime``, compared with the database's
        clock); like :meth:`sleep`. An instant already past returns at once."""
        storable(lambda: check_name(name, "timer name"))
        wake_at = storable(lambda: check_instant(when, f"timer {name!r}: when"))
        if self._replayed_timer(name):
            return
        now = self.store.reads.now()
        storable(
            lambda: seconds_of(wake_at - now, f"timer {name!r}: time until {wake_at.isoformat()}")
        )
        if wake_at > now:
            raise Sleeping(name, wake_at, self.replay.place_of(name))

    def _replayed_timer(self, name: str) -> bool:
        """True when timer ``name`` is recorded: its wake-up came (a claim takes a QUEUED job
        only once its ``run_after``, the timer's instant, has passed), so do not sleep again."""
        self._use(name)
        if not self.replay.is_recorded(name):
            self.check_lease()
            if self._run_deadline is not None:
                self._check_time()  # a run past its time limit fails rather than sleeps
            return False
        if wake_at_of(self.replay.outputs[name]) is None:
            raise Unstorable(
                f"job {self.job_id!r}: step {name!r} is recorded but is not a timer; "
                "a timer needs a step name of its own"
            )
        self.replay.replay(name)
        return True
