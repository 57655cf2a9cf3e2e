"""Workflows: children spawned by a parent, a parent parked until its children finish, and
jobs parked until an event arrives or a deadline passes.

- A spawn inserts the children (by deterministic IDs, so inserting again is a no-op) and
  records the spawn as the parent's step, fenced, in one transaction: a parent that dies
  anywhere in it has either both or neither.
- A parent that waits for unfinished children marks them ``awaited``, sets its
  ``children_pending`` to how many it marked and moves RUNNING → WAITING, in one
  transaction. Each awaited child's finishing write (complete, fail, the sweeper's
  exhaustion, a cancel) decrements that counter in the same transaction; the one that
  brings it to 0 moves the parent WAITING → QUEUED (:mod:`jobs._store.fan_in`; an
  owner's finish on PostgreSQL does it all in one statement, like an ordinary
  completion). No polling, and no count of the children per completion.
- An event is kept until a wait of its name consumes it (:mod:`jobs._store.events`).
- A wait's deadline (an event's, an approval's) is fired by the sweeper on the database
  clock: the job goes back to QUEUED with a ``timed_out`` record under the wait's step.

No write here rings a doorbell. One that queues a job as a side effect (a spawn's new
children, a child's finish that queues its parent) returns the doorbells it owes
(:class:`jobs._core.records.Moved`), and its caller rings them after the commit; the
sweeper's writes leave the jobs they queue unrung, for the same pass's ring.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Executable, and_, exists, select, update

from jobs._core.records import Claim, Doorbell, Job, Moved, PendingStep, doorbell_of
from jobs._core.states import TERMINAL, State
from jobs._core.validate import check_name
from jobs._store.clauses import ReusableStatement, state_in
from jobs._store.db import retry_on_disconnect
from jobs._store.events import EventWaits
from jobs._store.fan_in import child_finish_statement, settle_parent
from jobs._store.row_changes import OwnerMove, RowChanges
from jobs._store.statements import Statements
from jobs._store.submissions import Submissions
from jobs._store.tables import JobsTable

#: The recorded output of a wait whose deadline passed: ``{TIMED_OUT: True, ...}``.
TIMED_OUT = "timed_out"
UNFINISHED = tuple(state for state in State if state not in TERMINAL)


class Workflows(EventWaits):
    """Children, fan-in and deadlines; events and their waits from :class:`EventWaits`
    (see the module's docstring)."""

    def __init__(self, statements: Statements, submissions: Submissions, max_payload: int) -> None:
        super().__init__(statements, max_payload)
        self.submissions = submissions

    # -- children --------------------------------------------------------------------------

    def spawn(
        self,
        claim: Claim,
        kind: str,
        rows: Sequence[dict[str, Any]],
        records: Sequence[PendingStep],
    ) -> list[Moved]:
        """Insert child rows of one kind (from :meth:`Submissions.new_job_values`, with
        deterministic IDs) as children of the claimed job, and record ``records`` (the
        spawn's step, and the steps that ran before it) in the same fenced transaction.
        Returns each child, a new one with the doorbell it owes (for the caller to ring
        after this commit); a child already present (a re-run after a crash) is returned,
        not inserted again, and owes none."""
        with self.engine.begin() as conn:
            self._lock_owned(conn, claim)
            created = self.submissions.create_many(
                kind, [{**row, "parent_id": claim.job_id} for row in rows], conn=conn
            )
            self._record(conn, claim.job_id, records, claim.owner, claim.fence)
        return [Moved(job, (doorbell_of(job),) if new else ()) for job, new in created]

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
            if marked:
                row = self.statements.owned_transition(
                    conn,
                    claim,
                    State.WAITING,
                    RowChanges.parked(
                        step_name,
                        None,
                        children_pending=len(marked),
                        wait_event=None,
                    ),
                    reason=f"waiting for {len(marked)} of {len(child_ids)} children",
                    steps=steps,
                )
            else:
                row = self.statements.owned_transition(
                    conn,
                    claim,
                    State.QUEUED,
                    RowChanges.given_back(
                        run_after=self.clock.now(), dispatched_at=self.clock.now()
                    ),
                    reason="its children ended while it parked",
                    steps=steps,
                )
            if row is None:
                raise self.statements.explain(conn, claim.job_id, State.WAITING, claim)
            return Job.from_row(row)

    def finish_child(self, move: OwnerMove, *, rings: bool = False) -> Moved:
        """A child's owner ends its run (COMPLETED or FAILED) and, in the same transaction,
        counts itself down in its waiting parent; the child that completes the set moves
        the parent WAITING → QUEUED there. With ``rings`` (the caller rings the doorbells
        returned, after the commit) the parent is marked rung and its doorbell returned;
        without, it is left unrung, for the sweeper. On PostgreSQL all of it is one
        reusable statement in autocommit mode, on the driver path like an ordinary
        completion (:func:`jobs._store.fan_in.child_finish_statement`); on SQLite the
        move and :func:`settle_parent` in one transaction."""
        claim, target, changes, steps = move.claim, move.target, move.changes, move.steps
        if self.engine.dialect.name != "postgresql":
            with self.engine.begin() as conn:
                row = self.statements.owned_transition(
                    conn, claim, target, changes, reason=move.reason, steps=steps
                )
                if row is None:
                    raise self.statements.explain(conn, claim.job_id, target, claim)
                woken = settle_parent(self.statements, conn, row, ringing=rings)
            return Moved(Job.from_row(row), () if woken is None else (woken,))

        plain = self.statements.owner_move_statement(move)

        def build() -> Executable:
            return child_finish_statement(
                self.statements, target, changes.columns(), len(steps), ringing=rings
            )

        finish = ReusableStatement(("finish child", rings, plain.key), build, plain.values)

        def attempt() -> Any:
            with self.statements.unit(None, one_statement=True) as conn:
                with self.statements.recording(claim.job_id, steps):
                    found = self.statements.one_reusable(conn, finish)
                if found is None:
                    raise self.statements.explain(conn, claim.job_id, target, claim)
                return found

        row = retry_on_disconnect(attempt)
        if not rings or row.woken_state != State.QUEUED.value:
            return Moved(Job.from_row(row))
        woken = Doorbell(row.woken_id, row.woken_priority, row.woken_kind, row.woken_queue)
        return Moved(Job.from_row(row), (woken,))

    def cancel_children(self, conn: Connection, job_id: str, reason: str) -> list[str]:
        """Cancel the unfinished children of a cancelled job (and theirs), in the caller's
        transaction, a generation at a time (:meth:`StateMoves.transition_children`: a
        fan-out of 20,000 is two statements, not 40,000); returns their IDs."""
        cancelled: list[str] = []
        parents = [job_id]
        while parents:
            moved = self.statements.transition_children(
                conn,
                parents,
                State.CANCELLED,
                changes=RowChanges.finished(self.clock.now()),
                reason_for=lambda parent: f"{reason} (its parent {parent!r} was cancelled)",
            )
            parents = [row.id for row in moved]
            cancelled.extend(parents)
        return cancelled

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
                    select(JobsTable.waiting_for, JobsTable.waiting_position, JobsTable.wait_event)
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
                    changes=RowChanges.wait_ended(self.clock.now(), rung=False),
                    reason=f"the deadline passed waiting for {what}",
                )
                if row is None:
                    continue
                if before.waiting_for is not None:
                    output = {TIMED_OUT: True, "waited_for": what}
                    self._record(
                        conn,
                        candidate.id,
                        [PendingStep(before.waiting_for, output, "", before.waiting_position)],
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


__all__ = ["TIMED_OUT", "Workflows", "settle_parent"]
