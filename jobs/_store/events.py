"""Events sent to jobs, and the waits for them (a part of the store's workflows).

An event is kept in ``job_events`` until a wait of its name records it as the job's step,
marking it consumed in the same transaction: it is consumed exactly once. The sender
locks the job's row, so a job parking for the event and the event arriving cannot miss
each other. A job WAITING for the event goes back to QUEUED with it recorded, marked
rung: every caller rings it after the commit. A wait's deadline is fired by the sweeper
(:meth:`jobs._store.workflows.Workflows.fire_deadlines`).

:class:`EventWaits` also holds what every workflow write of an owner needs: the claimed
row locked while the claim owns it, and step records written in the caller's
transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, insert, select, update

from jobs._core.errors import InvalidInput, UnknownJob
from jobs._core.records import Claim, Job, PendingStep
from jobs._core.states import TERMINAL, State
from jobs._core.validate import check_name, encode_json
from jobs._store.row_changes import RowChanges
from jobs._store.statements import Statements
from jobs._store.tables import EventsTable, JobsTable, StepsTable


class EventWaits:
    """Events and the waits for them (see the module's docstring); extended by
    :class:`jobs._store.workflows.Workflows`, the store's part for all workflows."""

    def __init__(self, statements: Statements, max_payload: int) -> None:
        self.statements = statements
        self.engine = statements.engine
        self.clock = statements.clock
        self.max_payload_bytes = max_payload

    # -- an owner's workflow writes --------------------------------------------------------

    def _lock_owned(self, conn: Connection, claim: Claim) -> None:
        """Lock the claimed job's row while the claim still owns it; else raise why."""
        owned = conn.execute(
            select(JobsTable.id).where(*self.statements.fenced(claim)).with_for_update()
        ).first()
        if owned is None:
            raise self.statements.explain(conn, claim.job_id, State.RUNNING, claim)

    def _record(
        self, conn: Connection, job_id: str, steps: Sequence[PendingStep], owner: str, fence: int
    ) -> None:
        """Insert step records (a name already recorded is a :class:`StepError`)."""
        if not steps:
            return
        with self.statements.recording(job_id, steps):
            conn.execute(
                insert(StepsTable).values(
                    [
                        {
                            "job_id": job_id,
                            "name": step.name,
                            "output": step.output,
                            "recorded_at": self.clock.now(),
                            "owner": owner,
                            "fence": fence,
                            "position": step.position,
                        }
                        for step in steps
                    ]
                )
            )

    # -- events ----------------------------------------------------------------------------

    def _unconsumed(self, conn: Connection, job_id: str, name: str) -> Any:
        """The oldest event ``name`` sent to the job and not consumed yet, locked."""
        return conn.execute(
            select(EventsTable.id, EventsTable.payload)
            .where(
                EventsTable.job_id == job_id,
                EventsTable.name == name,
                EventsTable.consumed_at.is_(None),
            )
            .order_by(EventsTable.id)
            .limit(1)
            .with_for_update()
        ).first()

    def _consume(self, conn: Connection, event_id: int) -> None:
        conn.execute(
            update(EventsTable)
            .where(EventsTable.id == event_id, EventsTable.consumed_at.is_(None))
            .values(consumed_at=self.clock.now())
        )

    def consume_event(
        self, claim: Claim, name: str, step_name: str, position: int | None = None
    ) -> PendingStep | None:
        """If event ``name`` was sent to the claimed job and not consumed yet, consume it
        and record it as step ``step_name`` at ``position`` in the handler's calls (fenced,
        one transaction); ``None`` if none."""
        with self.engine.begin() as conn:
            self._lock_owned(conn, claim)
            event = self._unconsumed(conn, claim.job_id, name)
            if event is None:
                return None
            self._consume(conn, event.id)
            output = {"event": name, "payload": event.payload}
            record = PendingStep(step_name, output, "", position)
            self._record(conn, claim.job_id, [record], claim.owner, claim.fence)
            return record

    def wait_for_event(
        self,
        claim: Claim,
        name: str,
        step_name: str,
        timeout: float | None,
        *,
        steps: Sequence[PendingStep] = (),
        position: int | None = None,
    ) -> Job:
        """Park the claimed job RUNNING → WAITING until event ``name`` (or ``timeout``
        seconds on the database clock, fired by the sweeper). An event that arrived since
        the handler last looked is consumed here instead, and the job goes back to QUEUED
        due now with the event recorded."""
        check_name(name, "event name")
        check_name(step_name, "event step name")
        deadline = None if timeout is None else self.clock.after(timeout)
        with self.engine.begin() as conn:
            reason = f"waiting for event {name!r}" + (
                "" if timeout is None else f" for at most {timeout:g} s"
            )
            parked = RowChanges.parked(
                step_name, deadline, position, children_pending=0, wait_event=name
            )
            row = self.statements.owned_transition(
                conn, claim, State.WAITING, parked, reason, steps
            )
            if row is None:
                raise self.statements.explain(conn, claim.job_id, State.WAITING, claim)
            event = self._unconsumed(conn, claim.job_id, name)
            if event is None:
                return Job.from_row(row)
            return self._deliver(conn, claim.job_id, name, event, row.fence, claim.owner)

    def _deliver(
        self, conn: Connection, job_id: str, name: str, event: Any, fence: int, by: str
    ) -> Job:
        """Move a job WAITING for event ``name`` to QUEUED with the event recorded under
        its wait's step and marked consumed (the caller holds the row's lock)."""
        waiting = conn.execute(
            select(JobsTable.waiting_for, JobsTable.waiting_position).where(JobsTable.id == job_id)
        ).one()
        moved = self.statements.transition(
            conn,
            job_id,
            State.QUEUED,
            only_from=[State.WAITING],
            where=[JobsTable.wait_event == name],
            # Every caller rings it after the commit.
            changes=RowChanges.wait_ended(self.clock.now(), rung=True),
            reason=f"event {name!r} arrived",
        )
        if moved is None:
            raise self.statements.explain(conn, job_id, State.QUEUED)
        self._consume(conn, event.id)
        output = {"event": name, "payload": event.payload}
        record = PendingStep(waiting.waiting_for, output, "", waiting.waiting_position)
        self._record(conn, job_id, [record], by, fence)
        return Job.from_row(moved)

    def send_event(
        self, job_id: str, name: str, payload: Any = None, *, conn: Connection | None = None
    ) -> Job | None:
        """Send event ``name`` with ``payload`` to an unfinished job. A job WAITING for it
        gets it now (recorded as its wait's step, consumed, job back to QUEUED: returned,
        for its doorbell to ring after the commit); otherwise the event is kept, and the
        job's next wait of that name consumes it. Returns the woken job or ``None``."""
        check_name(name, "event name")
        encode_json(payload, f"payload of event {name!r}", self.max_payload_bytes)
        with self.statements.unit(conn) as unit:
            row = unit.execute(
                select(JobsTable.state, JobsTable.wait_event, JobsTable.fence)
                .where(JobsTable.id == job_id)
                .with_for_update()
            ).first()
            if row is None:
                raise UnknownJob(job_id)
            if State(row.state) in TERMINAL:
                raise InvalidInput(
                    f"job {job_id!r} is {row.state}: an event goes to an unfinished job"
                )
            event_id = unit.execute(
                insert(EventsTable)
                .values(job_id=job_id, name=name, payload=payload, sent_at=self.clock.now())
                .returning(EventsTable.id)
            ).scalar_one()
            if row.state != State.WAITING.value or row.wait_event != name:
                return None
            event = unit.execute(
                select(EventsTable.id, EventsTable.payload).where(EventsTable.id == event_id)
            ).one()
            return self._deliver(unit, job_id, name, event, row.fence, f"event:{name}"[:200])


__all__ = ["EventWaits"]
