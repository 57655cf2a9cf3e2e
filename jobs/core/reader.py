"""Reads of the job tables. Kept apart from :mod:`jobs.core.store` so that the package
that changes state holds nothing else; reads take no write lock (plain ``BEGIN`` on
SQLite) and never change a row."""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, Row, func, or_, select

from jobs.core.clock import Clock, DatabaseClock
from jobs.core.db import READ_ONLY
from jobs.core.errors import InvalidInput, UnknownJob
from jobs.core.models import (
    CountersTable,
    JobsTable,
    KindLimitsTable,
    SchedulesTable,
    StepsTable,
    TransitionsTable,
)
from jobs.core.page_reads import PageReads
from jobs.core.records import Doorbell, Job, JobFilter, KindLimits, Selected, Step, Transition
from jobs.core.schedule import Schedule
from jobs.core.states import TERMINAL, State

JOB_COLUMNS = tuple(JobsTable.__table__.c)
SCHEDULE_COLUMNS = tuple(SchedulesTable.__table__.c)


class JobReader(PageReads):
    """Reads over one engine and one clock; :class:`jobs.core.store.JobStore` composes one
    (``store.reads``), exposes its reads and adds the writes. The paged reads of one job's
    rows (:class:`jobs.core.page_reads.PageReads`) are used through ``store.reads``."""

    def __init__(
        self, engine: Engine, clock: Clock | None = None, max_payload_bytes: int = 1_048_576
    ) -> None:
        self.engine = engine
        self.clock: Clock = clock or DatabaseClock()
        self.max_payload_bytes = max_payload_bytes

    def now(self) -> dt.datetime:
        """The clock's current instant, as the database sees it."""
        with self._read() as conn:
            instant: dt.datetime = conn.execute(select(self.clock.now())).scalar_one()
        return instant

    def get(self, job_id: str) -> Job:
        """The job ``job_id``; raises :class:`UnknownJob`."""
        with self._read() as conn:
            row = conn.execute(select(*JOB_COLUMNS).where(JobsTable.id == job_id)).one_or_none()
        if row is None:
            raise UnknownJob(job_id)
        return Job.from_row(row)

    def children(self, parent_id: str) -> list[Job]:
        """The children a job spawned (``ctx.spawn``/``ctx.map``), oldest first."""
        with self._read() as conn:
            rows = conn.execute(
                select(*JOB_COLUMNS)
                .where(JobsTable.parent_id == parent_id)
                .order_by(JobsTable.created_at, JobsTable.id)
            ).all()
        return [Job.from_row(row) for row in rows]

    def jobs_by_id(self, job_ids: Sequence[str]) -> list[Job]:
        """The jobs ``job_ids`` that exist, in the order given (one read)."""
        with self._read() as conn:
            rows = {
                row.id: row
                for row in conn.execute(
                    select(*JOB_COLUMNS).where(JobsTable.id.in_(list(job_ids)))
                ).all()
            }
        return [Job.from_row(rows[job_id]) for job_id in job_ids if job_id in rows]

    def steps(self, job_id: str) -> list[Step]:
        """The job's recorded steps, oldest first."""
        with self._read() as conn:
            rows = conn.execute(
                select(
                    StepsTable.name,
                    StepsTable.output,
                    StepsTable.recorded_at,
                    StepsTable.owner,
                    StepsTable.fence,
                )
                .where(StepsTable.job_id == job_id)
                .order_by(StepsTable.recorded_at, StepsTable.name)
            ).all()
        return [Step(r.name, r.output, r.recorded_at, r.owner, r.fence) for r in rows]

    def history(self, job_id: str) -> list[Transition]:
        """The job's state changes, oldest first."""
        with self._read() as conn:
            rows = conn.execute(
                select(
                    TransitionsTable.from_state,
                    TransitionsTable.to_state,
                    TransitionsTable.at,
                    TransitionsTable.owner,
                    TransitionsTable.fence,
                    TransitionsTable.reason,
                    TransitionsTable.approved_by,
                )
                .where(TransitionsTable.job_id == job_id)
                .order_by(TransitionsTable.id)
            ).all()
        return [
            Transition(
                State(r.from_state) if r.from_state else None,
                State(r.to_state),
                r.at,
                r.owner,
                r.fence,
                r.reason,
                r.approved_by,
            )
            for r in rows
        ]

    def counts(self) -> dict[tuple[str, str], int]:
        """Number of jobs by (kind, state)."""
        return without_priority(self.counts_by_priority())

    def counts_by_priority(self) -> dict[tuple[str, str, int], int]:
        """Number of jobs by (kind, state, priority): :meth:`counts` one level finer, from
        the same one grouped read (priorities are 0 to 9, so at most ten times the rows)."""
        with self._read() as conn:
            rows = conn.execute(
                select(
                    JobsTable.kind, JobsTable.state, JobsTable.priority, func.count().label("jobs")
                ).group_by(JobsTable.kind, JobsTable.state, JobsTable.priority)
            ).all()
        return {(row.kind, row.state, int(row.priority)): int(row.jobs) for row in rows}

    def queued_by_queue(self) -> dict[str | None, int]:
        """Number of QUEUED jobs (due or not) by the queue their doorbells go to (``None``:
        the default queue, ``JOBS_QUEUE``)."""
        with self._read() as conn:
            rows = conn.execute(
                select(JobsTable.queue, func.count().label("jobs"))
                .where(JobsTable.state == State.QUEUED.value)
                .group_by(JobsTable.queue)
            ).all()
        return {row.queue: int(row.jobs) for row in rows}

    def not_due(self) -> dict[str, int]:
        """QUEUED jobs not due yet by kind: sleeping on a timer, delayed, or backing off."""
        with self._read() as conn:
            rows = conn.execute(
                select(JobsTable.kind, func.count().label("jobs"))
                .where(
                    JobsTable.state == State.QUEUED.value, JobsTable.run_after > self.clock.now()
                )
                .group_by(JobsTable.kind)
            ).all()
        return {row.kind: int(row.jobs) for row in rows}

    def oldest_queued(self) -> tuple[str, float] | None:
        """(job id, seconds since it became due) of the longest-waiting due QUEUED job."""
        now = self.clock.now()
        with self._read() as conn:
            row = conn.execute(
                select(JobsTable.id, JobsTable.run_after, now.label("now"))
                .where(JobsTable.state == State.QUEUED.value, JobsTable.run_after <= now)
                .order_by(JobsTable.run_after)
                .limit(1)
            ).one_or_none()
        if row is None:
            return None
        return row.id, max(0.0, (row.now - row.run_after).total_seconds())

    def stale_doorbells(self, stale_seconds: float) -> int:
        """Due QUEUED jobs whose doorbell went out more than ``stale_seconds`` ago and that
        no worker claimed since: lost messages, or messages waiting behind a backlog."""
        now = self.clock.now()
        with self._read() as conn:
            count: int = conn.execute(
                select(func.count())
                .select_from(JobsTable)
                .where(
                    JobsTable.state == State.QUEUED.value,
                    JobsTable.run_after <= now,
                    JobsTable.dispatched_at <= self.clock.after(-stale_seconds),
                )
            ).scalar_one()
        return count

    def limits(self) -> dict[str, KindLimits]:
        """Every kind's limits row, by kind."""
        with self._read() as conn:
            rows = conn.execute(
                select(
                    KindLimitsTable.kind, KindLimitsTable.max_running, KindLimitsTable.max_queued
                )
            ).all()
        return {row.kind: KindLimits(row.kind, row.max_running, row.max_queued) for row in rows}

    def next_due(self, kind: str, limit: int = 1) -> list[str]:
        """The due QUEUED jobs of a kind that get the next slot a finished job frees: the
        highest priority first, then the oldest."""
        return [doorbell.job_id for doorbell in self.next_due_doorbells(kind, limit)]

    def next_due_doorbells(self, kind: str, limit: int = 1) -> list[Doorbell]:
        """:meth:`next_due` with each job's priority, for the doorbell that passes a slot on."""
        with self._read() as conn:
            rows = conn.execute(
                select(JobsTable.id, JobsTable.priority, JobsTable.kind, JobsTable.queue)
                .where(
                    JobsTable.kind == kind,
                    JobsTable.state == State.QUEUED.value,
                    JobsTable.run_after <= self.clock.now(),
                )
                .order_by(JobsTable.priority.desc(), JobsTable.run_after, JobsTable.created_at)
                .limit(limit)
            ).all()
        return [Doorbell(row.id, row.priority, row.kind, row.queue) for row in rows]

    def running_with_liveness(self) -> list[tuple[str, str, int, int]]:
        """(job id, owner, fence, liveness key) of RUNNING jobs whose owner took a liveness
        lock, for the sweeper to compare with the locks still held."""
        with self._read() as conn:
            rows = conn.execute(
                select(
                    JobsTable.id, JobsTable.owner, JobsTable.fence, JobsTable.liveness_key
                ).where(JobsTable.state == State.RUNNING.value, JobsTable.liveness_key.is_not(None))
            ).all()
        return [(row.id, row.owner or "", row.fence, row.liveness_key or 0) for row in rows]

    def _read(self) -> Connection:
        return self.engine.connect().execution_options(**{READ_ONLY: True})

    def _conditions(self, where: JobFilter) -> builtins.list[ColumnElement[bool]]:
        return filtered(where)

    def list(
        self,
        state: State | None = None,
        kind: str | None = None,
        limit: int = 100,
        *,
        where: JobFilter | None = None,
    ) -> list[Job]:
        """The newest ``limit`` jobs, optionally of one state and one kind, or as ``where``
        filters them (``since``, ``error_like`` too)."""
        chosen = where if where is not None else JobFilter(state=state, kind=kind)
        stmt = (
            select(*JOB_COLUMNS)
            .where(*filtered(chosen))
            .order_by(JobsTable.created_at.desc(), JobsTable.id)
            .limit(limit)
        )
        with self._read() as conn:
            return [Job.from_row(r) for r in conn.execute(stmt)]

    def select_jobs(
        self, where: JobFilter, limit: int, among: Sequence[State] | None = None
    ) -> tuple[int, builtins.list[Selected]]:
        """For a bulk action: how many jobs ``where`` matches (and, given ``among``, are in
        one of those states: the ones the action applies to), and the oldest ``limit`` of
        them, each with the state and fence it is in now (the bulk write's condition)."""
        conditions = filtered(where)
        if among is not None:
            conditions.append(JobsTable.state.in_([state.value for state in among]))
        with self._read() as conn:
            count: int = conn.execute(
                select(func.count()).select_from(JobsTable).where(*conditions)
            ).scalar_one()
            rows = conn.execute(
                select(JobsTable.id, JobsTable.state, JobsTable.fence)
                .where(*conditions)
                .order_by(JobsTable.created_at, JobsTable.id)
                .limit(limit)
            ).all()
        return count, [Selected(row.id, State(row.state), row.fence) for row in rows]

    # == time and operations: schedules, retention, counters, explain =====================

    def schedules(self) -> builtins.list[Schedule]:
        """Every periodic schedule, by name."""
        with self._read() as conn:
            rows = conn.execute(select(*SCHEDULE_COLUMNS).order_by(SchedulesTable.name)).all()
            return [_schedule_of(row) for row in rows]

    def schedule(self, name: str) -> Schedule:
        """One schedule by name; :class:`InvalidInput` names the known ones if it is unknown."""
        with self._read() as conn:
            row = conn.execute(
                select(*SCHEDULE_COLUMNS).where(SchedulesTable.name == name)
            ).one_or_none()
            if row is not None:
                return _schedule_of(row)
        known = ", ".join(s.name for s in self.schedules()) or "none"
        raise InvalidInput(f"unknown schedule {name!r} (known: {known})")

    def count_prunable(self, older_than_seconds: float) -> int:
        """How many finished jobs retention would delete now (``jobctl prune --dry-run``)."""
        with self._read() as conn:
            count: int = conn.execute(
                select(func.count())
                .select_from(JobsTable)
                .where(
                    JobsTable.state.in_([state.value for state in TERMINAL]),
                    JobsTable.finished_at < self.clock.after(-older_than_seconds),
                )
            ).scalar_one()
        return count

    def counters(self) -> dict[tuple[str, str], int]:
        """Operational counters by (name, kind): monotonic, never pruned."""
        with self._read() as conn:
            rows = conn.execute(
                select(CountersTable.name, CountersTable.kind, CountersTable.value)
            ).all()
        return {(row.name, row.kind): int(row.value) for row in rows}

    def awaiting_ring_again(self, stale_seconds: float) -> dict[str, str]:
        """{job id: kind} of due QUEUED jobs whose message was sent more than
        ``stale_seconds`` ago and never claimed: the next sweep counts them as lost."""
        with self._read() as conn:
            rows = conn.execute(
                select(JobsTable.id, JobsTable.kind).where(
                    JobsTable.state == State.QUEUED.value,
                    JobsTable.run_after <= self.clock.now(),
                    JobsTable.dispatched_at <= self.clock.after(-stale_seconds),
                )
            ).all()
        return {row.id: row.kind for row in rows}

    def steps_recorded_by(self, job_id: str, owner: str, fence: int, names: Sequence[str]) -> bool:
        """Whether every step of ``names`` is recorded for the job by the owner of claim
        ``fence``: a record whose acknowledgement was lost had landed (a name is recorded
        once, so the owner's own write is the only one that can match)."""
        wanted = set(names)
        with self._read() as conn:
            found = conn.execute(
                select(StepsTable.name).where(
                    StepsTable.job_id == job_id,
                    StepsTable.owner == owner,
                    StepsTable.fence == fence,
                    StepsTable.name.in_(sorted(wanted)),
                )
            ).scalars()
            return set(found) == wanted

    def moved_by(self, job_id: str, owner: str, fence: int) -> Job | None:
        """The job, if the owner of claim ``fence`` has moved it out of RUNNING (the history
        row of its outcome, a park or a hand-back: one per claim); else ``None``. A move
        whose acknowledgement was lost had landed when this finds it."""
        with self._read() as conn:
            moved = conn.execute(
                select(TransitionsTable.id)
                .where(
                    TransitionsTable.job_id == job_id,
                    TransitionsTable.from_state == State.RUNNING.value,
                    TransitionsTable.to_state != State.RUNNING.value,
                    TransitionsTable.owner == owner,
                    TransitionsTable.fence == fence,
                )
                .limit(1)
            ).first()
        return None if moved is None else self.get(job_id)

    def liveness_key_of(self, job_id: str) -> int | None:
        """The liveness key the job's current owner took (None if not RUNNING or none)."""
        with self._read() as conn:
            key: int | None = conn.execute(
                select(JobsTable.liveness_key).where(JobsTable.id == job_id)
            ).scalar_one_or_none()
        return key

    def leases_ending(self, within_seconds: float) -> builtins.list[tuple[str, bool, int]]:
        """(kind, already expired, count) of RUNNING jobs whose lease ends within
        ``within_seconds`` (or has ended) on the database clock."""
        now = self.clock.now()
        expired = JobsTable.lease_until <= now
        with self._read() as conn:
            rows = conn.execute(
                select(JobsTable.kind, expired.label("expired"), func.count().label("jobs"))
                .where(
                    JobsTable.state == State.RUNNING.value,
                    JobsTable.lease_until <= self.clock.after(within_seconds),
                )
                .group_by(JobsTable.kind, expired)
            ).all()
        return [(row.kind, bool(row.expired), int(row.jobs)) for row in rows]

    def moves_after(
        self, after_id: int | None, limit: int = 20_000
    ) -> tuple[builtins.list[Move], int]:
        """The history rows after ``after_id`` that end a run or start one, oldest first,
        each with its job's kind and the instant of the claim that began the run; and the
        watermark to pass next time. ``after_id=None`` returns no rows, only the current
        watermark (an exporter starts counting from its start)."""
        claim = TransitionsTable.__table__.alias("claimed")
        started = (
            select(func.max(claim.c.at))
            .where(
                claim.c.job_id == TransitionsTable.job_id,
                claim.c.to_state == State.RUNNING.value,
                claim.c.id < TransitionsTable.id,
            )
            .scalar_subquery()
        )
        with self._read() as conn:
            newest = int(conn.execute(select(func.max(TransitionsTable.id))).scalar() or 0)
            if after_id is None:
                return [], newest
            rows = conn.execute(
                select(
                    TransitionsTable.id,
                    TransitionsTable.from_state,
                    TransitionsTable.to_state,
                    TransitionsTable.at,
                    JobsTable.kind,
                    started.label("started"),
                )
                .join(JobsTable, JobsTable.id == TransitionsTable.job_id)
                .where(
                    TransitionsTable.id > after_id,
                    TransitionsTable.id <= newest,
                    TransitionsTable.to_state.in_(
                        [State.COMPLETED.value, State.FAILED.value, State.RUNNING.value]
                    ),
                )
                .order_by(TransitionsTable.id)
                .limit(limit)
            ).all()
        moves = [
            Move(
                kind=row.kind,
                from_state=State(row.from_state) if row.from_state else None,
                to_state=State(row.to_state),
                at=row.at,
                run_started_at=row.started,
            )
            for row in rows
        ]
        return moves, (rows[-1].id if len(rows) == limit else newest)

    def steps_after(
        self, after: dt.datetime | None, limit: int = 20_000
    ) -> tuple[builtins.list[StepTiming], dt.datetime]:
        """Steps recorded after ``after`` by a run (not approvals), oldest first, each with
        the instant its run's claim or previous step ended; and the watermark to pass next
        time (``after=None``: only the watermark). A step recorded at the very instant of the
        watermark by a transaction that committed later is missed: metrics, not ledger."""
        previous = StepsTable.__table__.alias("previous")
        claim = TransitionsTable.__table__.alias("claimed")
        prior_step = (
            select(func.max(previous.c.recorded_at))
            .where(
                previous.c.job_id == StepsTable.job_id,
                previous.c.fence == StepsTable.fence,
                previous.c.recorded_at < StepsTable.recorded_at,
            )
            .scalar_subquery()
        )
        claimed_at = (
            select(func.max(claim.c.at))
            .where(
                claim.c.job_id == StepsTable.job_id,
                claim.c.fence == StepsTable.fence,
                claim.c.owner == StepsTable.owner,  # an approval's record has no run behind it
                claim.c.to_state == State.RUNNING.value,
            )
            .scalar_subquery()
        )
        with self._read() as conn:
            if after is None:
                latest = conn.execute(select(func.max(StepsTable.recorded_at))).scalar()
                return [], latest or dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
            rows = conn.execute(
                select(
                    StepsTable.recorded_at,
                    JobsTable.kind,
                    prior_step.label("prior_step"),
                    claimed_at.label("claimed_at"),
                )
                .join(JobsTable, JobsTable.id == StepsTable.job_id)
                .where(StepsTable.recorded_at > after)
                .order_by(StepsTable.recorded_at)
                .limit(limit)
            ).all()
        timings = [
            StepTiming(
                kind=row.kind,
                recorded_at=row.recorded_at,
                began_at=max(row.claimed_at, row.prior_step) if row.prior_step else row.claimed_at,
            )
            for row in rows
            if row.claimed_at is not None
        ]
        return timings, (rows[-1].recorded_at if rows else after)


