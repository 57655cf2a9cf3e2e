"""What a handler sees while it runs: recorded steps, approvals, timers, and its lease.

A handler is re-run from the top after a crash, an approval, a timer or a hand-back. Steps
already recorded return their recorded output without running, so the handler walks
quickly back to where the last owner stopped. Control-flow signals (wait for approval, sleep,
hand back) derive from BaseException so a handler's ``except Exception`` cannot
swallow them.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from jobs._core import tracing
from jobs._core.errors import (
    EventTimedOut,
    InvalidInput,
    JobCancelled,
    LeaseLost,
    NonDeterministic,
    StepError,
)
from jobs._core.progress import PROGRESS_INTERVAL_SECONDS, check_progress
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

log = logging.getLogger("jobs.context")


class JobInterrupt(BaseException):
    """Stops a handler at a step boundary; the runner turns it into a state change."""


class WaitingForApproval(JobInterrupt):
    """Raised by :meth:`JobContext.wait_for_approval` on a first run: the runner parks the
    job in WAITING_APPROVAL (lease released) until ``jobs.approve`` or a cancel."""

    def __init__(
        self,
        reason: str,
        step_name: str,
        timeout: float | None = None,
        position: int | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.step_name = step_name
        self.timeout = timeout
        self.position = position  # the call's place in the handler's sequence


class Sleeping(JobInterrupt):
    """A durable timer: the job goes back to the queue, due at ``wake_at`` (the database's
    clock), with the timer recorded as step ``name`` in the same write."""

    def __init__(self, name: str, wake_at: dt.datetime, position: int | None = None) -> None:
        super().__init__(f"sleep until {wake_at.isoformat()} (timer {name!r})")
        self.name = name
        self.wake_at = wake_at
        self.position = position  # the timer's place in the handler's sequence


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


class Diverged(JobInterrupt):
    """The handler asked for a step other than the one recorded at that place in its
    sequence of calls (or returned while recorded steps were never asked for): the job
    fails now with :attr:`error`, a :class:`jobs.NonDeterministic`, its recorded steps kept.
    An interrupt, so a handler's ``except Exception`` cannot swallow it."""

    def __init__(self, error: NonDeterministic) -> None:
        super().__init__(str(error))
        self.error = error


#: The recorded name of ``ctx.patched("<change id>")``'s marker: ``patch:<change id>``.
PATCH_PREFIX = "patch:"

#: How an idempotency key starts; the rest is 32 characters of base32 (lower case).
IDEMPOTENCY_KEY_PREFIX = "jk-"


