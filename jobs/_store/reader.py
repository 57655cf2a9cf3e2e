"""Reads of one job and of lists of jobs. Kept apart from :mod:`jobs._store` so that
the package that changes state holds nothing else; reads take no write lock (plain
``BEGIN`` on SQLite) and never change a row.

The store composes three readers, each over the same engine and clock:
:class:`JobReader` (``store.reads``: a job, its steps, history and children, lists,
selections for bulk actions, schedules, kinds' limits, and the checks of whether an
owner's write landed), :class:`jobs._store.depth_reads.DepthReads` (``store.depth``: how
many jobs are where, what is due or stale, and what moved since a watermark) and
:class:`jobs._store.page_reads.PageReads` (``store.pages``: a page at a time, bounded).
This module also holds what they share: the columns a row is read with, the WHERE
conditions of a :class:`JobFilter`, and the read-only connection."""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, Row, func, or_, select

from jobs._core.errors import InvalidInput, UnknownJob
from jobs._core.records import Job, JobFilter, KindLimits, Pause, Selected, Step, Transition
from jobs._core.schedule_ticks import Schedule
from jobs._core.states import State
from jobs._store.clock import Clock, DatabaseClock
from jobs._store.db import READ_ONLY
from jobs._store.pause_clauses import PAUSE_COLUMNS, pause_of
from jobs._store.tables import (
    JobsTable,
    KindLimitsTable,
    PausesTable,
    SchedulesTable,
    StepsTable,
    TransitionsTable,
)

JOB_COLUMNS = tuple(JobsTable.__table__.c)
SCHEDULE_COLUMNS = tuple(SchedulesTable.__table__.c)

#: The columns of a step read beside its name and its output (or a preview of it), and the
#: order steps are read in: the order they were recorded.
STEP_COLUMNS = (
    StepsTable.recorded_at,
    StepsTable.owner,
    StepsTable.fence,
    StepsTable.position,
    StepsTable.progress,
)
STEP_ORDER = (StepsTable.recorded_at, StepsTable.position, StepsTable.name)

#: The columns a :class:`Transition` is read from (:func:`transition_of` builds it).
TRANSITION_COLUMNS = (
    TransitionsTable.from_state,
    TransitionsTable.to_state,
    TransitionsTable.at,
    TransitionsTable.owner,
    TransitionsTable.fence,
    TransitionsTable.reason,
    TransitionsTable.approved_by,
)


def transition_of(row: Any) -> Transition:
    """The :class:`Transition` of a history row read with :data:`TRANSITION_COLUMNS`."""
    return Transition(
        State(row.from_state) if row.from_state else None,
        State(row.to_state),
        row.at,
        row.owner,
        row.fence,
        row.reason,
        row.approved_by,
    )


def read_only(engine: Engine) -> Connection:
    """A connection for reads: no write lock on SQLite (see :data:`jobs._store.db.READ_ONLY`)."""
    return engine.connect().execution_options(**{READ_ONLY: True})


class JobReader:
    """Reads of one job and of lists (``store.reads``), over one engine and one clock;
    :class:`jobs._store.JobStore` composes one beside its writers."""

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
                select(StepsTable.name, StepsTable.output, *STEP_COLUMNS)
                .where(StepsTable.job_id == job_id)
                .order_by(*STEP_ORDER)
            ).all()
        return [
            Step(
                row.name,
                row.output,
                row.recorded_at,
                row.owner,
                row.fence,
                position=row.position,
                progress=row.progress,
            )
            for row in rows
        ]

    def history(self, job_id: str) -> list[Transition]:
        """The job's state changes, oldest first."""
        with self._read() as conn:
            rows = conn.execute(
                select(*TRANSITION_COLUMNS)
                .where(TransitionsTable.job_id == job_id)
                .order_by(TransitionsTable.id)
            ).all()
        return [transition_of(row) for row in rows]

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

    def limits(self) -> dict[str, KindLimits]:
        """Every kind's limits row, by kind."""
        with self._read() as conn:
            rows = conn.execute(
                select(
                    KindLimitsTable.kind, KindLimitsTable.max_running, KindLimitsTable.max_queued
                )
            ).all()
        return {row.kind: KindLimits(row.kind, row.max_running, row.max_queued) for row in rows}

    def pauses(self) -> builtins.list[Pause]:
        """Every pause in force (``jobctl pause``), kinds first, then queues, by name."""
        with self._read() as conn:
            rows = conn.execute(
                select(*PAUSE_COLUMNS).order_by(PausesTable.scope, PausesTable.name)
            ).all()
        return [pause_of(row) for row in rows]

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

    def _read(self) -> Connection:
        return read_only(self.engine)


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


_SCHEDULE_FIELDS = tuple(field.name for field in dataclasses.fields(Schedule))


def _schedule_of(row: Row[Any]) -> Schedule:
    """The :class:`Schedule` of a row read with :data:`SCHEDULE_COLUMNS`: each field from
    the column of its name (the inputs a copy of their own)."""
    fields = {name: getattr(row, name) for name in _SCHEDULE_FIELDS}
    return Schedule(**{**fields, "inputs": dict(row.inputs)})
