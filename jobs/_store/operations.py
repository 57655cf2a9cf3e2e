"""What operators and the sweeper do to jobs they do not own: approve a job waiting for
approval, cancel one, wake one waiting on a timer, retry a FAILED or CANCELLED one, act on
many selected jobs at once, and take a RUNNING job back from an owner whose lease ran out
(expire, sweep). Each is a compare-and-set state move with its history row; a refusal
changes nothing and says why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, delete, insert, select, update

from jobs._core import reasons
from jobs._core.errors import NothingToWake, UnknownJob
from jobs._core.records import BulkOutcome, Job, Selected
from jobs._core.states import APPROVABLE, CANCELLABLE, RETRYABLE, State
from jobs._core.validate import check_person, check_text
from jobs._store.requeue import requeue_or_fail
from jobs._store.row_changes import RowChanges
from jobs._store.statements import Statements
from jobs._store.tables import JobsTable, StepsTable
from jobs._store.workflows import Workflows, settle_parent

Move = Callable[..., "Row[Any] | None"]
"""One job's state move, bound to its unit of work, its ID, the states it may leave and (for
a batch) the fence it was selected with: ``move(target, changes=…, reason=…)`` is
:meth:`Statements.transition` of that job; ``None``: nothing matched."""

Write = Callable[[Connection, str, Move], Job | None]
"""One job's operator move inside a unit of work: (connection, job id, its bound
:data:`Move`) -> the job as it is now, or ``None`` if nothing matched."""


def retry_reason(by: str, reason: str, *, from_start: bool) -> str:
    """The history row of an operator's retry: who, why, and what happens to the steps."""
    steps = (
        "from the start: its recorded steps were dropped"
        if from_start
        else "from the failed step: its recorded steps are kept and replayed"
    )
    return f"retried by {by}: {reason} ({steps})"


