"""An owner's life with a job, from claim to outcome: the claim, steps recorded mid-run,
and the moves that end the run (complete, fail, retry) or pause it (release, sleep, wait
for approval). Its lease is renewed by :mod:`jobs._store.leases`, its progress written by
:mod:`jobs._store.progress_writes`.

Every write after the claim is fenced (:meth:`Statements.fenced`): it matches the row only
while the claim still owns it under an unexpired lease, so a stale owner writes nothing
and learns why (:class:`LeaseLost`). On PostgreSQL the claim and each owner's move is one
reusable statement sent in autocommit mode, on the driver's cursor (the hot path).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Executable,
    Row,
    bindparam,
    exists,
    literal,
    or_,
    select,
)

from jobs._core.errors import StepError
from jobs._core.kind_versions import KindVersions
from jobs._core.records import Claim, Job, Moved, PendingStep
from jobs._core.states import State
from jobs._core.validate import check_name, encode_json
from jobs._store.admission import locked_limits, running_of_kind
from jobs._store.clauses import ReusableStatement, kind_in, param
from jobs._store.db import retry_on_disconnect
from jobs._store.deferred import completion_ended, hold, holds_now
from jobs._store.driver import run_together
from jobs._store.flights import first_in_flight, flies, move_in_flight, owner_write_in_flight
from jobs._store.key_limits import (
    key_lock,
    move_freeing_slot,
    per_key_limited,
    rate_holds_row,
    running_of_key,
    under_key_limit,
)
from jobs._store.liveness_locks import owner_lock_released
from jobs._store.moves import step_params
from jobs._store.pause_clauses import not_paused
from jobs._store.rate_limits import claim_bounds, refused_by_rate
from jobs._store.requeue import requeue_or_fail
from jobs._store.row_changes import OwnerMove, RowChanges
from jobs._store.statements import Statements
from jobs._store.tables import JobsTable, KindLimitsTable, StepsTable, TransitionsTable
from jobs._store.version_clauses import (
    claim_key,
    recording_versions,
    runs_recorded_version,
    version_change,
)
from jobs._store.workflows import Workflows


class Ownership:
    """What the owner of a claim does (see the module's docstring)."""

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

    # -- the claim -------------------------------------------------------------------------

    def claim(
        self,
        job_id: str,
        owner: str,
        lease_seconds: float,
        *,
        liveness_key: int | None = None,
        kinds: Sequence[str] | None = None,
        keyed_first: bool = False,
        versions: KindVersions | None = None,
    ) -> Claim | None:
        """Take the job if it is QUEUED and due, or RUNNING with attempts left under a lease
        that expired or whose owner process is gone (its liveness lock was released).
        ``None`` means someone else owns it or it is not claimable now.

        On PostgreSQL a kind without a running limit is claimed by one autocommit statement
        (the claim, its history row, and whether recorded steps exist); only when that finds
        nothing does a second try lock the job's concurrency key (a kind limited per key
        only: two reusable statements in one transaction) or the kind's limits row, and
        count the running jobs. ``keyed_first`` (the job's kind declares a concurrency key)
        tries the per-key claim before the one-statement claim. ``versions``: this worker's
        versions of its kinds (:mod:`jobs._store.version_clauses`): the first claim records
        the job's, and a job recorded under one this worker does not run is not claimed. A
        rate-limited kind is claimed in the locked transaction, which takes a start of its
        rates (:func:`jobs._store.rate_limits.take_starts`) or rolls the claim back."""
        statements = self.statements

        def claimable() -> list[ColumnElement[bool]]:
            where = [self.claimable()]
            if kinds is not None:
                where.append(kind_in(kinds))
            return [*where, *runs_recorded_version(versions)]

        def claim_statement(limited: Callable[[], ColumnElement[bool]]) -> Callable[[], Executable]:
            """The claim's reusable statement with ``limited()`` in its WHERE (built only
            when the statement is: a clause is more Python than running the statement)."""

            def build() -> Executable:
                return statements.transition_statement(
                    param("p_job_id"),
                    State.RUNNING,
                    where=[*claimable(), limited()],
                    values={
                        "owner": param("p_owner"),
                        "fence": JobsTable.fence + 1,
                        "lease_until": statements.after_bound("lease"),
                        "attempts": JobsTable.attempts + 1,
                        "liveness_key": bindparam("key", type_=JobsTable.liveness_key.type),
                        **recording_versions(versions),
                    },
                    owner=lambda: param("p_owner"),
                    reason=literal("claimed", TransitionsTable.reason.type),
                    approved_by=literal(None, TransitionsTable.approved_by.type),
                )

            return build

        kinds_key = claim_key(kinds, versions)  # one statement per kinds and their versions
        params = {
            "p_job_id": job_id,
            "p_owner": owner,
            "lease": float(lease_seconds),
            "key": liveness_key,
        }

        def unlimited() -> Row[Any] | None:
            """PostgreSQL: the claim of a kind without a running limit, one statement."""

            def no_running_limit() -> ColumnElement[bool]:
                return ~exists(
                    select(KindLimitsTable.kind).where(
                        KindLimitsTable.kind == JobsTable.kind,
                        KindLimitsTable.max_running.is_not(None)
                        | per_key_limited()
                        | rate_holds_row(),
                    )
                )

            build = claim_statement(no_running_limit)
            statement = ReusableStatement(("claim", kinds_key), build, params)
            if flies(statements):  # jobs share this process: the claim joins a flight
                return first_in_flight(statements, statement, job_id, "claim")  # type: ignore[no-any-return]
            with statements.unit(None, one_statement=True) as conn:
                row: Row[Any] | None = statements.one_reusable(conn, statement)
                return row

        def keyed() -> tuple[int | None, Row[Any] | None]:
            """PostgreSQL: the claim of a job with a key, of a kind limited per key only:
            the key's lock, then the claim counting the key's RUNNING jobs, two reusable
            statements in one transaction (one flight on the driver). ``(None, None)``:
            not such a job (neither statement found its row)."""
            lock_values = {"p_job_id": job_id}  # no instant in it: no clock values
            values = {**params, **self.clock.values()}
            build = claim_statement(lambda: under_key_limit(self.clock))
            claim_key = ("claim", "key", kinds_key)
            if statements.on_driver:
                with statements.unit(None, one_statement=True) as conn:
                    lock, found = run_together(
                        conn,
                        [
                            (
                                statements.driver_statement(("key lock",), key_lock, lock_values),
                                lock_values,
                            ),
                            (statements.driver_statement(claim_key, build, values), values),
                        ],
                    )
            else:
                with self.engine.begin() as conn:
                    lock = conn.execute(
                        statements.reusable(("key lock",), key_lock), lock_values
                    ).first()
                    found = conn.execute(statements.reusable(claim_key, build), values).first()
            return (None if lock is None else lock.max_running_per_key), found

        if self.engine.dialect.name == "postgresql":
            row = None if keyed_first else retry_on_disconnect(unlimited)
            if row is not None:
                return Claim.from_row(row, owner)
            per_key, row = retry_on_disconnect(keyed)
            if row is not None:
                return Claim.from_row(row, owner, None, per_key)
            if per_key is not None:
                return None  # the key is full
            row = retry_on_disconnect(unlimited) if keyed_first else None
            if row is not None:
                return Claim.from_row(row, owner)
        with self.engine.connect() as conn, conn.begin() as transaction:
            max_running, per_key, rates = claim_bounds(*locked_limits(conn, job_id))
            if max_running is None and per_key is None and not rates and self.on_postgresql:
                return None  # the statement above already tried this claim without a limit
            limited = [] if max_running is None else [running_of_kind(self.clock) < max_running]
            if per_key is not None:
                limited.append(running_of_key(self.clock) < per_key)
            row = statements.transition(
                conn,
                job_id,
                State.RUNNING,
                where=[*claimable(), *limited],
                changes=RowChanges(
                    owner=owner,
                    fence=JobsTable.fence + 1,
                    lease_until=self.clock.after(lease_seconds),
                    attempts=JobsTable.attempts + 1,
                    liveness_key=liveness_key,
                    code_version=version_change(versions),
                ),
                owner=owner,
                reason="claimed",
            )
            if row is not None and refused_by_rate(conn, self.clock, row.kind, rates):
                transaction.rollback()  # the rate allows no start yet: nothing claimed
                return None
        return None if row is None else Claim.from_row(row, owner, max_running, per_key, rates)

    def claimable(self) -> ColumnElement[bool]:
        """A job a claim may take now: QUEUED and due, or RUNNING with attempts left under
        a lease that ran out or an owner whose process is gone; and in either case of no
        paused kind and on no paused queue (``jobctl pause``), read in the claim's own
        compare-and-set, so every worker honours a pause from its commit on."""
        now = self.clock.now()
        return (
            or_(
                (JobsTable.state == State.QUEUED.value) & (JobsTable.run_after <= now),
                (JobsTable.state == State.RUNNING.value)
                & (JobsTable.attempts < JobsTable.max_attempts)
                & or_(JobsTable.lease_until <= now, owner_lock_released(JobsTable.liveness_key)),
            )
            & not_paused()
        )

    def next_claimable(self, kinds: Sequence[str] | None = None, limit: int = 10) -> list[str]:
        """IDs of jobs a claim would take now, the highest priority first, then the longest
        due (for in-process draining)."""
        stmt = (
            select(JobsTable.id)
            .where(self.claimable())
            .order_by(JobsTable.priority.desc(), JobsTable.run_after, JobsTable.created_at)
            .limit(limit)
        )
        if kinds is not None:
            stmt = stmt.where(JobsTable.kind.in_(list(kinds)))
        with self.statements.read() as conn:
            return list(conn.execute(stmt).scalars())

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
