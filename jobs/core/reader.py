"""Reads of the job tables. Kept apart from :mod:`jobs.core.store` so that the module
that changes state holds nothing else; reads take no write lock (plain ``BEGIN`` on
SQLite) and never change a row."""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
from typing import Any

from sqlalchemy import Connection, Engine, Row, func, select

from jobs.core.clock import Clock, DatabaseClock
from jobs.core.db import READ_ONLY
from jobs.core.errors import InvalidInput, UnknownJob
from jobs.core.models import (
    CounterRecord,
    JobRecord,
    KindLimitRecord,
    ScheduleRecord,
    StepRecord,
    TransitionRecord,
)
from jobs.core.records import Doorbell, Job, KindLimits, Step, Transition
from jobs.core.schedule import Schedule
from jobs.core.states import TERMINAL, State

J = JobRecord
L = KindLimitRecord
JOB_COLUMNS = tuple(J.__table__.c)
SCHEDULE_COLUMNS = tuple(ScheduleRecord.__table__.c)


class JobReader:
    """Reads over one engine and one clock; :class:`jobs.core.store.JobStore` adds the writes."""

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
        with self._read() as conn:
            row = conn.execute(select(*JOB_COLUMNS).where(J.id == job_id)).one_or_none()
        if row is None:
            raise UnknownJob(job_id)
        return Job.from_row(row)

    def steps(self, job_id: str) -> list[Step]:
        S = StepRecord.__table__.c
        with self._read() as conn:
            rows = conn.execute(
                select(S.name, S.output, S.recorded_at, S.owner, S.fence)
                .where(S.job_id == job_id)
                .order_by(S.recorded_at, S.name)
            ).all()
        return [Step(r.name, r.output, r.recorded_at, r.owner, r.fence) for r in rows]

    def history(self, job_id: str) -> list[Transition]:
        T = TransitionRecord.__table__.c
        with self._read() as conn:
            rows = conn.execute(
                select(T.from_state, T.to_state, T.at, T.owner, T.fence, T.reason, T.approved_by)
                .where(T.job_id == job_id)
                .order_by(T.id)
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
        with self._read() as conn:
            rows = conn.execute(
                select(J.kind, J.state, func.count()).group_by(J.kind, J.state)
            ).all()
        return {(r[0], r[1]): int(r[2]) for r in rows}

    def not_due(self) -> dict[str, int]:
        """QUEUED jobs not due yet by kind: sleeping on a timer, delayed, or backing off."""
        with self._read() as conn:
            rows = conn.execute(
                select(J.kind, func.count())
                .where(J.state == State.QUEUED.value, J.run_after > self.clock.now())
                .group_by(J.kind)
            ).all()
        return {row[0]: int(row[1]) for row in rows}

    def oldest_queued(self) -> tuple[str, float] | None:
        """(job id, seconds since it became due) of the longest-waiting due QUEUED job."""
        now = self.clock.now()
        with self._read() as conn:
            row = conn.execute(
                select(J.id, J.run_after, now)
                .where(J.state == State.QUEUED.value, J.run_after <= now)
                .order_by(J.run_after)
                .limit(1)
            ).one_or_none()
        if row is None:
            return None
        return row[0], max(0.0, (row[2] - row[1]).total_seconds())

    def stale_dispatches(self, stale_seconds: float) -> int:
        """Due QUEUED jobs whose doorbell went out more than ``stale_seconds`` ago and that
        no worker claimed since: lost messages, or messages waiting behind a backlog."""
        now = self.clock.now()
        with self._read() as conn:
            count: int = conn.execute(
                select(func.count())
                .select_from(J)
                .where(
                    J.state == State.QUEUED.value,
                    J.run_after <= now,
                    J.dispatched_at <= self.clock.after(-stale_seconds),
                )
            ).scalar_one()
        return count

    def limits(self) -> dict[str, KindLimits]:
        with self._read() as conn:
            rows = conn.execute(select(L.kind, L.max_running, L.max_queued)).all()
        return {r[0]: KindLimits(r[0], r[1], r[2]) for r in rows}

    def next_due(self, kind: str, limit: int = 1) -> list[str]:
        """The due QUEUED jobs of a kind that get the next slot a finished job frees: the
        highest priority first, then the oldest."""
        return [doorbell.job_id for doorbell in self.next_due_doorbells(kind, limit)]

    def next_due_doorbells(self, kind: str, limit: int = 1) -> list[Doorbell]:
        """:meth:`next_due` with each job's priority, for the doorbell that passes a slot on."""
        with self._read() as conn:
            rows = conn.execute(
                select(J.id, J.priority)
                .where(
                    J.kind == kind,
                    J.state == State.QUEUED.value,
                    J.run_after <= self.clock.now(),
                )
                .order_by(J.priority.desc(), J.run_after, J.created_at)
                .limit(limit)
            ).all()
        return [Doorbell(row.id, row.priority) for row in rows]

    def running_with_liveness(self) -> list[tuple[str, str, int, int]]:
        """(job id, owner, fence, liveness key) of RUNNING jobs whose owner took a liveness
        lock, for the sweeper to compare with the locks still held."""
        with self._read() as conn:
            rows = conn.execute(
                select(J.id, J.owner, J.fence, J.liveness_key).where(
                    J.state == State.RUNNING.value, J.liveness_key.is_not(None)
                )
            ).all()
        return [(r[0], r[1] or "", r[2], r[3] or 0) for r in rows]

    def _read(self) -> Connection:
        return self.engine.connect().execution_options(**{READ_ONLY: True})

    def list(
        self, state: State | None = None, kind: str | None = None, limit: int = 100
    ) -> list[Job]:
        stmt = select(*JOB_COLUMNS).order_by(J.created_at.desc(), J.id).limit(limit)
        if state is not None:
            stmt = stmt.where(J.state == state.value)
        if kind is not None:
            stmt = stmt.where(J.kind == kind)
        with self._read() as conn:
            return [Job.from_row(r) for r in conn.execute(stmt)]

    # == time and operations (issue 9): schedules, retention, counters, explain =============

    def schedules(self) -> builtins.list[Schedule]:
        """Every periodic schedule, by name."""
        with self._read() as conn:
            rows = conn.execute(select(*SCHEDULE_COLUMNS).order_by(ScheduleRecord.name)).all()
            return [_schedule_of(row) for row in rows]

    def schedule(self, name: str) -> Schedule:
        """One schedule by name; :class:`InvalidInput` names the known ones if it is unknown."""
        with self._read() as conn:
            row = conn.execute(
                select(*SCHEDULE_COLUMNS).where(ScheduleRecord.name == name)
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
                .select_from(J)
                .where(
                    J.state.in_([state.value for state in TERMINAL]),
                    J.finished_at < self.clock.after(-older_than_seconds),
                )
            ).scalar_one()
        return count

    def counters(self) -> dict[tuple[str, str], int]:
        """Operational counters by (name, kind): monotonic, never pruned."""
        C = CounterRecord
        with self._read() as conn:
            rows = conn.execute(select(C.name, C.kind, C.value)).all()
        return {(row.name, row.kind): int(row.value) for row in rows}

    def awaiting_redispatch(self, stale_seconds: float) -> dict[str, str]:
        """{job id: kind} of due QUEUED jobs whose message was sent more than
        ``stale_seconds`` ago and never claimed: the next sweep counts them as lost."""
        with self._read() as conn:
            rows = conn.execute(
                select(J.id, J.kind).where(
                    J.state == State.QUEUED.value,
                    J.run_after <= self.clock.now(),
                    J.dispatched_at <= self.clock.after(-stale_seconds),
                )
            ).all()
        return {row.id: row.kind for row in rows}

    def liveness_key_of(self, job_id: str) -> int | None:
        """The liveness key the job's current owner took (None if not RUNNING or none)."""
        with self._read() as conn:
            key: int | None = conn.execute(
                select(J.liveness_key).where(J.id == job_id)
            ).scalar_one_or_none()
        return key

    def leases_ending(self, within_seconds: float) -> builtins.list[tuple[str, bool, int]]:
        """(kind, already expired, count) of RUNNING jobs whose lease ends within
        ``within_seconds`` (or has ended) on the database clock."""
        now = self.clock.now()
        expired = J.lease_until <= now
        with self._read() as conn:
            rows = conn.execute(
                select(J.kind, expired, func.count())
                .where(
                    J.state == State.RUNNING.value,
                    J.lease_until <= self.clock.after(within_seconds),
                )
                .group_by(J.kind, expired)
            ).all()
        return [(row[0], bool(row[1]), int(row[2])) for row in rows]

    def moves_after(
        self, after_id: int | None, limit: int = 20_000
    ) -> tuple[builtins.list[Move], int]:
        """The history rows after ``after_id`` that end a run or start one, oldest first,
        each with its job's kind and the instant of the claim that began the run; and the
        watermark to pass next time. ``after_id=None`` returns no rows, only the current
        watermark (an exporter starts counting from its start)."""
        T = TransitionRecord.__table__.c
        claim = TransitionRecord.__table__.alias("claimed")
        started = (
            select(func.max(claim.c.at))
            .where(
                claim.c.job_id == T.job_id,
                claim.c.to_state == State.RUNNING.value,
                claim.c.id < T.id,
            )
            .scalar_subquery()
        )
        with self._read() as conn:
            newest = int(conn.execute(select(func.max(T.id))).scalar() or 0)
            if after_id is None:
                return [], newest
            rows = conn.execute(
                select(T.id, T.from_state, T.to_state, T.at, J.kind, started.label("started"))
                .join(J, J.id == T.job_id)
                .where(
                    T.id > after_id,
                    T.id <= newest,
                    T.to_state.in_(
                        [State.COMPLETED.value, State.FAILED.value, State.RUNNING.value]
                    ),
                )
                .order_by(T.id)
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
        S = StepRecord.__table__.c
        previous = StepRecord.__table__.alias("previous")
        claim = TransitionRecord.__table__.alias("claimed")
        prior_step = (
            select(func.max(previous.c.recorded_at))
            .where(
                previous.c.job_id == S.job_id,
                previous.c.fence == S.fence,
                previous.c.recorded_at < S.recorded_at,
            )
            .scalar_subquery()
        )
        claimed_at = (
            select(func.max(claim.c.at))
            .where(
                claim.c.job_id == S.job_id,
                claim.c.fence == S.fence,
                claim.c.owner == S.owner,  # an approval's record has no run behind it
                claim.c.to_state == State.RUNNING.value,
            )
            .scalar_subquery()
        )
        with self._read() as conn:
            if after is None:
                latest = conn.execute(select(func.max(S.recorded_at))).scalar()
                return [], latest or dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
            rows = conn.execute(
                select(
                    S.recorded_at,
                    J.kind,
                    prior_step.label("prior_step"),
                    claimed_at.label("claimed_at"),
                )
                .join(J, J.id == S.job_id)
                .where(S.recorded_at > after)
                .order_by(S.recorded_at)
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
