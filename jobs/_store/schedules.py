"""Time and operations: periodic schedules and their ticks, retention of finished
jobs, and operational counters. None of these writes moves a job between states:
retention deletes finished jobs (never a live one) with their steps and history, and a
tick submits its job through :mod:`jobs._store.submissions`.
"""

from __future__ import annotations

import datetime as dt
import json

from sqlalchemy import Connection, delete, or_, select, update

from jobs._core import states
from jobs._core.errors import InvalidInput
from jobs._core.records import Job
from jobs._core.schedule_ticks import Schedule, check_schedule
from jobs._core.validate import check_name, encode_json
from jobs._store.clauses import insert_for
from jobs._store.db import SQLITE_BUSY_TIMEOUT_MS
from jobs._store.reader import JobReader
from jobs._store.statements import Statements
from jobs._store.submissions import Submissions
from jobs._store.tables import (
    CountersTable,
    EventsTable,
    JobsTable,
    SchedulesTable,
    StepsTable,
    TransitionsTable,
)


class Schedules:
    """Schedules, retention and counters (see the module's docstring)."""

    def __init__(self, statements: Statements, submissions: Submissions, reader: JobReader) -> None:
        self.statements = statements
        self.submissions = submissions
        self.reader = reader
        self.engine = statements.engine
        self.clock = statements.clock
        self.max_payload_bytes = submissions.max_payload_bytes

    def put_schedule(self, schedule: Schedule) -> Schedule:
        """Create or update a schedule by name. An update keeps the schedule's progress
        (``last_tick``) and creation time, so re-deploying code never re-fires a tick."""
        spec = check_schedule(schedule.name, schedule.spec, schedule.timezone, schedule.catch_up)
        check_name(schedule.kind, "job kind")
        if not isinstance(schedule.inputs, dict):
            raise InvalidInput("schedule inputs must be a JSON object")
        inputs = json.loads(encode_json(schedule.inputs, "schedule inputs", self.max_payload_bytes))
        now = self.clock.now()
        changed = {
            "kind": schedule.kind,
            "spec": spec,
            "timezone": schedule.timezone,
            "inputs": inputs,
            "catch_up": schedule.catch_up,
            "source": schedule.source,
            "updated_at": now,
        }
        with self.engine.begin() as conn:
            ins = insert_for(conn, SchedulesTable).values(
                name=schedule.name, last_tick=None, created_at=now, **changed
            )
            conn.execute(ins.on_conflict_do_update(index_elements=["name"], set_=changed))
        return self.reader.schedule(schedule.name)

    def delete_schedule(self, name: str) -> bool:
        """Stop a schedule; jobs it already submitted are left alone. False if unknown."""
        with self.engine.begin() as conn:
            deleted = conn.execute(
                delete(SchedulesTable)
                .where(SchedulesTable.name == name)
                .returning(SchedulesTable.name)
            ).first()
        return deleted is not None

    def advance_schedule(
        self, name: str, tick: dt.datetime, *, conn: Connection | None = None
    ) -> bool:
        """Move ``last_tick`` to ``tick`` if it is behind: a compare-and-set that never moves
        it back, so a slow sweeper cannot re-fire old ticks. False: someone got there first."""
        with self.statements.unit(conn) as unit:
            moved = unit.execute(
                update(SchedulesTable)
                .where(
                    SchedulesTable.name == name,
                    or_(SchedulesTable.last_tick.is_(None), SchedulesTable.last_tick < tick),
                )
                .values(last_tick=tick)
                .returning(SchedulesTable.name)
            ).first()
        return moved is not None

    def fire_tick(
        self,
        schedule: Schedule,
        tick: dt.datetime,
        *,
        job_id: str,
        max_attempts: int,
        code_version: str | None = None,
        priority: int = 0,
        queue: str | None = None,
    ) -> tuple[Job, bool] | None:
        """Submit ``tick``'s job and move the schedule past it, in one transaction: the
        compare-and-set on ``last_tick`` comes first, so of several sweepers firing the same
        tick one moves it and submits, and the others (blocked on the schedule's row until
        that commits, or serialized by SQLite) find it moved and submit nothing (None).
        ``schedule`` is the caller's view: if an operator changed the schedule since it was
        read (kind, spec, time zone, inputs, catch-up), nothing is written either (None),
        and the next pass fires the tick from the schedule as it is now.
        ``(job, created)`` otherwise; ``created`` is False if the job ID already existed."""
        with self.engine.connect() as conn, conn.begin() as transaction:
            if not self.advance_schedule(schedule.name, tick, conn=conn):
                return None
            if not self._unchanged(conn, schedule):  # the row is ours now (locked)
                transaction.rollback()
                return None
            return self.submissions.create(
                schedule.kind,
                schedule.inputs,
                job_id=job_id,
                max_attempts=max_attempts,
                code_version=code_version,
                priority=priority,
                conn=conn,
                queue=queue,
            )

    @staticmethod
    def _unchanged(conn: Connection, schedule: Schedule) -> bool:
        """Whether the stored schedule still defines what ``schedule`` (a view read
        earlier) does."""
        stored = conn.execute(
            select(
                SchedulesTable.kind,
                SchedulesTable.spec,
                SchedulesTable.timezone,
                SchedulesTable.inputs,
                SchedulesTable.catch_up,
            ).where(SchedulesTable.name == schedule.name)
        ).one_or_none()
        return stored is not None and (
            stored.kind,
            stored.spec,
            stored.timezone,
            stored.inputs,
            stored.catch_up,
        ) == (schedule.kind, schedule.spec, schedule.timezone, schedule.inputs, schedule.catch_up)

    def prune_finished(self, older_than_seconds: float, batch_size: int = 500) -> list[str]:
        """Delete one batch of finished jobs (COMPLETED, FAILED, CANCELLED) that finished more
        than ``older_than_seconds`` ago on the database clock, with their steps, history and
        events, oldest first, in one short transaction; returns their IDs (fewer than
        ``batch_size``: nothing more is due now).

        Never a job that is live, or comes back to life meanwhile (an operator's retry of an
        old FAILED job): the batch is locked as it is selected (PostgreSQL; SQLite has one
        writer at a time), skipping rows another transaction holds, the job rows go first
        with the state re-checked, and only the jobs actually deleted lose their steps and
        history. A retried job is deleted whole before the retry, or kept whole."""
        finished = [state.value for state in states.TERMINAL]
        old = [
            JobsTable.state.in_(finished),
            JobsTable.finished_at < self.clock.after(-older_than_seconds),
        ]
        with self.engine.begin() as conn:
            ids = list(
                conn.execute(
                    select(JobsTable.id)
                    .where(*old)
                    .order_by(JobsTable.finished_at)
                    .limit(batch_size)
                    .with_for_update(skip_locked=True)
                ).scalars()
            )
            if not ids:
                return []
            gone = sorted(
                conn.execute(
                    delete(JobsTable).where(JobsTable.id.in_(ids), *old).returning(JobsTable.id)
                ).scalars()
            )
            if gone:  # the foreign keys cascade; said again for a database without them
                for table in (StepsTable, TransitionsTable, EventsTable):
                    conn.execute(delete(table).where(table.job_id.in_(gone)))
            return gone

    def count_event(self, name: str, kind: str, amount: int = 1, *, wait: bool = True) -> None:
        """Add ``amount`` to an operational counter (``recovery_dead_owner``, ``lost_message``,
        ``admission_refused`` …) for a kind; never touches a job. ``wait=False`` when the
        caller may hold a transaction on the same SQLite file (a web request's): a counter
        is not worth waiting out its write lock for, so a locked file raises at once."""
        if amount <= 0:
            return
        counter = CountersTable
        impatient = not wait and self.engine.dialect.name == "sqlite"
        with self.engine.connect() as conn:
            # On the driver's connection, outside any transaction: BEGIN IMMEDIATE is where
            # the lock is waited for.
            driver = conn.connection.dbapi_connection
            if impatient and driver is not None:
                driver.execute("PRAGMA busy_timeout = 0")
            try:
                with conn.begin():
                    upsert = insert_for(conn, counter).values(name=name, kind=kind, value=amount)
                    conn.execute(
                        upsert.on_conflict_do_update(
                            index_elements=["name", "kind"],
                            set_={"value": counter.value + amount},
                        )
                    )
            finally:
                if impatient and driver is not None:
                    driver.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")


__all__ = ["Schedules"]
