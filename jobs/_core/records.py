"""The values the store hands out: frozen snapshots of rows, so nothing outside the store
can write through them."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from jobs._core.states import State
from jobs._core.validate import (
    NAME_LENGTH,
    QUEUE_NAME_LENGTH,
    check_error_pattern,
    check_text,
    printable,
)

if TYPE_CHECKING:  # annotations only: the records load no database library
    from sqlalchemy import Row

    from jobs._core.rate_syntax import RateLimit


@dataclasses.dataclass(frozen=True)
class Job:
    """A job as the database holds it (``jobs.get``): state, inputs, result, owner, lease,
    fence, attempts, due time, priority, queue (``None``: ``JOBS_QUEUE``) and instants, all
    on the database's clock; ``trace_context``, the W3C trace context of its submit
    (docs/guides/tracing.md), or None."""

    id: str
    kind: str
    state: State
    inputs: dict[str, Any]
    result: Any
    last_error: str | None
    owner: str | None
    fence: int
    lease_until: dt.datetime | None
    attempts: int
    max_attempts: int
    run_after: dt.datetime
    priority: int
    queue: str | None
    dispatched_at: dt.datetime | None
    code_version: str | None
    waiting_for: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None
    # Workflows: the job's parent (``ctx.spawn``/``ctx.map``), how many awaited children
    # are unfinished while it is WAITING, the event it waits for, and when the wait ends.
    parent_id: str | None = None
    children_pending: int = 0
    wait_event: str | None = None
    wait_deadline: dt.datetime | None = None
    # The trace context the job was submitted in (jobs._core.tracing), or None.
    trace_context: dict[str, str] | None = None
    # A long job's latest ``ctx.progress``: ``{"done", "total", "message"}`` or ``None``.
    progress: dict[str, Any] | None = None
    # Its concurrency key (``@jobs.job(concurrency_key=…)``), or None: no per-key limit.
    concurrency_key: str | None = None

    @classmethod
    def from_row(cls, row: Row[Any]) -> Job:
        """The snapshot of a row read or returned with :data:`jobs._store.reader.JOB_COLUMNS`."""
        return cls(
            id=row.id,
            kind=row.kind,
            state=State(row.state),
            inputs=row.inputs,
            result=row.result,
            last_error=row.last_error,
            owner=row.owner,
            fence=row.fence,
            lease_until=row.lease_until,
            attempts=row.attempts,
            max_attempts=row.max_attempts,
            run_after=row.run_after,
            priority=row.priority,
            queue=row.queue,
            dispatched_at=row.dispatched_at,
            code_version=row.code_version,
            waiting_for=row.waiting_for,
            created_at=row.created_at,
            updated_at=row.updated_at,
            finished_at=row.finished_at,
            parent_id=row.parent_id,
            children_pending=row.children_pending,
            wait_event=row.wait_event,
            wait_deadline=row.wait_deadline,
            trace_context=row.trace_context,
            progress=row.progress,
            concurrency_key=row.concurrency_key,
        )


@dataclasses.dataclass(frozen=True)
class Claim:
    """Proof of ownership: every fenced write names the owner and the fence it claimed with."""

    job: Job
    owner: str
    fence: int
    # The kind's running limit as the claim saw it under its lock (None: unlimited), so
    # whoever ends the run knows whether a slot was freed without reading the limits again.
    max_running: int | None = None
    # Whether the job had recorded steps when claimed: a first run has none to read.
    has_steps: bool = True
    # The per-key running limit the claim enforced for the job's concurrency key (None:
    # none), so the run's end rings the next job of that key for the slot it frees.
    max_running_per_key: int | None = None
    # The rate buckets the claim took a start of, as it read them under its lock: (its key
    # in job_rate_starts, "" for the kind's own rate or the job's concurrency key for the
    # per-key rate; the rate). Empty: no rate. The next job each holds is rung to wait for
    # the next start, without reading the limits again.
    rate_buckets: tuple[tuple[str, RateLimit], ...] = ()

    @property
    def job_id(self) -> str:
        """The claimed job's ID."""
        return self.job.id

    @classmethod
    def from_row(
        cls,
        row: Row[Any],
        owner: str,
        max_running: int | None = None,
        max_running_per_key: int | None = None,
        rate_buckets: Sequence[tuple[str, RateLimit]] = (),
    ) -> Claim:
        """The claim a claiming UPDATE's RETURNING row proves (it carries ``has_steps``)."""
        job = Job.from_row(row)
        return cls(
            job,
            owner,
            job.fence,
            max_running,
            bool(row.has_steps),
            max_running_per_key,
            tuple(rate_buckets),
        )


