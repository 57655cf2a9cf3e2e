"""Reads across all jobs (``store.depth``): how many jobs are where (by kind, state,
priority and queue; not due yet; the oldest due; doorbells gone stale; leases ending),
which due jobs get the next free slot, what the sweeper compares with the liveness locks,
what retention would delete, the operational counters, and what moved since a watermark
(runs started and ended, steps recorded) for the metrics. Each is one grouped or bounded
read, however many jobs there are; none changes a row (see :mod:`jobs._store.reader`)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, func, select

from jobs._core.records import Doorbell
from jobs._core.states import TERMINAL, State
from jobs._store.clock import Clock, DatabaseClock
from jobs._store.key_limits import key_full, running_by_key
from jobs._store.pause_clauses import not_paused
from jobs._store.rate_limits import limits_of_kind, next_start_in, throttled_by_rate
from jobs._store.reader import read_only
from jobs._store.tables import CountersTable, JobsTable, StepsTable, TransitionsTable


class DepthReads:
    """Counts and watermarked reads over all jobs (see the module's docstring), over one
    engine and one clock; :class:`jobs._store.JobStore` composes one."""

    def __init__(self, engine: Engine, clock: Clock | None = None) -> None:
        self.engine = engine
        self.clock: Clock = clock or DatabaseClock()

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
        return self._queued_by(JobsTable.queue)

    def held_by_pauses(self) -> dict[str, int]:
        """QUEUED jobs (due or not) that a pause holds (``jobctl pause``), by kind."""
        return self._queued_by(JobsTable.kind, ~not_paused())

    def not_due(self) -> dict[str, int]:
        """QUEUED jobs not due yet by kind: sleeping on a timer, delayed, or backing off."""
        return self._queued_by(JobsTable.kind, JobsTable.run_after > self.clock.now())

    def _queued_by(self, column: Any, *where: ColumnElement[bool]) -> dict[Any, int]:
        """QUEUED jobs matching ``where``, counted by ``column`` (one grouped read)."""
        with self._read() as conn:
            rows = conn.execute(
                select(column.label("grouped"), func.count().label("jobs"))
                .where(JobsTable.state == State.QUEUED.value, *where)
                .group_by(column)
            ).all()
        return {row.grouped: int(row.jobs) for row in rows}

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
        no worker claimed since: lost messages, or messages waiting behind a backlog (a
        paused job's message is neither: it was dropped, and the resume rings it again)."""
        now = self.clock.now()
        with self._read() as conn:
            count: int = conn.execute(
                select(func.count())
                .select_from(JobsTable)
                .where(
                    JobsTable.state == State.QUEUED.value,
                    JobsTable.run_after <= now,
                    JobsTable.dispatched_at <= self.clock.after(-stale_seconds),
                    not_paused(),
                )
            ).scalar_one()
        return count

    def awaiting_ring_again(self, stale_seconds: float) -> dict[str, str]:
        """{job id: kind} of due QUEUED jobs whose message was sent more than
        ``stale_seconds`` ago and never claimed: the next sweep counts them as lost (a
        paused job is not: the sweep leaves it alone)."""
        with self._read() as conn:
            rows = conn.execute(
                select(JobsTable.id, JobsTable.kind).where(
                    JobsTable.state == State.QUEUED.value,
                    JobsTable.run_after <= self.clock.now(),
                    JobsTable.dispatched_at <= self.clock.after(-stale_seconds),
                    not_paused(),
                )
            ).all()
        return {row.id: row.kind for row in rows}

    def next_due(self, kind: str, limit: int = 1) -> list[str]:
        """The due QUEUED jobs of a kind that get the next slot a finished job frees: the
        highest priority first, then the oldest."""
        return [doorbell.job_id for doorbell in self.next_due_doorbells(kind, limit)]

    def next_due_doorbells(
        self, kind: str, limit: int = 1, *, concurrency_key: str | None = None
    ) -> list[Doorbell]:
        """:meth:`next_due` with each job's priority, for the doorbell that passes a slot on
        (none while the kind or the job's queue is paused: no claim would take it); with
        ``concurrency_key``, of the jobs of that key whose doorbell was used up by a
        delivery that found the key full (:meth:`Doorbells.hold_for_key`): the others' are
        still in the queue, and ringing them again would only make deliveries to drop."""
        of_key = (
            []
            if concurrency_key is None
            else [
                JobsTable.concurrency_key == concurrency_key,
                JobsTable.dispatched_at.is_(None),
            ]
        )
        with self._read() as conn:
            rows = conn.execute(
                select(JobsTable.id, JobsTable.priority, JobsTable.kind, JobsTable.queue)
                .where(
                    *of_key,
                    JobsTable.kind == kind,
                    JobsTable.state == State.QUEUED.value,
                    JobsTable.run_after <= self.clock.now(),
                    not_paused(),
                )
                .order_by(JobsTable.priority.desc(), JobsTable.run_after, JobsTable.created_at)
                .limit(limit)
            ).all()
        return [Doorbell(row.id, row.priority, row.kind, row.queue) for row in rows]

    def running_per_key(self, kind: str, keys: Sequence[str]) -> dict[str, int]:
        """{concurrency key: jobs of ``kind`` RUNNING under a live lease} for each of
        ``keys`` (what a claim of a job of the key counts against ``max_running_per_key``)."""
        with self._read() as conn:
            return running_by_key(conn, self.clock, kind, list(keys))

    def held_by_keys(self) -> dict[str, tuple[int, int]]:
        """{kind: (keys at their limit, due QUEUED jobs they hold)} for the kinds with a
        ``max_running_per_key``: jobs no claim may take until a run of their key ends (for
        ``jobctl limits`` and ``jobs_throttled{reason="concurrency_key"}``)."""
        with self._read() as conn:
            rows = conn.execute(
                select(
                    JobsTable.kind,
                    func.count(JobsTable.concurrency_key.distinct()).label("keys"),
                    func.count().label("jobs"),
                )
                .where(
                    JobsTable.state == State.QUEUED.value,
                    JobsTable.concurrency_key.is_not(None),
                    JobsTable.run_after <= self.clock.now(),
                    key_full(self.clock),
                )
                .group_by(JobsTable.kind)
            ).all()
        return {row.kind: (int(row.keys), int(row.jobs)) for row in rows}

    def held_by_rates(self) -> dict[str, int]:
        """{kind: due QUEUED jobs whose rate allows no start yet} (``jobctl limits``, the
        Flower Jobs view and ``jobs_throttled{reason="rate"}``)."""
        with self._read() as conn:
            return throttled_by_rate(conn, self.clock)

    def next_start(self, kind: str, key: str | None) -> tuple[str, float] | None:
        """``(rate, seconds)``: the rate that holds a job of ``kind`` with concurrency key
        ``key`` back, and in how long its next start is allowed; ``None``: now."""
        with self._read() as conn:
            return next_start_in(conn, self.clock, kind, limits_of_kind(conn, kind), key)

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

    def leases_ending(self, within_seconds: float) -> list[tuple[str, bool, int]]:
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

    def running_progress(self, limit: int) -> list[tuple[str, str, Any]]:
        """(job ID, kind, progress) of at most ``limit`` RUNNING jobs that reported progress
        (``ctx.progress``), the longest-lived first: a bounded read for the metrics."""
        with self._read() as conn:
            rows = conn.execute(
                select(JobsTable.id, JobsTable.kind, JobsTable.progress)
                .where(JobsTable.state == State.RUNNING.value, JobsTable.progress.is_not(None))
                .order_by(JobsTable.created_at, JobsTable.id)
                .limit(limit)
            ).all()
        return [(row.id, row.kind, row.progress) for row in rows]

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

    def moves_after(self, after_id: int | None, limit: int = 20_000) -> tuple[list[Move], int]:
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
    ) -> tuple[list[StepTiming], dt.datetime]:
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

    def _read(self) -> Connection:
        return read_only(self.engine)


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


def without_priority(by_priority: dict[tuple[str, str, int], int]) -> dict[tuple[str, str], int]:
    """:meth:`DepthReads.counts_by_priority` summed over the priorities: by (kind, state)."""
    totals: dict[tuple[str, str], int] = {}
    for (kind, state, _priority), jobs in by_priority.items():
        totals[kind, state] = totals.get((kind, state), 0) + jobs
    return totals
