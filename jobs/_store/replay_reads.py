"""Reads for ``jobctl replay-check``: the jobs of some states a batch at a time, each with
its recorded steps, in two statements a batch however many steps they have.

The check runs the deployed code against what live jobs recorded; 10,000 jobs read as 20
batches of 500 (one read of the jobs, keyed by ID after the last one seen, and one of all
their steps), never one read per job. Nothing here changes a row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sqlalchemy import ColumnElement, Connection, Engine, select

from jobs._core.records import Job
from jobs._core.states import State
from jobs._store.reader import JOB_COLUMNS, read_only
from jobs._store.tables import JobsTable, StepsTable


@dataclasses.dataclass(frozen=True)
class RecordedJob:
    """A job with what it recorded: each step's output and its place (``None``: recorded
    before positions were), by name."""

    job: Job
    outputs: dict[str, object]
    positions: dict[str, int | None]


class ReplayReads:
    """The jobs a replay check goes through (``store.replays``), a batch at a time."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def batch(
        self,
        states: Sequence[State],
        kind: str | None = None,
        after_id: str | None = None,
        limit: int = 500,
    ) -> list[RecordedJob]:
        """The next ``limit`` jobs in ``states`` (of ``kind``, if given) whose ID sorts
        after ``after_id``, in ID order, each with its recorded steps."""
        conditions: list[ColumnElement[bool]] = [
            JobsTable.state.in_([state.value for state in states])
        ]
        if kind is not None:
            conditions.append(JobsTable.kind == kind)
        if after_id is not None:
            conditions.append(JobsTable.id > after_id)
        with self._read() as conn:
            jobs = [
                Job.from_row(row)
                for row in conn.execute(
                    select(*JOB_COLUMNS).where(*conditions).order_by(JobsTable.id).limit(limit)
                )
            ]
            steps = conn.execute(
                select(StepsTable.job_id, StepsTable.name, StepsTable.output, StepsTable.position)
                .where(StepsTable.job_id.in_([job.id for job in jobs]))
                .order_by(StepsTable.job_id, StepsTable.recorded_at, StepsTable.position)
            ).all()
        outputs: dict[str, dict[str, object]] = {job.id: {} for job in jobs}
        positions: dict[str, dict[str, int | None]] = {job.id: {} for job in jobs}
        for step in steps:
            outputs[step.job_id][step.name] = step.output
            positions[step.job_id][step.name] = step.position
        return [RecordedJob(job, outputs[job.id], positions[job.id]) for job in jobs]

    def _read(self) -> Connection:
        return read_only(self.engine)


__all__ = ["RecordedJob", "ReplayReads"]