@dataclasses.dataclass(frozen=True)
class PendingStep:
    """A step that ran and whose checked output waits to be recorded with the job's next
    write (the next step's start, or the run's outcome)."""

    name: str
    output: Any
    text: str  # the output as JSON text, as checked
    # The call's place in the handler's sequence of calls (``job_steps.position``); None
    # records none (a step of a job recorded before positions existed).
    position: int | None = None
    # The job's progress when the step ended (``ctx.progress``), kept in its record.
    progress: dict[str, Any] | None = None


class StepTransaction(NamedTuple):
    """An atomic step's transaction (``ctx.step(..., atomic=True)``) as it was opened: the
    SQLAlchemy ``Connection`` inside it, which the step's record is written on, and the
    arguments the step's function takes before its own (the connection itself for plain
    SQLAlchemy; none under Django or Flask-SQLAlchemy, whose ORM is in the transaction)."""

    connection: Any
    arguments: tuple[Any, ...]


StepTransactions = Callable[[str], contextlib.AbstractContextManager[StepTransaction]]
"""How a framework opens an atomic step's transaction on the jobs' database (its URL given):
a context manager that commits when its block ends and rolls back when it raises; it
raises :class:`jobs.StepError` when its own database is not the jobs' one
(``jobs.contrib.django``, ``jobs.contrib.flask``). The store's own engine when none is set."""


@dataclasses.dataclass(frozen=True)
class KindLimits:
    """A kind's backpressure (``jobs.set_limits``): RUNNING and QUEUED caps, and the RUNNING
    cap per concurrency key (``max_running_per_key``), and the rate limits of its starts in
    Celery's syntax (``rate_limit``: the kind's, ``rate_limit_per_key``: each key's);
    ``None`` = none."""

    kind: str
    max_running: int | None
    max_queued: int | None
    max_running_per_key: int | None = None
    rate_limit: str | None = None
    rate_limit_per_key: str | None = None


@dataclasses.dataclass(frozen=True)
class Pause:
    """A paused kind or queue (``jobctl pause``): no claim takes its jobs until resumed.
    ``scope`` is ``"kind"`` or ``"queue"``; ``default_queue``: the queue is ``JOBS_QUEUE``,
    so the pause holds the jobs that name no queue too."""

    scope: str
    name: str
    paused_at: dt.datetime
    paused_by: str | None = None
    reason: str | None = None
    default_queue: bool = False

    def describe(self) -> str:
        """``kind 'x' paused since <instant> by <who> (<reason>)``, for people."""
        by = f" by {printable(self.paused_by)}" if self.paused_by else ""
        why = f" ({printable(self.reason)})" if self.reason else ""
        since = self.paused_at.isoformat(timespec="seconds")
        return f"{self.scope} {printable(self.name)!r} paused since {since}{by}{why}"


@dataclasses.dataclass(frozen=True)
class Resumed:
    """What a resume did (``app.limits.resume``): the pause it lifted (``None``: there was
    none) and the IDs of the due jobs it held whose doorbells it rang."""

    pause: Pause | None
    rung: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Step:
    """A recorded step (``jobs.steps``): its output and which claim recorded it."""

    name: str
    output: Any
    recorded_at: dt.datetime
    owner: str
    fence: int
    # Its place in the handler's sequence of calls (0 first); None if recorded before
    # positions were (migration 0008).
    position: int | None = None
    # The job's progress when the step ended (``ctx.progress``); ``None``: none reported.
    progress: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Transition:
    """One line of a job's history (``jobs.history``): a state change, who made it, why."""

    from_state: State | None
    to_state: State
    at: dt.datetime
    owner: str | None
    fence: int | None
    reason: str | None
    approved_by: str | None


class Doorbell(NamedTuple):
    """A doorbell to ring: the job's ID, the priority its message carries, the job's kind
    (the task name its message carries, so Celery's tools show the kind) and its queue
    (``None``: the default queue)."""

    job_id: str
    priority: int = 0
    kind: str | None = None
    queue: str | None = None


def doorbell_of(job: Row[Any] | Job) -> Doorbell:
    """The doorbell that sends a job (a row or a snapshot) to its kind's queue."""
    return Doorbell(job.id, job.priority, job.kind, job.queue)


Ring = Callable[[Sequence[Doorbell]], object]
"""Rings doorbells of mixed priorities, kinds and queues whose jobs' QUEUED state has
committed (:meth:`jobs._worker.process.ProcessRuntime.ring` is one). A store write never
rings: it returns the doorbells it owes (:class:`Moved`), and its caller rings them after
the commit."""


@dataclasses.dataclass(frozen=True)
class Moved:
    """What a store write wrote, and the doorbells it owes: jobs it queued as a side effect
    (a child's finish that queued its waiting parent, a spawn's new children) and marked
    rung, for its caller to ring once the write has committed. A write whose caller does
    not ring leaves such jobs unrung instead, for the sweeper, and owes nothing."""

    job: Job
    doorbells: tuple[Doorbell, ...] = ()


