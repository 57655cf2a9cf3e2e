"""Pausing and resuming a kind or a queue (``jobctl pause``/``resume``): a row in
``job_pauses`` that every claim's compare-and-set reads
(:func:`jobs._store.pause_clauses.not_paused`), so no worker takes a paused job, however its
doorbell arrives. Nothing moves a job between states: a paused job stays QUEUED. A resume
deletes the row and, in the same transaction, marks the jobs it held that are due as rung
now, returning their doorbells for the caller to ring after the commit (the sweeper's
ring-again is not waited for)."""

from __future__ import annotations

from sqlalchemy import Connection, delete, select, update

from jobs._core.records import Doorbell, Pause
from jobs._core.states import State
from jobs._core.validate import check_person, check_text
from jobs._store.clauses import insert_for
from jobs._store.pause_clauses import KIND, PAUSE_COLUMNS, check_target, not_paused, pause_of
from jobs._store.statements import Statements
from jobs._store.tables import JobsTable, PausesTable


class Pauses:
    """A kind's or a queue's pause, and its resume (see the module's docstring)."""

    def __init__(self, statements: Statements) -> None:
        self.statements = statements
        self.engine = statements.engine
        self.clock = statements.clock

    def pause(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        by: str | None = None,
        reason: str | None = None,
        default_queue: bool = False,
        conn: Connection | None = None,
    ) -> tuple[Pause, bool]:
        """Pause one kind or one queue: from the commit on, no claim takes its jobs.
        ``default_queue``: ``queue`` is ``JOBS_QUEUE``, so jobs that name no queue are held
        too. Returns ``(pause, created)``; a target already paused keeps its first pause
        (``created=False``) and writes nothing."""
        scope, name = check_target(kind, queue)
        if by is not None:
            check_person(by, "paused by")
        if reason is not None:
            check_text(reason, "reason")
        values = {
            "scope": scope,
            "name": name,
            "default_queue": default_queue and scope != KIND,
            "paused_at": self.clock.now(),
            "paused_by": by,
            "reason": reason,
        }
        with self.statements.unit(conn) as unit:
            created = unit.execute(
                insert_for(unit, PausesTable)
                .values(values)
                .on_conflict_do_nothing()
                .returning(PausesTable.name)
            ).first()
            row = unit.execute(
                select(*PAUSE_COLUMNS).where(PausesTable.scope == scope, PausesTable.name == name)
            ).one()
        return pause_of(row), created is not None

    def resume(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        conn: Connection | None = None,
    ) -> tuple[Pause | None, list[Doorbell]]:
        """Lift one kind's or queue's pause. Returns the pause lifted (``None``: it was not
        paused, and nothing was written) and the doorbells now owed: the due QUEUED jobs it
        held that no other pause still holds, marked rung in the same transaction, the
        highest priority first. The caller rings them after the commit; a job not due yet
        is rung by the sweeper once due, as ever."""
        scope, name = check_target(kind, queue)
        with self.statements.unit(conn) as unit:
            lifted = unit.execute(
                delete(PausesTable)
                .where(PausesTable.scope == scope, PausesTable.name == name)
                .returning(*PAUSE_COLUMNS)
            ).one_or_none()
            if lifted is None:
                return None, []
            pause = pause_of(lifted)
            if scope == KIND:
                held = JobsTable.kind == name
            elif pause.default_queue:
                held = (JobsTable.queue == name) | JobsTable.queue.is_(None)
            else:
                held = JobsTable.queue == name
            now = self.clock.now()
            rows = unit.execute(
                update(JobsTable)
                .where(
                    JobsTable.state == State.QUEUED.value,
                    JobsTable.run_after <= now,
                    held,
                    not_paused(),
                )
                .values(dispatched_at=now)
                .returning(
                    JobsTable.id,
                    JobsTable.priority,
                    JobsTable.run_after,
                    JobsTable.kind,
                    JobsTable.queue,
                )
            ).all()
        ordered = sorted(rows, key=lambda row: (-row.priority, row.run_after, row.id))
        return pause, [Doorbell(row.id, row.priority, row.kind, row.queue) for row in ordered]


__all__ = ["Pauses"]
