"""Workflows: children spawned by a parent, a parent parked until its children finish, and
jobs parked until an event arrives or a deadline passes.

- A spawn inserts the children (by deterministic IDs, so inserting again is a no-op) and
  records the spawn as the parent's step, fenced, in one transaction: a parent that dies
  anywhere in it has either both or neither.
- A parent that waits for unfinished children marks them ``awaited``, sets its
  ``children_pending`` to how many it marked and moves RUNNING → WAITING, in one
  transaction. Each awaited child's finishing write (complete, fail, the sweeper's
  exhaustion, a cancel) decrements that counter in the same transaction; the one that
  brings it to 0 moves the parent WAITING → QUEUED (:mod:`jobs.core.store.fan_in`; an
  owner's finish on PostgreSQL does it all in one statement, like an ordinary
  completion). No polling, and no count of the children per completion.
- An event is kept in ``job_events`` until a wait of its name records it as the job's
  step, marking it consumed in the same transaction: it is consumed exactly once. The
  sender locks the job's row, so a job parking for the event and the event arriving
  cannot miss each other.
- A wait's deadline (an event's, an approval's) is fired by the sweeper on the database
  clock: the job goes back to QUEUED with a ``timed_out`` record under the wait's step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    Executable,
    and_,
    exists,
    insert,
    select,
    update,
)

from jobs.core.db import retry_on_disconnect
from jobs.core.errors import InvalidInput, UnknownJob
from jobs.core.models import EventsTable, JobsTable, StepsTable
from jobs.core.records import Claim, Doorbell, Job, PendingStep
from jobs.core.states import TERMINAL, State, sources_of
from jobs.core.store.fan_in import child_finish_statement, doorbell_of, settle_parent
from jobs.core.store.row_changes import RowChanges
from jobs.core.store.statements import Statements, state_in
from jobs.core.store.submissions import Submissions
from jobs.core.validate import check_name, encode_json

#: The recorded output of a wait whose deadline passed: ``{TIMED_OUT: True, ...}``.
TIMED_OUT = "timed_out"
UNFINISHED = tuple(state for state in State if state not in TERMINAL)


class Workflows:
    """Children, fan-in, events and deadlines (see the module's docstring)."""

    def __init__(self, statements: Statements, submissions: Submissions, max_payload: int) -> None:
        self.statements = statements
        self.submissions = submissions
        self.engine = statements.engine
        self.clock = statements.clock
        self.max_payload_bytes = max_payload

    # -- helpers ---------------------------------------------------------------------------

    def _ring(self, doorbells: Sequence[Doorbell]) -> None:
        """Ring doorbells of jobs moved to QUEUED, after their write committed."""
        if doorbells and self.statements.ring is not None:
            self.statements.ring(doorbells)

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
                        }
                        for step in steps
                    ]
                )
            )

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

    # -- children --------------------------------------------------------------------------

    def spawn(
        self,
        claim: Claim,
        kind: str,
        rows: Sequence[dict[str, Any]],
        records: Sequence[PendingStep],
    ) -> list[tuple[Job, bool]]:
        """Insert child rows of one kind (from :meth:`Submissions.new_job_values`, with
        deterministic IDs) as children of the claimed job, and record ``records`` (the
        spawn's step, and the steps that ran before it) in the same fenced transaction. A
        child already present (a re-run after a crash) is returned, not inserted again.
        The new children's doorbells ring after the commit."""
        with self.engine.begin() as conn:
            self._lock_owned(conn, claim)
            created = self.submissions.create_many(
                kind, [{**row, "parent_id": claim.job_id} for row in rows], conn=conn
            )
            self._record(conn, claim.job_id, records, claim.owner, claim.fence)
        self._ring([doorbell_of(job) for job, new in created if new])
        return created

    def wait_for_children(
        self,
        claim: Claim,
        child_ids: Sequence[str],
        step_name: str,
        *,
        steps: Sequence[PendingStep] = (),
    ) -> Job:
        """Park the claimed job until its unfinished children among ``child_ids`` end: they
        are marked awaited and counted into ``children_pending``, and the job moves RUNNING
        → WAITING (lease released, attempt given back) in one transaction. When every one
        of them ended meanwhile, the job goes back to QUEUED instead, due now."""
        check_name(step_name, "wait step name")
        with self.engine.begin() as conn:
            marked = list(
                conn.execute(
                    update(JobsTable)
                    .where(
                        JobsTable.id.in_(list(child_ids)),
                        JobsTable.parent_id == claim.job_id,
                        state_in(UNFINISHED),
                    )
                    .values(awaited=True)
                    .returning(JobsTable.id)
                ).scalars()
            )
            fenced = self.statements.fenced(claim)
            if marked:
                row = self.statements.transition(
                    conn,
                    claim.job_id,
                    State.WAITING,
                    only_from=[State.RUNNING],
                    where=fenced,
                    changes=RowChanges.parked(
                        step_name,
                        None,
                        children_pending=len(marked),
                        wait_event=None,
                    ),
                    owner=claim.owner,
                    fence=claim.fence,
                    reason=f"waiting for {len(marked)} of {len(child_ids)} children",
                    steps=steps,
                )
            else:
                row = self.statements.transition(
                    conn,
                    claim.job_id,
                    State.QUEUED,
                    only_from=[State.RUNNING],
                    where=fenced,
                    changes=RowChanges.given_back(
                        run_after=self.clock.now(), dispatched_at=self.clock.now()
                    ),
                    owner=claim.owner,
                    fence=claim.fence,
                    reason="its children ended while it parked",
                    steps=steps,
                )
            if row is None:
                raise self.statements.explain(conn, claim.job_id, State.WAITING, claim)
            return Job.from_row(row)

    def finish_child(
        self,
        claim: Claim,
        target: State,
        changes: RowChanges,
        reason: str | None,
        steps: Sequence[PendingStep] = (),
    ) -> Job:
        """A child's owner ends its run (COMPLETED or FAILED) and, in the same transaction,
        counts itself down in its waiting parent; the child that completes the set moves
        the parent WAITING → QUEUED there, and the parent's doorbell rings after the
        commit. On PostgreSQL all of it is one reusable statement in autocommit mode, on
        the driver path like an ordinary completion
        (:func:`jobs.core.store.fan_in.child_finish_statement`); on SQLite the move and
        :func:`settle_parent` in one transaction."""
        ringing = self.statements.ring is not None
        if self.engine.dialect.name != "postgresql":
            with self.engine.begin() as conn:
                row = self.statements.transition(
                    conn,
                    claim.job_id,
                    target,
                    only_from=[State.RUNNING],
                    where=self.statements.fenced(claim),
                    changes=changes,
                    owner=claim.owner,
                    fence=claim.fence,
                    reason=reason,
                    steps=steps,
                )
                if row is None:
                    raise self.statements.explain(conn, claim.job_id, target, claim)
                woken = settle_parent(self.statements, conn, row, ringing=ringing)
            self._ring([] if woken is None else [woken])
            return Job.from_row(row)

        key, _, params = self.statements.owner_move_statement(claim, target, changes, reason, steps)

        def build() -> Executable:
            return child_finish_statement(
                self.statements, target, changes.columns(), len(steps), ringing=ringing
            )

        def attempt() -> Any:
            with self.statements.unit(None, one_statement=True) as conn:
                with self.statements.recording(claim.job_id, steps):
                    found = self.statements.one_reusable(
                        conn, ("finish child", ringing, key), build, params
                    )
                if found is None:
                    raise self.statements.explain(conn, claim.job_id, target, claim)
                return found

        row = retry_on_disconnect(attempt)
        if row.woken_state == State.QUEUED.value:
            woken = Doorbell(row.woken_id, row.woken_priority, row.woken_kind, row.woken_queue)
            self._ring([woken])
        return Job.from_row(row)

    def cancel_children(self, conn: Connection, job_id: str, reason: str) -> list[str]:
        """Cancel the unfinished children of a cancelled job (and theirs), in the caller's
        transaction; returns their IDs."""
        cancelled: list[str] = []
        parents = [job_id]
        while parents:
            parent = parents.pop()
            children = conn.execute(
                select(JobsTable.id).where(
                    JobsTable.parent_id == parent, state_in(sources_of(State.CANCELLED))
                )
            ).scalars()
            for child in list(children):
                row = self.statements.transition(
                    conn,
                    child,
                    State.CANCELLED,
                    changes=RowChanges.finished(self.clock.now()),
                    reason=f"{reason} (its parent {parent!r} was cancelled)",
                )
                if row is not None:
                    cancelled.append(child)
                    parents.append(child)
        return cancelled

    # -- events ----------------------------------------------------------------------------

    def consume_event(self, claim: Claim, name: str, step_name: str) -> PendingStep | None:
        """If event ``name`` was sent to the claimed job and not consumed yet, consume it
        and record it as step ``step_name`` (fenced, one transaction); ``None`` if none."""
        with self.engine.begin() as conn:
            self._lock_owned(conn, claim)
            event = self._unconsumed(conn, claim.job_id, name)
            if event is None:
                return None
            self._consume(conn, event.id)
            record = PendingStep(step_name, {"event": name, "payload": event.payload}, "")
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
    ) -> Job:
        """Park the claimed job RUNNING → WAITING until event ``name`` (or ``timeout``
        seconds on the database clock, fired by the sweeper). An event that arrived since
        the handler last looked is consumed here instead, and the job goes back to QUEUED
        due now with the event recorded."""
        check_name(name, "event name")
        check_name(step_name, "event step name")
        deadline = None if timeout is None else self.clock.after(timeout)
        with self.engine.begin() as conn:
            row = self.statements.transition(
                conn,
                claim.job_id,
                State.WAITING,
                only_from=[State.RUNNING],
                where=self.statements.fenced(claim),
                changes=RowChanges.parked(
                    step_name,
                    deadline,
                    children_pending=0,
                    wait_event=name,
                ),
                owner=claim.owner,
                fence=claim.fence,
                reason=f"waiting for event {name!r}"
                + ("" if timeout is None else f" for at most {timeout:g} s"),
                steps=steps,
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
        waiting_for = conn.execute(
            select(JobsTable.waiting_for).where(JobsTable.id == job_id)
        ).scalar_one()
        moved = self.statements.transition(
            conn,
            job_id,
            State.QUEUED,
            only_from=[State.WAITING],
            where=[JobsTable.wait_event == name],
            changes=RowChanges(
                run_after=self.clock.now(),
                dispatched_at=self.clock.now(),  # every caller rings it after the commit
                waiting_for=None,
                wait_event=None,
                wait_deadline=None,
            ),
            reason=f"event {name!r} arrived",
        )
        if moved is None:
            raise self.statements.explain(conn, job_id, State.QUEUED)
        self._consume(conn, event.id)
        record = PendingStep(waiting_for, {"event": name, "payload": event.payload}, "")
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

    # -- the sweeper -----------------------------------------------------------------------

    def fire_deadlines(self, limit: int = 100) -> list[Job]:
        """Every WAITING or WAITING_APPROVAL job whose wait's deadline passed (database
        clock) back to QUEUED, with ``{"timed_out": true}`` recorded under its wait's step
        (so the handler's re-run raises :class:`jobs.EventTimedOut`). Left unsent: the
        sweeper rings them in the same pass."""
        now = self.clock.now()
        waiting = [State.WAITING, State.WAITING_APPROVAL]
        with self.statements.read() as conn:
            candidates = conn.execute(
                select(JobsTable.id)
                .where(state_in(waiting), JobsTable.wait_deadline <= now)
                .order_by(JobsTable.wait_deadline)
                .limit(limit)
            ).all()
        fired = []
        for candidate in candidates:
            with self.engine.begin() as conn:
                before = conn.execute(
                    select(JobsTable.waiting_for, JobsTable.wait_event)
                    .where(JobsTable.id == candidate.id)
                    .with_for_update()
                ).first()
                if before is None:
                    continue
                what = "approval" if before.wait_event is None else f"event {before.wait_event!r}"
                row = self.statements.transition(
                    conn,
                    candidate.id,
                    State.QUEUED,
                    only_from=waiting,
                    where=[JobsTable.wait_deadline <= self.clock.now()],
                    changes=RowChanges(
                        run_after=self.clock.now(),
                        dispatched_at=None,
                        waiting_for=None,
                        wait_event=None,
                        wait_deadline=None,
                    ),
                    reason=f"the deadline passed waiting for {what}",
                )
                if row is None:
                    continue
                if before.waiting_for is not None:
                    output = {TIMED_OUT: True, "waited_for": what}
                    self._record(
                        conn,
                        candidate.id,
                        [PendingStep(before.waiting_for, output, "")],
                        "sweeper",
                        row.fence,
                    )
                fired.append(Job.from_row(row))
        return fired

    def wake_stranded_parents(self, limit: int = 100) -> list[Job]:
        """The safety net: a parent WAITING for children none of which is unfinished any
        more (its last child's write should have woken it) back to QUEUED, unsent."""
        child = JobsTable.__table__.alias("child")
        unfinished_child = exists(
            select(child.c.id).where(
                and_(
                    child.c.parent_id == JobsTable.id,
                    child.c.awaited.is_(True),
                    child.c.state.in_([state.value for state in UNFINISHED]),
                )
            )
        )
        with self.statements.read() as conn:
            stranded = list(
                conn.execute(
                    select(JobsTable.id)
                    .where(
                        JobsTable.state == State.WAITING.value,
                        JobsTable.wait_event.is_(None),
                        ~unfinished_child,
                    )
                    .limit(limit)
                ).scalars()
            )
        woken = []
        for job_id in stranded:
            with self.engine.begin() as conn:
                row = self.statements.transition(
                    conn,
                    job_id,
                    State.QUEUED,
                    only_from=[State.WAITING],
                    where=[JobsTable.wait_event.is_(None), ~unfinished_child],
                    changes=RowChanges(
                        run_after=self.clock.now(),
                        dispatched_at=None,
                        waiting_for=None,
                        children_pending=0,
                    ),
                    reason="the sweeper: no awaited child is unfinished",
                )
                if row is not None:
                    woken.append(Job.from_row(row))
        return woken


__all__ = ["TIMED_OUT", "Workflows", "doorbell_of", "settle_parent"]
