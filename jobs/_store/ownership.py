"""An owner's life with a job, from claim to outcome: the claim (its SQL is
:mod:`jobs._store.claiming`'s, which :class:`Ownership` extends), steps recorded mid-run,
and the moves that end the run (complete, fail, retry) or pause it (release, sleep, wait
for approval). Its lease is renewed by :mod:`jobs._store.leases`, its progress written by
:mod:`jobs._store.progress_writes`.

Every write after the claim is fenced (:meth:`Statements.fenced`): it matches the row only
while the claim still owns it under an unexpired lease, so a stale owner writes nothing
and learns why (:class:`LeaseLost`). On PostgreSQL each owner's move is one
reusable statement sent in autocommit mode, on the driver's cursor (the hot path).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Executable,
    select,
)

from jobs._core.errors import StepError
from jobs._core.records import Claim, Job, Moved, PendingStep
from jobs._core.states import State
from jobs._core.validate import check_name, encode_json
from jobs._store.claiming import Claims
from jobs._store.clauses import ReusableStatement, param
from jobs._store.db import retry_on_disconnect
from jobs._store.deferred import completion_ended, hold, holds_now
from jobs._store.flights import flies, move_in_flight, owner_write_in_flight
from jobs._store.key_limits import (
    move_freeing_slot,
)
from jobs._store.moves import step_params
from jobs._store.requeue import requeue_or_fail
from jobs._store.row_changes import OwnerMove, RowChanges
from jobs._store.statements import Statements
from jobs._store.tables import JobsTable, StepsTable
from jobs._store.workflows import Workflows


class Ownership(Claims):
    """What the owner of a claim does (see the module's docstring); the claim itself is
    :class:`jobs._store.claiming.Claims`'s."""

    def __init__(
        self, statements: Statements, workflows: Workflows, max_payload_bytes: int
    ) -> None:
        self.statements = statements
        self.engine = statements.engine
        self.clock = statements.clock
        self.max_payload_bytes = max_payload_bytes
        self.on_postgresql = self.engine.dialect.name == "postgresql"
        # A child's end also counts it down in its waiting parent
        # (:meth:`jobs._store.workflows.Workflows.finish_child`).
        self.workflows = workflows

    # -- steps -----------------------------------------------------------------------------

    def pending_step(
        self,
        name: str,
        output: Any,
        position: int | None = None,
        progress: dict[str, Any] | None = None,
    ) -> PendingStep:
        """Check a step's name and output and return them ready to record (at ``position``
        in the handler's calls, with the job's ``progress`` at the step's end, if any): a
        value that can never be stored is refused here, before any write."""
        check_name(name, "step name")
        text = encode_json(output, f"output of step {name!r}", self.max_payload_bytes)
        return PendingStep(name, json.loads(text), text, position=position, progress=progress)

    def record_steps(self, claim: Claim, steps: Sequence[PendingStep]) -> None:
        """Record step outputs, fenced: one INSERT … SELECT that finds the job row only while
        the claim still owns it."""
        if not steps:
            return
        statements = self.statements
        params: dict[str, Any] = {
            "p_job_id": claim.job_id,
            "p_owner": claim.owner,
            "p_fence": claim.fence,
        }
        params.update(step_params(steps))

        def build() -> Executable:
            owned = (
                select(JobsTable.id)
                .where(*statements.fenced_on(param("p_job_id"), param("p_owner"), param("p_fence")))
                .subquery("owned")
            )
            insert_steps: Executable = statements.steps_insert(
                owned,
                statements.bound_steps(len(steps)),
                lambda: param("p_owner"),
                lambda: param("p_fence"),
            ).returning(StepsTable.job_id)
            return insert_steps

        statement = ReusableStatement(("record", len(steps)), build, params)

        def attempt() -> None:
            if flies(statements):  # jobs share this process: the record joins a flight
                owner_write_in_flight(statements, claim, State.RUNNING, statement, steps)
                return
            with (
                statements.unit(None, one_statement=True) as conn,
                statements.recording(claim.job_id, steps),
            ):
                if statements.one_reusable(conn, statement) is None:
                    raise statements.explain(conn, claim.job_id, State.RUNNING, claim)

        retry_on_disconnect(attempt)

    def record_step(self, claim: Claim, name: str, output: Any) -> None:
        """Record one step's output now (see :meth:`record_steps`)."""
        self.record_steps(claim, [self.pending_step(name, output)])

    # -- the run's end ---------------------------------------------------------------------

    def complete(
        self,
        claim: Claim,
        result: Any = None,
        *,
        steps: Sequence[PendingStep] = (),
        rings: bool = False,
    ) -> Moved:
        """RUNNING → COMPLETED with the result, recording ``steps`` in the same statement.
        In a worker that holds completions (:mod:`jobs._store.deferred`) and is busy,
        the move of a job without a parent, of a kind without a running limit (of the kind
        or of the job's key), is held for
        the next flight, and the job returned is the claimed one (still RUNNING). In a
        worker whose jobs share the process, it is committed before this returns, in a
        flight shared with the completions of the jobs beside it
        (:mod:`jobs._store.flights`). A child's completion that queues its waiting
        parent owes the parent's doorbell when the caller ``rings`` (see
        :meth:`Workflows.finish_child`), and a completion that frees a slot of its
        concurrency key owes the doorbell of the key's next held job (read in the same
        flight: :func:`jobs._store.key_limits.move_freeing_slot`)."""
        encode_json(result, "result", self.max_payload_bytes)
        changes = RowChanges.finished(self.clock.now(), result=result)
        move = OwnerMove(claim, State.COMPLETED, changes, "completed", steps)
        if claim.job.parent_id is not None:
            return self.workflows.finish_child(move, rings=rings)
        statements = self.statements
        if flies(statements):  # jobs share this process: committed in a shared flight
            statement = statements.owner_move_statement(move)
            return Moved(move_in_flight(statements, claim, State.COMPLETED, statement, steps))
        if claim.max_running_per_key is not None and claim.job.concurrency_key is not None:
            # Never held (that would keep the slot taken); the key's next job rung after.
            completed, waiting = move_freeing_slot(statements, move)
            return Moved(completed, () if waiting is None or not rings else (waiting,))
        plain = claim.max_running is None
        if plain and holds_now(statements):
            hold(statements, statements.owner_move_statement(move), claim.job_id, "completion")
            completion_ended(statements, held=True)
            return Moved(claim.job)
        completed = statements.owner_move(move)
        if plain:
            completion_ended(statements, held=False)
        return Moved(completed)

    def fail(
        self,
        claim: Claim,
        error: str,
        *,
        steps: Sequence[PendingStep] = (),
        rings: bool = False,
    ) -> Moved:
        """The owner's FAILED, with the error as the reason and the pending steps recorded
        in the same statement; refused (:class:`LeaseLost`) once the claim is no longer live.
        A child's failure owes its parent's doorbell as a completion does (:meth:`complete`)."""
        changes = RowChanges.finished(self.clock.now(), last_error=error)
        move = OwnerMove(claim, State.FAILED, changes, error, steps)
        if claim.job.parent_id is not None:
            return self.workflows.finish_child(move, rings=rings)
        return Moved(self.statements.owner_move(move))

    def retry(
        self,
        claim: Claim,
        error: str,
        delay_seconds: float,
        *,
        steps: Sequence[PendingStep] = (),
    ) -> Job:
        """Back to QUEUED after an error, due again in ``delay_seconds``; FAILED instead once
        the job's attempts are exhausted. ``steps`` that ran before the error are recorded."""
        with self.engine.begin() as conn:
            row = requeue_or_fail(
                self.statements,
                conn,
                claim.job_id,
                self.statements.fenced(claim),
                owner=claim.owner,
                fence=claim.fence,
                error=error,
                reason=f"retry: {error}",
                run_after=self.clock.after(delay_seconds),
                steps=steps,
            )
            if row is None:
                raise self.statements.explain(conn, claim.job_id, State.QUEUED, claim)
            return Job.from_row(row)

    # -- pauses ----------------------------------------------------------------------------

    def release(self, claim: Claim, reason: str, *, steps: Sequence[PendingStep] = ()) -> Job:
        """Give the job back to the queue without counting the attempt: the run did not fail,
        it stopped at a step boundary (a delivery that ran long, a worker shutting down)."""
        now = self.clock.now()
        changes = RowChanges.given_back(run_after=now, dispatched_at=now)
        return self.statements.owner_move(OwnerMove(claim, State.QUEUED, changes, reason, steps))

    def sleep(
        self,
        claim: Claim,
        name: str,
        wake_at: dt.datetime,
        *,
        steps: Sequence[PendingStep] = (),
        position: int | None = None,
    ) -> Job:
        """A durable timer: back to QUEUED due at ``wake_at``, with the timer recorded as step
        ``name`` (``{"wake_at": …}``) and ``steps`` in the same fenced write. The attempt is
        given back (a sleep is not a failure) and no doorbell is owed: ``dispatched_at`` is
        cleared, so the sweeper rings it once due, and a claim before then (a
        stray doorbell) finds it not due."""
        check_name(name, "timer name")
        instant = wake_at.astimezone(dt.UTC)
        timer = self.pending_step(name, {"wake_at": instant.isoformat()}, position)
        changes = RowChanges.given_back(run_after=instant, dispatched_at=None)
        reason = f"sleep until {instant.isoformat()} (timer {name!r})"
        move = OwnerMove(claim, State.QUEUED, changes, reason, [*steps, timer])
        return self.statements.owner_move(move)

    def wait_for_approval(
        self,
        claim: Claim,
        reason: str,
        step_name: str,
        *,
        steps: Sequence[PendingStep] = (),
        timeout: float | None = None,
        position: int | None = None,
    ) -> Job:
        """Park the job and release the lease; the pause gives back its attempt. The approval
        will be recorded as step ``step_name``. With ``timeout`` (seconds, database clock)
        the sweeper gives up the wait then (:meth:`Workflows.fire_deadlines`)."""
        check_name(step_name, "approval step name")
        with self.engine.begin() as conn:
            row = self.statements.owned_transition(
                conn,
                claim,
                State.WAITING_APPROVAL,
                RowChanges.parked(
                    step_name, None if timeout is None else self.clock.after(timeout), position
                ),
                reason=reason,
                steps=steps,
            )
            if row is None:
                raise self.statements.explain(conn, claim.job_id, State.WAITING_APPROVAL, claim)
            if (
                conn.execute(
                    select(StepsTable.name).where(
                        StepsTable.job_id == claim.job_id, StepsTable.name == step_name
                    )
                ).first()
                is not None
            ):
                # The approval could never be recorded: refuse (the exception rolls back the
                # move, so a stale owner still learns of its lost lease first).
                raise StepError(
                    f"job {claim.job_id!r}: step {step_name!r} is already recorded; "
                    "an approval needs a step name of its own"
                )
            return Job.from_row(row)


__all__ = ["Ownership"]