@dataclasses.dataclass(frozen=True)
class Move:
    """A history row that starts or ends a run, as the metrics see it."""

    kind: str
    from_state: State | None
    to_state: State
    at: dt.datetime
    run_started_at: dt.datetime | None


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """A recorded step and when its run's claim or previous step ended."""

    kind: str
    recorded_at: dt.datetime
    began_at: dt.datetime


def filtered(where: JobFilter) -> builtins.list[ColumnElement[bool]]:
    """The WHERE conditions of a :class:`JobFilter`."""
    conditions: builtins.list[ColumnElement[bool]] = []
    if where.state is not None:
        conditions.append(JobsTable.state == where.state.value)
    if where.kind is not None:
        conditions.append(JobsTable.kind == where.kind)
    if where.since is not None:
        conditions.append(JobsTable.updated_at >= where.since)
    if where.error_like is not None:
        conditions.append(JobsTable.last_error.ilike(contains(where.error_like), escape="\\"))
    if where.queue is not None:
        named = JobsTable.queue == where.queue
        if where.queue == where.default_queue:  # a job that names no queue goes there too
            named = or_(named, JobsTable.queue.is_(None))
        conditions.append(named)
    return conditions


def contains(text: str) -> str:
    """A ``LIKE`` pattern (with ``ESCAPE '\\'``) matching ``text`` anywhere, literally: its
    ``%``, ``_`` and ``\\`` escaped, so they mean the same on SQLite and PostgreSQL."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def without_priority(by_priority: dict[tuple[str, str, int], int]) -> dict[tuple[str, str], int]:
    """:meth:`JobReader.counts_by_priority` summed over the priorities: by (kind, state)."""
    totals: dict[tuple[str, str], int] = {}
    for (kind, state, _priority), jobs in by_priority.items():
        totals[kind, state] = totals.get((kind, state), 0) + jobs
    return totals


def _schedule_of(row: Row[Any]) -> Schedule:
    return Schedule(
        name=row.name,
        kind=row.kind,
        spec=row.spec,
        timezone=row.timezone,
        inputs=dict(row.inputs),
        catch_up=row.catch_up,
        source=row.source,
        last_tick=row.last_tick,
        created_at=row.created_at,
    )
