"""Deduplicated submits (``unique_for``, ``unique_key``, ``debounce``): a new job whose row
carries a deduplication key (:mod:`jobs._core.dedup`) is inserted only when no job holds
that key; a debounced submit instead pushes the holder's due time and inputs to its own."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, or_, select, update
from sqlalchemy.sql import ColumnElement

from jobs._core.dedup import HOLDING_STATES
from jobs._core.errors import DuplicateJob
from jobs._core.records import Job
from jobs._core.states import State
from jobs._core.validate import same_json
from jobs._store.admission import admit
from jobs._store.job_inserts import insert_rows
from jobs._store.reader import JOB_COLUMNS
from jobs._store.statements import Statements
from jobs._store.tables import JobsTable


class DedupWrites:
    """Submits with a deduplication key (``store.dedup``; see the module's docstring)."""

    def __init__(self, statements: Statements) -> None:
        self.statements = statements
        self.clock = statements.clock

    def create(
        self, kind: str, values: dict[str, Any], *, debounce: bool, conn: Connection | None = None
    ) -> tuple[Job, bool]:
        """Insert a job whose row carries a deduplication key (``new_job_values`` of
        :class:`jobs._store.submissions.Submissions` with ``unique_for``/``debounce``),
        unless a job holds that key: then return that job (``created=False``) and write
        nothing new. A job holds its key until its
        ``dedup_until`` while in :data:`jobs._core.dedup.HOLDING_STATES` (FAILED and
        CANCELLED never hold it). With ``debounce``, only a QUEUED job never claimed holds
        it, and the submit pushes that job's due time (and its key's window) to the new
        row's, with the new row's inputs: it runs once, ``debounce`` seconds after the last
        submit of its key. Safe under concurrent submits: the key's unique index lets one
        insert, and the others find its job in the same transaction. ``conn`` joins the
        caller's transaction."""
        key = values["dedup_key"]
        with self.statements.unit(conn) as unit:
            if debounce:
                pushed = self._push_debounced(unit, kind, values)
                if pushed is not None:
                    return pushed, False
                holds: ColumnElement[bool] = (JobsTable.state == State.QUEUED.value) & (
                    JobsTable.attempts == 0
                )
            else:
                holds = (JobsTable.dedup_until > self.clock.now()) & or_(
                    *(JobsTable.state == state.value for state in HOLDING_STATES)
                )
            # A job that no longer holds its key gives it up (no state moves), so the
            # unique index admits the new one.
            unit.execute(
                update(JobsTable).where(JobsTable.dedup_key == key, ~holds).values(dedup_key=None)
            )
            holder = unit.execute(
                select(*JOB_COLUMNS).where(JobsTable.dedup_key == key)
            ).one_or_none()
            if holder is not None:  # it holds the key: no admission, nothing written
                return Job.from_row(holder), False
            admit(unit, self.clock, kind, [values["id"]])
            inserted = insert_rows(unit, [values])
            if values["id"] in inserted:
                return Job.from_row(inserted[values["id"]]), True
            holder = unit.execute(
                select(*JOB_COLUMNS).where(JobsTable.dedup_key == key)
            ).one_or_none()
            if holder is not None:  # inserted by a concurrent submit of the same key
                if debounce:
                    pushed = self._push_debounced(unit, kind, values)
                    if pushed is not None:
                        return pushed, False
                return Job.from_row(holder), False
            job = Job.from_row(
                unit.execute(select(*JOB_COLUMNS).where(JobsTable.id == values["id"])).one()
            )
            if job.kind != kind or not same_json(job.inputs, values["inputs"]):
                raise DuplicateJob(job.id)
            return job, False

    def _push_debounced(self, conn: Connection, kind: str, values: dict[str, Any]) -> Job | None:
        """The QUEUED, never claimed job that holds a debounced row's key, due again (with
        its key) at the row's due time and with the row's inputs; unrung, so a doorbell
        rung before the push finds it not due and the sweeper rings it once due."""
        row = conn.execute(
            update(JobsTable)
            .where(
                JobsTable.dedup_key == values["dedup_key"],
                JobsTable.kind == kind,
                JobsTable.state == State.QUEUED.value,
                JobsTable.attempts == 0,
            )
            .values(
                run_after=values["run_after"],
                dedup_until=values["dedup_until"],
                inputs=values["inputs"],
                dispatched_at=None,
                updated_at=self.clock.now(),
            )
            .returning(*JOB_COLUMNS)
        ).one_or_none()
        return None if row is None else Job.from_row(row)


__all__ = ["DedupWrites"]