class Operations:
    """Operators' and the sweeper's moves (see the module's docstring)."""

    def __init__(self, statements: Statements, workflows: Workflows) -> None:
        self.statements = statements
        self.engine = statements.engine
        self.clock = statements.clock
        self.workflows = workflows  # a cancel's cascade to the job's children

    def _not_due(self) -> ColumnElement[bool]:
        """A job whose ``run_after`` is still ahead: with QUEUED, one waiting on a timer
        (sleeping, delayed by ``delay``/``run_at``, or backing off after an error)."""
        return JobsTable.run_after > self.clock.now()

    # -- operators -----------------------------------------------------------------------

    def approve(
        self, job_id: str, by: str, note: str | None = None, *, conn: Connection | None = None
    ) -> Job:
        """WAITING_APPROVAL -> QUEUED, recording who approved (and why) as the job's
        approval step so the handler's re-run continues past the wait."""
        return self._on_one(job_id, State.QUEUED, APPROVABLE, self._approving(by, note), conn)

    def _approving(self, by: str, note: str | None) -> Write:
        """The write that approves one job as ``by`` (checked here), for one or a batch."""
        check_person(by, "approver")
        if note is not None:
            check_text(note, "approval note")
        return lambda unit, job_id, move: self._approve(unit, job_id, by, note, move)

    def _approve(
        self,
        unit: Connection,
        job_id: str,
        by: str,
        note: str | None,
        move: Move,
    ) -> Job | None:
        now = self.clock.now()
        row = move(
            State.QUEUED,
            changes=RowChanges(run_after=now, dispatched_at=now, wait_deadline=None),
            reason=note or "approved",
            approved_by=by,
        )
        if row is None:
            return None
        job = Job.from_row(row)
        waiting_for = row.waiting_for
        if waiting_for is not None:
            # The approval is recorded at the place the handler asked for it.
            position = unit.execute(
                select(JobsTable.waiting_position).where(JobsTable.id == job_id)
            ).scalar()
            unit.execute(
                insert(StepsTable).values(
                    job_id=job_id,
                    name=waiting_for,
                    output={"approved_by": by, "note": note},
                    recorded_at=now,
                    owner=by,
                    fence=job.fence,
                    position=position,
                )
            )
            unit.execute(
                update(JobsTable)
                .where(JobsTable.id == job_id)
                .values(waiting_for=None, waiting_position=None)
            )
            job = dataclasses.replace(job, waiting_for=None)
        return job

    def cancel(
        self, job_id: str, reason: str = reasons.CANCELLED, *, conn: Connection | None = None
    ) -> Job:
        """Cancel a job that has not finished; a running owner's heartbeat finds out at its
        next renewal (refused; ``ctx.cancelled``, ``ctx.on_cancel``), or the owner at its
        next fenced write, and writes nothing more."""
        return self._on_one(job_id, State.CANCELLED, CANCELLABLE, self._cancelling(reason), conn)

    def _cancelling(self, reason: str) -> Write:
        """The write that cancels one job for ``reason`` (checked here)."""
        check_text(reason, "cancel reason")
        return lambda unit, job_id, move: self._cancel(unit, job_id, reason, move)

    def _cancel(
        self,
        unit: Connection,
        job_id: str,
        reason: str,
        move: Move,
    ) -> Job | None:
        row = move(State.CANCELLED, changes=RowChanges.finished(self.clock.now()), reason=reason)
        if row is None:
            return None
        # Workflows: its unfinished children are cancelled with it, and a child counts
        # itself down in its waiting parent (left unrung, for the sweeper).
        self.workflows.cancel_children(unit, job_id, reason)
        settle_parent(self.statements, unit, row, ringing=False)
        return Job.from_row(row)

    def retry(
        self,
        job_id: str,
        by: str,
        reason: str = reasons.RETRIED,
        *,
        from_start: bool = False,
        conn: Connection | None = None,
    ) -> Job:
        """An operator's retry: a FAILED or CANCELLED job back to QUEUED, due now, with a
        fresh budget of attempts (``attempts`` reset to 0; ``max_attempts`` unchanged) and
        its fence bumped, so nothing written under an earlier claim can land. Its recorded
        steps are kept, so the next run replays them and starts at the step that failed;
        ``from_start`` deletes them instead, in the same transaction. The history row says
        who, why, and which of the two. Marked rung: the caller rings the doorbell
        after the commit. Any other state raises :class:`IllegalTransition` (or
        :class:`UnknownJob`) and nothing changes."""
        retrying = self._retrying(by, reason, from_start)
        return self._on_one(job_id, State.QUEUED, RETRYABLE, retrying, conn)

    def _retrying(self, by: str, reason: str, from_start: bool) -> Write:
        """The write that retries one job as ``by`` (checked here)."""
        check_person(by, "retrier")
        check_text(reason, "retry reason")
        return lambda unit, job_id, move: self._retry(unit, job_id, by, reason, from_start, move)

    def _retry(
        self,
        unit: Connection,
        job_id: str,
        by: str,
        reason: str,
        from_start: bool,
        move: Move,
    ) -> Job | None:
        now = self.clock.now()
        row: Row[Any] | None = move(
            State.QUEUED,
            changes=RowChanges(
                owner=None,
                fence=JobsTable.fence + 1,
                lease_until=None,
                liveness_key=None,
                attempts=0,
                run_after=now,
                dispatched_at=now,
                finished_at=None,
                waiting_for=None,
                wait_deadline=None,
            ),
            reason=retry_reason(by, reason, from_start=from_start),
        )
        if row is None:
            return None
        if from_start:
            unit.execute(delete(StepsTable).where(StepsTable.job_id == job_id))
        return Job.from_row(row)

    # -- many jobs at once -----------------------------------------------------------------

    def retry_selected(
        self,
        selected: Sequence[Selected],
        by: str,
        reason: str = reasons.RETRIED,
        *,
        from_start: bool = False,
    ) -> BulkOutcome:
        """:meth:`retry` for one batch of selected jobs, in one transaction: each only while
        still in the state and under the fence it was selected with."""
        return self._on_selected(selected, RETRYABLE, self._retrying(by, reason, from_start))

    def cancel_selected(
        self, selected: Sequence[Selected], reason: str = reasons.CANCELLED
    ) -> BulkOutcome:
        """:meth:`cancel` for one batch of selected jobs, as :meth:`retry_selected`."""
        return self._on_selected(selected, CANCELLABLE, self._cancelling(reason))

    def approve_selected(
        self, selected: Sequence[Selected], by: str, note: str | None = None
    ) -> BulkOutcome:
        """:meth:`approve` for one batch of selected jobs, as :meth:`retry_selected`."""
        return self._on_selected(selected, APPROVABLE, self._approving(by, note))

    def _on_one(
        self,
        job_id: str,
        target: State,
        sources: Sequence[State],
        write: Write,
        conn: Connection | None,
    ) -> Job:
        """``write`` one job, from ``sources`` to ``target``, in its own transaction (or
        ``conn``'s); a job it did not move raises why (:meth:`Statements.explain`)."""
        with self.statements.unit(conn) as unit:
            move = partial(self.statements.transition, unit, job_id, only_from=sources)
            job = write(unit, job_id, move)
            if job is None:
                raise self.statements.explain(unit, job_id, target)
            return job

    def _on_selected(
        self, selected: Sequence[Selected], sources: Sequence[State], write: Write
    ) -> BulkOutcome:
        """One short transaction over a batch: each job moves only from the state it was
        selected in (if the action applies to that state at all) and only under the fence
        it was selected with; any other is skipped, untouched."""
        done: list[Job] = []
        skipped: list[str] = []
        with self.engine.begin() as unit:
            for seen in selected:
                if seen.state not in sources:
                    skipped.append(seen.id)
                    continue
                move = partial(
                    self.statements.transition,
                    unit,
                    seen.id,
                    only_from=[seen.state],
                    where=[JobsTable.fence == seen.fence],
                )
                job = write(unit, seen.id, move)
                if job is None:
                    skipped.append(seen.id)
                else:
                    done.append(job)
        return BulkOutcome(done, skipped)

    def wake_job(
        self, job_id: str, reason: str = reasons.WOKEN, *, conn: Connection | None = None
    ) -> Job:
        """An operator's wake: a QUEUED job waiting on a timer (``ctx.sleep``, a submit's
        ``delay``/``run_at``, a retry's backoff) made due now. A compare-and-set on QUEUED
        and not due yet, with a QUEUED → QUEUED history row giving ``reason``. Marked
        rung, as an approval is: the caller rings the doorbell after the commit (a
        failed ring is sent again by the sweeper). Any other job raises
        :class:`NothingToWake` (or :class:`UnknownJob`) and nothing changes."""
        check_text(reason, "wake reason")
        with self.statements.unit(conn) as unit:
            row = self.statements.transition(
                unit,
                job_id,
                State.QUEUED,
                only_from=[State.QUEUED],
                where=[self._not_due()],
                # A recorded timer does not sleep again, so the re-run continues past it.
                changes=RowChanges(run_after=self.clock.now(), dispatched_at=self.clock.now()),
                reason=reason,
            )
            if row is None:
                state = unit.execute(
                    select(JobsTable.state).where(JobsTable.id == job_id)
                ).scalar_one_or_none()
                if state is None:
                    raise UnknownJob(job_id)
                raise NothingToWake(job_id, State(state))
            return Job.from_row(row)

    def make_due(self, job_ids: Sequence[str] | None = None) -> list[str]:
        """Make QUEUED jobs that are not due yet (sleeping, delayed, backing off) due now:
        all of them, or those of ``job_ids``. For tests (:func:`jobs.testing.wake`): a job
        runs only once due, and a recorded timer does not sleep again. Not a state change
        and no history row (an operator's wake is :meth:`wake_job`); ``dispatched_at`` is
        cleared so a sweeper sends the doorbells."""
        where = [JobsTable.state == State.QUEUED.value, self._not_due()]
        if job_ids is not None:
            where.append(JobsTable.id.in_(list(job_ids)))
        with self.engine.begin() as conn:
            return sorted(
                conn.execute(
                    update(JobsTable)
                    .where(*where)
                    .values(
                        run_after=self.clock.now(),
                        dispatched_at=None,
                        updated_at=self.clock.now(),
                    )
                    .returning(JobsTable.id)
                ).scalars()
            )

    # -- recovery ------------------------------------------------------------------------

    def expire(
        self, job_id: str, owner: str, fence: int, reason: str, *, only_if_expired: bool = False
    ) -> Job | None:
        """Take a RUNNING job from an owner that lost its lease or is known dead: back to
        QUEUED with the attempt counted, or FAILED once its attempts are exhausted. Fenced on
        the owner and fence the caller saw, so of several sweepers exactly one moves the job;
        ``only_if_expired`` re-checks the lease inside the same statement (the owner may have
        renewed since the caller looked)."""
        stale = [JobsTable.owner == owner, JobsTable.fence == fence]
        if only_if_expired:
            stale.append(JobsTable.lease_until <= self.clock.now())
        with self.engine.begin() as conn:
            row = requeue_or_fail(
                self.statements,
                conn,
                job_id,
                stale,
                owner=owner,
                fence=fence,
                error=reason,
                reason=reason,
                run_after=self.clock.now(),
            )
            return None if row is None else Job.from_row(row)

    def sweep_expired(self, limit: int = 100) -> list[Job]:
        """Move every RUNNING job whose lease ran out (``lease_until <= now``) back to QUEUED
        with the attempt counted, or to FAILED when no attempts remain."""
        now = self.clock.now()
        with self.statements.read() as conn:
            candidates: Sequence[Any] = conn.execute(
                select(JobsTable.id, JobsTable.owner, JobsTable.fence)
                .where(JobsTable.state == State.RUNNING.value, JobsTable.lease_until <= now)
                .order_by(JobsTable.lease_until)
                .limit(limit)
            ).all()
        moved = []
        for candidate in candidates:
            job = self.expire(
                candidate.id,
                candidate.owner or "",
                candidate.fence,
                "lease expired",
                only_if_expired=True,
            )
            if job is not None:
                moved.append(job)
        return moved


__all__ = ["Operations"]
