"""The values the store hands out: frozen snapshots of rows, so nothing outside the store
can write through them."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Row

from jobs.core.states import State


@dataclasses.dataclass(frozen=True)
class Job:
    """A job as the database holds it (``jobs.get``): state, inputs, result, owner, lease,
    fence, attempts, due time, priority and instants, all on the database's clock."""

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
    dispatched_at: dt.datetime | None
    code_version: str | None
    waiting_for: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None

    @classmethod
    def from_row(cls, row: Row[Any]) -> Job:
        """The snapshot of a row read or returned with :data:`jobs.core.reader.JOB_COLUMNS`."""
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
            dispatched_at=row.dispatched_at,
            code_version=row.code_version,
            waiting_for=row.waiting_for,
            created_at=row.created_at,
            updated_at=row.updated_at,
            finished_at=row.finished_at,
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

    @property
    def job_id(self) -> str:
        """The claimed job's ID."""
        return self.job.id

    @classmethod
    def from_row(cls, row: Row[Any], owner: str, max_running: int | None = None) -> Claim:
        """The claim a claiming UPDATE's RETURNING row proves (it carries ``has_steps``)."""
        job = Job.from_row(row)
        return cls(job, owner, job.fence, max_running, bool(row.has_steps))


@dataclasses.dataclass(frozen=True)
class PendingStep:
    """A step that ran and whose checked output waits to be recorded with the job's next
    write (the next step's start, or the run's outcome)."""

    name: str
    output: Any
    text: str  # the output as JSON text, as checked


@dataclasses.dataclass(frozen=True)
class KindLimits:
    """A kind's backpressure (``jobs.set_limits``): RUNNING and QUEUED caps, ``None`` = none."""

    kind: str
    max_running: int | None
    max_queued: int | None


@dataclasses.dataclass(frozen=True)
class Step:
    """A recorded step (``jobs.steps``): its output and which claim recorded it."""

    name: str
    output: Any
    recorded_at: dt.datetime
    owner: str
    fence: int


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
    """A doorbell to ring: the job's ID and the priority its message carries."""

    job_id: str
    priority: int = 0


def by_priority(doorbells: Sequence[Doorbell]) -> list[tuple[int, list[str]]]:
    """``(priority, job ids)`` batches, the highest priority first, each keeping the order
    it was given (a publisher sends one priority per batch)."""
    batches: dict[int, list[str]] = {}
    for doorbell in doorbells:
        batches.setdefault(doorbell.priority, []).append(doorbell.job_id)
    return sorted(batches.items(), key=lambda batch: -batch[0])


Publish = Callable[[Sequence[str], int], bool]
"""How the sweeper rings: ``publish(job_ids, priority)`` sends one batch of doorbells of one
priority after their QUEUED state committed, and says whether it could."""