@dataclasses.dataclass(frozen=True)
class JobFilter:
    """Which jobs ``jobctl list`` shows and a bulk action selects: of one ``state``, one
    ``kind``, changed (``updated_at``) at or after ``since``, whose last error contains
    ``error_like`` (a literal substring, case-insensitive: ``%``, ``_`` and ``\\`` match
    only themselves, on every backend; at most
    :data:`jobs._core.validate.ERROR_PATTERN_LENGTH` characters), and whose doorbells go to
    ``queue`` (a job that names no queue goes to ``default_queue``, ``JOBS_QUEUE``).
    ``None`` leaves a filter out."""

    state: State | None = None
    kind: str | None = None
    since: dt.datetime | None = None
    error_like: str | None = None
    queue: str | None = None
    default_queue: str | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.error_like is not None:
            check_error_pattern(self.error_like, "error_like")
        # A NUL reached PostgreSQL as a DataError (a 500 on Flower's ?kind=%00).
        if self.kind is not None:
            check_text(self.kind, "kind", NAME_LENGTH)
        if self.queue is not None:
            check_text(self.queue, "queue", QUEUE_NAME_LENGTH)

    @property
    def empty(self) -> bool:
        """No filter at all: every job (a bulk action refuses that)."""
        return self == JobFilter()

    def described(self) -> str:
        """The filters given, as options (``--kind sync --state FAILED``), for messages."""
        parts = []
        if self.kind is not None:
            parts.append(f"--kind {self.kind}")
        if self.state is not None:
            parts.append(f"--state {self.state.value}")
        if self.since is not None:
            parts.append(f"--since {self.since.isoformat(timespec='seconds')}")
        if self.error_like is not None:
            parts.append(f"--error-like {self.error_like!r}")
        if self.queue is not None:
            parts.append(f"--queue {self.queue}")
        return " ".join(parts) or "(no filter)"


class Selected(NamedTuple):
    """A job as an operator's selection saw it (``jobctl retry --kind K --state FAILED``):
    its ID, state and fence. A bulk write matches the job only while it is still in that
    state under that fence, so a job that moved on since the selection is skipped, never
    touched."""

    id: str
    state: State
    fence: int


class BulkOutcome(NamedTuple):
    """What one batch of a bulk action did: the jobs it changed, as they are now, and the
    IDs it skipped (they changed state since the selection, or the action does not apply
    to the state they were selected in)."""

    done: list[Job]
    skipped: list[str]


@dataclasses.dataclass(frozen=True)
class Batch:
    """Doorbells rung together, and the one set of parameters every ringer takes
    (:class:`RingBatch`, :class:`jobs._worker.process.DoorbellRinger`): the jobs' IDs and
    the one ``priority`` (0 to 9; a broker without priorities ignores it), ``kind`` (the
    task name the messages carry) and ``queue`` (``None``: the default) of their
    messages."""

    job_ids: tuple[str, ...]
    priority: int = 0
    kind: str | None = None
    queue: str | None = None

    @classmethod
    def of(cls, job: Row[Any] | Job) -> Batch:
        """The batch of one job (a row or a snapshot): its doorbell, to its kind's queue."""
        return cls((job.id,), job.priority, job.kind, job.queue)


def in_batches(doorbells: Sequence[Doorbell]) -> list[Batch]:
    """The doorbells grouped into batches of one priority, kind and queue, the highest
    priority first, each keeping the order it was given."""
    grouped: dict[tuple[int, str | None, str | None], list[str]] = {}
    for doorbell in doorbells:
        key = (doorbell.priority, doorbell.kind, doorbell.queue)
        grouped.setdefault(key, []).append(doorbell.job_id)
    ordered = sorted(grouped.items(), key=lambda item: -item[0][0])
    return [
        Batch(tuple(job_ids), priority, kind, queue) for (priority, kind, queue), job_ids in ordered
    ]


class RingBatch(Protocol):
    """Rings one batch of doorbells of one priority, kind and queue after their QUEUED
    state committed, and says whether it could: how the sweeper and the periodic ticks
    ring (:meth:`jobs._worker.process.ProcessRuntime.ring_batch` is one)."""

    def __call__(self, batch: Batch, /) -> bool: ...


def ring_in_batches(ring_batch: RingBatch, doorbells: Sequence[Doorbell]) -> list[str]:
    """Ring doorbells of mixed priorities, kinds and queues with ``ring_batch``, one batch
    per priority, kind and queue, the highest priority first; returns the IDs of the
    batches that went out."""
    return [
        job_id for batch in in_batches(doorbells) if ring_batch(batch) for job_id in batch.job_ids
    ]