def idempotency_key_of(job_id: str, place: str, name: str | None = None) -> str:
    """The idempotency key of ``place`` (``step:<name>`` or ``position:<n>``) in job
    ``job_id``, under ``name`` (``None``: the place's default key): ``jk-`` and the
    base32 of the first 160 bits of a SHA-256 of the three, 35 characters of ``[a-z0-9-]``."""
    parts = [job_id, place, "" if name is None else f"name:{name}"]
    digest = hashlib.sha256("\0".join(parts).encode()).digest()[:20]
    return IDEMPOTENCY_KEY_PREFIX + base64.b32encode(digest).decode().lower()


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
        positions: Mapping[str, int | None] | None = None,
    ) -> None:
        self.store = store
        self.claim = claim
        self._recorded = recorded
        self._used: set[str] = set()
        # Where each recorded step stands in the handler's sequence of calls (``positions``,
        # by name). A job whose steps all have one is checked on replay: the call at each
        # place must ask for the step recorded there (:class:`Diverged`). One with a step
        # recorded before positions existed (None), or a context given none for recorded
        # steps, replays by name only.
        known = dict(positions or {})
        self.ordered = all(known.get(name) is not None for name in recorded)
        self._position_of: dict[str, int] = {
            name: place for name, place in known.items() if place is not None and name in recorded
        }
        self._name_at: dict[int, str] = {place: name for name, place in self._position_of.items()}
        # The next call's place; each call the handler makes takes one, recorded or not
        # (a step whose function raised leaves its place empty, and fills it once it runs
        # to an end on a later run), so the same code makes the same calls at the same places.
        self._next_position = 0
        self._call_position: dict[str, int] = {}
        # The step whose function runs now, with its place (for idempotency keys).
        self._running: tuple[str, int] | None = None
        self._patches: dict[str, bool] = {}
        self.diverged: NonDeterministic | None = None
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
        # ``progress()``: the latest value (the row's, from an earlier run, to begin
        # with), whether it is newer than the row's, and when this run last wrote it
        # (monotonic); written at most once per ``progress_interval`` seconds, and at each
        # step's end and the run's end. Held while written, by this thread or the
        # heartbeat's (a run timed out from there writes its outcome there).
        self._progress: dict[str, Any] | None = claim.job.progress
        self._progress_unwritten = False
        self._progress_written_at: float | None = None
        self._progress_lock = threading.Lock()
        self.progress_interval = PROGRESS_INTERVAL_SECONDS
        # The heartbeat's key for writing a held value once its second is up (negative:
        # never the key of this context's pending-step flush, ``id(self)``).
        self._progress_key = -id(self)
        # Set once the run learns its job was cancelled; the callbacks of on_cancel, called
        # then (each once), guarded by the lock.
        self._cancel_seen = threading.Event()
        self._cancel_lock = threading.Lock()
        self._on_cancel: list[Callable[[], object]] = []

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
        """Called by the heartbeat when a renewal is refused: the next step stops the
        handler. A cancel (:class:`jobs.JobCancelled`) also sets :attr:`cancelled` and calls
        the :meth:`on_cancel` callbacks, here, in the caller's thread."""
        self.lost_reason = reason
        self._lost.set()
        if isinstance(reason, JobCancelled):
            with self._cancel_lock:
                self._cancel_seen.set()
                callbacks, self._on_cancel = self._on_cancel, []
            for callback in callbacks:
                self._call_on_cancel(callback)

    @property
    def cancelled(self) -> bool:
        """Whether this job was cancelled while this run holds it (``jobs.cancel``,
        ``jobctl cancel``). A worker's heartbeat learns it within a third of the lease of
        the cancel; a step that runs long can poll this and return early. Whatever the
        step returns then is not recorded: the job is CANCELLED already, and the run's
        next step (or wait, or timer, or its outcome) stops it, writing nothing."""
        return self._cancel_seen.is_set()

    def on_cancel(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` once when this run learns its job was cancelled: from the
        heartbeat's thread, while the handler may be inside a step, so it can unblock a
        blocking call (close a socket, set an event, kill a subprocess). Called at once,
        in this thread, if the cancel is known already. An exception it raises is logged,
        not raised. In a prefork pool child a run still in its handler a moment after the
        callbacks ran is ended with its process (as at a time limit); on a threads pool
        nothing can end the thread, so a step that never looks at :attr:`cancelled` or
        returns on a callback runs to its end (its output is refused)."""
        if not callable(callback):
            raise InvalidInput(f"on_cancel needs a callable, got {type(callback).__name__}")
        with self._cancel_lock:
            if not self._cancel_seen.is_set():
                self._on_cancel.append(callback)
                return
        self._call_on_cancel(callback)

    def _call_on_cancel(self, callback: Callable[[], object]) -> None:
        try:
            callback()
        except Exception:
            log.exception("job %s: an on_cancel callback raised", self.job_id)

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
        self._take_position(name)
        self._used.add(name)

    def _take_position(self, name: str) -> int:
        """Give the call asking for step ``name`` the next place in the sequence; on a
        replay, the step recorded there must be ``name`` (else :class:`Diverged`, before
        anything of this call runs or is recorded)."""
        place = self._next_position
        if self.ordered:
            there = self._name_at.get(place)
            elsewhere = self._position_of.get(name)
            if there is not None and there != name:
                self._diverge(place, there, name)
            if there is None and elsewhere is not None:
                self._diverge(
                    place, None, name, f"step {name!r} is recorded at position {elsewhere}"
                )
        self._next_position = place + 1
        self._call_position[name] = place
        return place

    def _diverge(
        self, position: int, recorded: str | None, asked: str | None, detail: str = ""
    ) -> None:
        """Stop the run: the code does not make the calls this job recorded."""
        error = NonDeterministic(self.job_id, position, recorded, asked, detail)
        self.diverged = error
        raise Diverged(error)

    def position_of(self, name: str) -> int | None:
        """The place of the call that asked for step ``name`` in this run (0 first), or
        ``None`` if none did (yet)."""
        return self._call_position.get(name)

    def check_all_asked(self) -> None:
        """At the handler's return: a recorded step it never asked for means the code no
        longer makes the calls this job recorded (:class:`Diverged`)."""
        if self.diverged is not None:
            raise Diverged(self.diverged)
        if not self.ordered:
            return
        unasked = sorted(place for place in self._name_at if place >= self._next_position)
        if unasked:
            place = unasked[0]
            self._diverge(place, self._name_at[place], None)

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
            place = f"position:{self._next_position}"
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
        if change_id in self._patches:
            return self._patches[change_id]
        marker = PATCH_PREFIX + change_id
        self._storable_name(marker, "patch marker")
        place = self._next_position
        if not self.ordered:
            # Recorded before positions existed: this job cannot tell, so keeps the old code.
            new = marker in self._recorded
        elif self._name_at.get(place) == marker:
            new = True
        elif marker in self._position_of:
            self._diverge(
                place,
                self._name_at.get(place),
                marker,
                f"marker {marker!r} is recorded at position {self._position_of[marker]}",
            )
        else:
            new = not any(recorded >= place for recorded in self._name_at)
        self._patches[change_id] = new
        if not new:
            return False
        self._use(marker)
        if marker in self._recorded:
            self.replayed_steps.append(marker)
            return True
        self.check_lease()
        pending = self.store.ownership.pending_step(marker, {"patch": change_id}, place)
        with self._pending_lock:
            self._pending.append(pending)  # recorded with the job's next write
        self._recorded[marker] = pending.output
        self.ran_steps.append(marker)
        return True

    def deprecate_patch(self, change_id: str) -> None:
        """The patch ``change_id`` once no job that predates it remains: the old code is
        gone and this call stands where ``if ctx.patched(change_id):`` stood. A job that
        recorded the marker here walks past it; any other records nothing."""
        self._storable_name(change_id, "patch change id")
        if change_id in self._patches:
            return
        self._patches[change_id] = True
        marker = PATCH_PREFIX + change_id
        if self.ordered and self._name_at.get(self._next_position) == marker:
            self._use(marker)
            self.replayed_steps.append(marker)
        elif not self.ordered and marker in self._recorded:
            self._used.add(marker)
            self.replayed_steps.append(marker)

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
        with self._progress_lock:
            self._progress = value
            self._progress_unwritten = True
            written = self._progress_written_at
            due = written is None or time.monotonic() - written >= self.progress_interval
        if due:
            self.flush_progress()
        elif self._heartbeat is not None:
            # Held: the heartbeat's thread writes it once its second is up, should the
            # handler make no further call or step meanwhile (a long call after a burst).
            self._heartbeat.flush_later(self._progress_key, self._flush_progress_when_due)

    def _flush_progress_when_due(self) -> None:
        """From the heartbeat's thread: write a held value once :attr:`progress_interval`
        has passed since the last write (until then, ask to be called again)."""
        if self._lost.is_set():
            return  # the run is over for this owner: its next step (or outcome) says why
        with self._progress_lock:
            if not self._progress_unwritten:
                return
            written = self._progress_written_at
            waiting = written is not None and time.monotonic() - written < self.progress_interval
        if waiting:
            if self._heartbeat is not None:
                self._heartbeat.flush_later(self._progress_key, self._flush_progress_when_due)
            return
        self.flush_progress()

    @property
    def last_progress(self) -> dict[str, Any] | None:
        """The latest progress reported (``{"done", "total", "message"}``), written or not;
        ``None`` when none was."""
        return self._progress

    def flush_progress(self) -> None:
        """Write the latest progress now if the row does not have it yet (the end of a
        step, the run's outcome, or a :meth:`progress` call due for a write). A write the
        fence refuses raises :class:`LeaseLost` (and the handler stops); one a database
        error stops is logged and tried again at the next chance."""
        with self._progress_lock:
            if not self._progress_unwritten or self._progress is None:
                return
            try:
                self.store.ownership.record_progress(self.claim, self._progress)
            except LeaseLost as lost:
                self._progress_unwritten = False
                self.lease_lost(lost)
                raise
            except Exception as err:  # an outage: progress is advisory, never the job's end
                log.warning("job %s: progress not written (%s); will try again", self.job_id, err)
            else:
                self._progress_unwritten = False
            self._progress_written_at = time.monotonic()

    def take_pending(self) -> list[PendingStep]:
        """The steps that ran but are not recorded yet, handed to the write that records
        them (the runner's outcome); the context forgets them. Waits for a write of them
        the heartbeat may have in flight. The latest progress is written first, if the row
        does not have it yet."""
        self.flush_progress()
        if self._heartbeat is not None:
            self._heartbeat.cancel_flush(self._progress_key)
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
        place = self._call_position[name]
        if atomic:
            return self._atomic_step(name, place, timeout, fn, args, kwargs)
        output = self._run_function(name, place, timeout, fn, args, kwargs)
        self.check_lease()
        try:
            pending = self.store.ownership.pending_step(name, output, place, self._progress)
        except InvalidInput as err:
            raise Unstorable(str(err)) from None
        self.flush_progress()  # the step ended: the row gets the latest progress
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

    def _atomic_step(
        self,
        name: str,
        place: int,
        timeout: float | None,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> T:
        """:meth:`step` with ``atomic=True``, once the earlier steps are recorded: ``fn`` and
        the step's record in one transaction (:class:`jobs._store.atomic_steps.AtomicSteps`),
        never held for the job's next write."""
        if self._running is not None:
            raise StepError(
                f"job {self.job_id!r}: atomic step {name!r} inside step "
                f"{self._running[0]!r}: an atomic step cannot run inside another step's function"
            )

        def call(leading: tuple[Any, ...]) -> PendingStep:
            output = self._run_function(name, place, timeout, fn, (*leading, *args), kwargs)
            self.check_lease()  # inside the transaction: a lost lease rolls it back
            try:
                return self.store.ownership.pending_step(name, output, place, self._progress)
            except InvalidInput as err:
                raise Unstorable(str(err)) from None

        try:
            pending = self.store.atomic.run(
                self.claim,
                call,
                lease_seconds=None if self.hold is None else self.hold.lease_seconds,
                opener=None if self.registry is None else self.registry.step_transactions,
            )
        except LeaseLost as lost:  # refused by the fence: rolled back, the handler stops
            self.lease_lost(lost)
            raise
        self.flush_progress()
        self._recorded[name] = pending.output
        self.ran_steps.append(name)
        result: T = json.loads(pending.text)
        return result

    def _run_function(
        self,
        name: str,
        place: int,
        timeout: float | None,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> T:
        """Call step ``name``'s function (at ``place``), in its span when tracing is on."""
        self._running = (name, place)
        try:
            if tracing.ENABLED:
                with tracing.step_span(name):
                    return self._call_step(name, timeout, fn, *args, **kwargs)
            return self._call_step(name, timeout, fn, *args, **kwargs)
        finally:
            self._running = None

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
        raise WaitingForApproval(reason, name, timeout, self._call_position[name])

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
        wake_at = self.store.reads.now() + dt.timedelta(seconds=span)
        raise Sleeping(name, wake_at, self._call_position[name])

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
            raise Sleeping(name, wake_at, self._call_position[name])

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
