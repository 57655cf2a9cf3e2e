"""The job store: the one package that writes the job tables.

:class:`JobStore` is the facade the rest of the code calls; each part behind it owns one
concern, and all share one execution layer (one statement cache, one clock):

- :mod:`~jobs.core.store.statements`: building, caching and running statements (through
  SQLAlchemy, or PostgreSQL's driver for the hot path); the fenced predicate; the state
  move with its history row; recording steps.
- :mod:`~jobs.core.store.submissions`: new jobs, one or many; admission; kinds' limits.
- :mod:`~jobs.core.store.ownership`: an owner's life, claim to outcome: renewals, steps,
  complete, fail, retry, hand-back, sleep, waiting for approval.
- :mod:`~jobs.core.store.operations`: what operators and the sweeper do to jobs they do
  not own: approve, cancel, wake, retry (one job, or a selected batch), expire, sweep.
- :mod:`~jobs.core.store.doorbells`: which doorbells are due; marking failed ones unrung.
- :mod:`~jobs.core.store.row_changes`: what a state move writes besides the state.
- :mod:`~jobs.core.store.schedules`: periodic ticks, retention, counters.
- :mod:`~jobs.core.store.workflows`: children (spawn, fan-in), events, wait deadlines;
  :mod:`~jobs.core.store.fan_in`: a finishing child's countdown of its parent.
- :mod:`~jobs.core.store.deferred`: a completion held for the next claim's flight, and
  writes held through a database outage; :mod:`~jobs.core.store.flights`: the completions
  of jobs that share a process, many in one flight.

Reads are :class:`jobs.core.reader.JobReader`'s, composed in (``store.reader``) and
exposed here too (:mod:`~jobs.core.store.reads`). Every state change is a single
compare-and-set UPDATE whose WHERE clause carries the allowed source states from
:data:`jobs.core.states.TRANSITIONS` (and, for an owner's writes, the owner, the fence
and an unexpired lease on the database clock). Zero rows matched means the change was
not allowed; the store then reads the row once to say why (unknown job, illegal
transition, lease lost) and has changed nothing.
Each change appends a row to the history in the same transaction.
"""

from __future__ import annotations

import builtins
import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine

from jobs.core.clock import Clock, DatabaseClock
from jobs.core.errors import LeaseLost
from jobs.core.reader import JobReader
from jobs.core.records import (
    BulkOutcome,
    Claim,
    Doorbell,
    Job,
    KindLimits,
    PendingStep,
    Selected,
    Step,
    Transition,
)
from jobs.core.schedule import Schedule
from jobs.core.store.deferred import hold_completions
from jobs.core.store.doorbells import Doorbells
from jobs.core.store.flights import share_flights
from jobs.core.store.operations import Operations
from jobs.core.store.ownership import Ownership
from jobs.core.store.reads import StoreReads
from jobs.core.store.schedules import Schedules
from jobs.core.store.statements import Statements
from jobs.core.store.submissions import Submissions
from jobs.core.store.workflows import Workflows


class JobStore(StoreReads):
    """Every write to the job tables, and the reads (see the package's docstring).

    **Unit of work.** Every write takes an optional ``conn``: a SQLAlchemy ``Connection``
    inside the caller's transaction. Given one, the write joins that transaction (it
    commits or rolls back with the caller's own work, and nothing is committed here);
    without one, the store runs the write on its own engine. On PostgreSQL an owner's
    write is one statement, sent in autocommit mode (no ``BEGIN``/``COMMIT`` round trips);
    writes of several statements (admission, limited claims) run in one transaction.

    **Executors.** ``on_driver`` (the default) runs the hot path's reusable statements on
    PostgreSQL's driver (psycopg) directly; off, the same statements run through
    SQLAlchemy's execution. The store contract suite runs over both, and SQLite.
    """

    def __init__(
        self,
        engine: Engine,
        clock: Clock | None = None,
        max_payload_bytes: int = 1_048_576,
        *,
        on_driver: bool = True,
    ) -> None:
        self.engine = engine
        self.clock: Clock = clock or DatabaseClock()
        self.max_payload_bytes = max_payload_bytes
        self.reader = JobReader(engine, self.clock, max_payload_bytes)
        self.statements = Statements(engine, self.clock, on_driver=on_driver)
        self.submissions = Submissions(self.statements, max_payload_bytes)
        self.ownership = Ownership(self.statements, max_payload_bytes)
        self.operations = Operations(self.statements, self.ownership)
        self.doorbells = Doorbells(self.statements)
        self.scheduling = Schedules(self.statements, self.submissions, self.reader)
        self.workflows = Workflows(self.statements, self.submissions, max_payload_bytes)
        self.ownership.finish_child = self.workflows.finish_child
        self.operations.workflows = self.workflows

    # -- submissions and admission --------------------------------------------
    def new_job_values(
        self,
        kind: str,
        inputs: Any,
        *,
        job_id: str,
        max_attempts: int,
        delay_seconds: float,
        code_version: str | None,
        run_at: dt.datetime | None = None,
        priority: int = 0,
        queue: str | None = None,
    ) -> dict[str, Any]:
        """Validate one submission and return its row; raises before anything is written.
        (:meth:`Submissions.new_job_values`)"""
        return self.submissions.new_job_values(
            kind,
            inputs,
            job_id=job_id,
            max_attempts=max_attempts,
            delay_seconds=delay_seconds,
            code_version=code_version,
            run_at=run_at,
            priority=priority,
            queue=queue,
        )

    def create(
        self,
        kind: str,
        inputs: dict[str, Any],
        *,
        job_id: str,
        max_attempts: int,
        delay_seconds: float = 0,
        code_version: str | None = None,
        priority: int = 0,
        conn: Connection | None = None,
        run_at: dt.datetime | None = None,
        queue: str | None = None,
    ) -> tuple[Job, bool]:
        """Insert a QUEUED job. (:meth:`Submissions.create`)"""
        return self.submissions.create(
            kind,
            inputs,
            job_id=job_id,
            max_attempts=max_attempts,
            delay_seconds=delay_seconds,
            code_version=code_version,
            priority=priority,
            conn=conn,
            run_at=run_at,
            queue=queue,
        )

    def create_many(
        self, kind: str, rows: Sequence[dict[str, Any]], *, conn: Connection | None = None
    ) -> list[tuple[Job, bool]]:
        """Insert validated job rows of one kind (from :meth:`new_job_values`) in one transaction.
        (:meth:`Submissions.create_many`)"""
        return self.submissions.create_many(kind, rows, conn=conn)

    def check_admission(self, kind: str, adding: int = 1) -> None:
        """Raise :class:`AdmissionRefused` if ``adding`` new jobs of ``kind`` would not fit in its
        ``max_queued`` now; writes nothing (the check's transaction rolls back).
        (:meth:`Submissions.check_admission`)"""
        return self.submissions.check_admission(kind, adding)

    def set_limits(
        self,
        kind: str,
        *,
        max_running: int | None,
        max_queued: int | None,
        only_if_absent: bool = False,
        conn: Connection | None = None,
    ) -> KindLimits:
        """Set (or, with ``only_if_absent``, seed) a kind's limits; ``None`` means no limit.
        (:meth:`Submissions.set_limits`)"""
        return self.submissions.set_limits(
            kind,
            max_running=max_running,
            max_queued=max_queued,
            only_if_absent=only_if_absent,
            conn=conn,
        )

    # -- ownership: claim to outcome -------------------------------------------
    def claim(
        self,
        job_id: str,
        owner: str,
        lease_seconds: float,
        *,
        liveness_key: int | None = None,
        kinds: Sequence[str] | None = None,
    ) -> Claim | None:
        """Take the job if it is QUEUED and due, or RUNNING with attempts left under a lease that
        expired or whose owner process is gone (its liveness lock was released).
        (:meth:`Ownership.claim`)"""
        return self.ownership.claim(
            job_id, owner, lease_seconds, liveness_key=liveness_key, kinds=kinds
        )

    def next_claimable(self, kinds: Sequence[str] | None = None, limit: int = 10) -> list[str]:
        """IDs of jobs a claim would take now, the highest priority first, then the longest due (for
        in-process draining). (:meth:`Ownership.next_claimable`)"""
        return self.ownership.next_claimable(kinds, limit)

    def renew(self, claim: Claim, lease_seconds: float) -> dt.datetime:
        """Push one claim's lease out, only while it is still ours and unexpired.
        (:meth:`Ownership.renew`)"""
        return self.ownership.renew(claim, lease_seconds)

    def renew_leases(
        self, owner: str, claims: Sequence[tuple[str, int]], lease_seconds: float
    ) -> set[str]:
        """A process's heartbeat. (:meth:`Ownership.renew_leases`)"""
        return self.ownership.renew_leases(owner, claims, lease_seconds)

    def why_lost(self, claim: Claim) -> LeaseLost:
        """Why ``claim`` no longer holds its job, read from the row after one of its fenced writes
        (a renewal) matched nothing. (:meth:`Ownership.why_lost`)"""
        return self.ownership.why_lost(claim)

    def pending_step(self, name: str, output: Any) -> PendingStep:
        """Check a step's name and output and return them ready to record.
        (:meth:`Ownership.pending_step`)"""
        return self.ownership.pending_step(name, output)

    def record_steps(self, claim: Claim, steps: Sequence[PendingStep]) -> None:
        """Record step outputs, fenced. (:meth:`Ownership.record_steps`)"""
        return self.ownership.record_steps(claim, steps)

    def record_step(self, claim: Claim, name: str, output: Any) -> None:
        """Record one step's output now. (:meth:`Ownership.record_step`)"""
        return self.ownership.record_step(claim, name, output)

    def hold_completions(self, flush_after: float, keep_trying_for: float = 0.0) -> None:
        """A worker's pool process: hold each plain completion for the next flight, so a
        one-step job costs one round trip (:mod:`jobs.core.store.deferred`); one with no
        statement after it is sent alone after ``flush_after`` seconds, and tried again
        through a database outage for ``keep_trying_for`` seconds after it was held.
        (:func:`jobs.core.store.deferred.hold_completions`)"""
        hold_completions(self.statements, flush_after, keep_trying_for)

    def share_flights(self) -> None:
        """Jobs share this process (threads, gevent): each claim, step record and completion
        commits before it returns, many in one flight. (:func:`.flights.share_flights`)"""
        share_flights(self.statements)

    def flush_held(self) -> None:
        """Send a held completion now, if any (a process about to stop, a test)."""
        if self.statements.held is not None:
            self.statements.held.flush()

    def complete(
        self, claim: Claim, result: Any = None, *, steps: Sequence[PendingStep] = ()
    ) -> Job:
        """RUNNING → COMPLETED with the result, recording ``steps`` in the same statement.
        (:meth:`Ownership.complete`)"""
        return self.ownership.complete(claim, result, steps=steps)

    def fail(self, claim: Claim, error: str, *, steps: Sequence[PendingStep] = ()) -> Job:
        """The owner's FAILED, with the error as the reason and the pending steps recorded in the
        same statement; refused (:class:`LeaseLost`) once the claim is no longer live.
        (:meth:`Ownership.fail`)"""
        return self.ownership.fail(claim, error, steps=steps)

    def retry(
        self, claim: Claim, error: str, delay_seconds: float, *, steps: Sequence[PendingStep] = ()
    ) -> Job:
        """Back to QUEUED after an error, due again in ``delay_seconds``; FAILED instead once the
        job's attempts are exhausted. (:meth:`Ownership.retry`)"""
        return self.ownership.retry(claim, error, delay_seconds, steps=steps)

    def release(self, claim: Claim, reason: str, *, steps: Sequence[PendingStep] = ()) -> Job:
        """Give the job back to the queue without counting the attempt.
        (:meth:`Ownership.release`)"""
        return self.ownership.release(claim, reason, steps=steps)

    def sleep(
        self, claim: Claim, name: str, wake_at: dt.datetime, *, steps: Sequence[PendingStep] = ()
    ) -> Job:
        """A durable timer. (:meth:`Ownership.sleep`)"""
        return self.ownership.sleep(claim, name, wake_at, steps=steps)

    def wait_for_approval(
        self,
        claim: Claim,
        reason: str,
        step_name: str,
        *,
        steps: Sequence[PendingStep] = (),
        timeout: float | None = None,
    ) -> Job:
        """Park the job and release the lease; the pause gives back its attempt; ``timeout``
        gives the wait a deadline. (:meth:`Ownership.wait_for_approval`)"""
        return self.ownership.wait_for_approval(
            claim, reason, step_name, steps=steps, timeout=timeout
        )

    # -- workflows: children, events, deadlines ------------------------------------------
    def spawn(
        self,
        claim: Claim,
        kind: str,
        rows: Sequence[dict[str, Any]],
        records: Sequence[PendingStep],
    ) -> builtins.list[tuple[Job, bool]]:
        """Insert children and record the spawn, fenced, in one transaction.
        (:meth:`Workflows.spawn`)"""
        return self.workflows.spawn(claim, kind, rows, records)

    def wait_for_children(
        self,
        claim: Claim,
        child_ids: Sequence[str],
        step_name: str,
        *,
        steps: Sequence[PendingStep] = (),
    ) -> Job:
        """Park the claimed job WAITING until its unfinished children among ``child_ids`` end.
        (:meth:`Workflows.wait_for_children`)"""
        return self.workflows.wait_for_children(claim, child_ids, step_name, steps=steps)

    def consume_event(self, claim: Claim, name: str, step_name: str) -> PendingStep | None:
        """Consume a kept event ``name`` and record it as step ``step_name``, fenced.
        (:meth:`Workflows.consume_event`)"""
        return self.workflows.consume_event(claim, name, step_name)

    def wait_for_event(
        self,
        claim: Claim,
        name: str,
        step_name: str,
        timeout: float | None,
        *,
        steps: Sequence[PendingStep] = (),
    ) -> Job:
        """Park the claimed job WAITING for event ``name`` until ``timeout``.
        (:meth:`Workflows.wait_for_event`)"""
        return self.workflows.wait_for_event(claim, name, step_name, timeout, steps=steps)

    def send_event(
        self, job_id: str, name: str, payload: Any = None, *, conn: Connection | None = None
    ) -> Job | None:
        """Send an event to a job; returns the job if it was waiting for it (now QUEUED).
        (:meth:`Workflows.send_event`)"""
        return self.workflows.send_event(job_id, name, payload, conn=conn)

    def fire_deadlines(self, limit: int = 100) -> builtins.list[Job]:
        """Waits whose deadline passed back to QUEUED, timed out.
        (:meth:`Workflows.fire_deadlines`)"""
        return self.workflows.fire_deadlines(limit)

    def wake_stranded_parents(self, limit: int = 100) -> builtins.list[Job]:
        """The sweeper's safety net for parents no unfinished child will wake.
        (:meth:`Workflows.wake_stranded_parents`)"""
        return self.workflows.wake_stranded_parents(limit)

    def children(self, parent_id: str) -> builtins.list[Job]:
        """The job's children, oldest first. (:meth:`JobReader.children`)"""
        return self.reader.children(parent_id)

    def jobs_by_id(self, job_ids: Sequence[str]) -> builtins.list[Job]:
        """The jobs ``job_ids`` that exist, in that order. (:meth:`JobReader.jobs_by_id`)"""
        return self.reader.jobs_by_id(job_ids)

    # -- operators and recovery ------------------------------------------------
    def approve(
        self, job_id: str, by: str, note: str | None = None, *, conn: Connection | None = None
    ) -> Job:
        """WAITING_APPROVAL -> QUEUED, recording who approved (and why) as the job's approval step
        so the handler's re-run continues past the wait. (:meth:`Operations.approve`)"""
        return self.operations.approve(job_id, by, note, conn=conn)

    def cancel(
        self,
        job_id: str,
        reason: str = "cancelled by an operator",
        *,
        conn: Connection | None = None,
    ) -> Job:
        """Cancel a job that has not finished; a running owner finds out at its next fenced write
        (refused), and writes nothing more. (:meth:`Operations.cancel`)"""
        return self.operations.cancel(job_id, reason, conn=conn)

    def retry_job(
        self,
        job_id: str,
        by: str,
        reason: str = "retried by an operator",
        *,
        from_start: bool = False,
        conn: Connection | None = None,
    ) -> Job:
        """An operator's retry: FAILED or CANCELLED -> QUEUED with a fresh budget of attempts
        and the fence bumped, the recorded steps kept (or, ``from_start``, dropped).
        (:meth:`Operations.retry`)"""
        return self.operations.retry(job_id, by, reason, from_start=from_start, conn=conn)

    def retry_selected(
        self,
        selected: Sequence[Selected],
        by: str,
        reason: str = "retried by an operator",
        *,
        from_start: bool = False,
    ) -> BulkOutcome:
        """An operator's retry of one batch of selected jobs, each only while still as
        selected. (:meth:`Operations.retry_selected`)"""
        return self.operations.retry_selected(selected, by, reason, from_start=from_start)

    def cancel_selected(
        self, selected: Sequence[Selected], reason: str = "cancelled by an operator"
    ) -> BulkOutcome:
        """Cancel one batch of selected jobs, each only while still as selected.
        (:meth:`Operations.cancel_selected`)"""
        return self.operations.cancel_selected(selected, reason)

    def approve_selected(
        self, selected: Sequence[Selected], by: str, note: str | None = None
    ) -> BulkOutcome:
        """Approve one batch of selected jobs, each only while still as selected.
        (:meth:`Operations.approve_selected`)"""
        return self.operations.approve_selected(selected, by, note)

    def wake_job(
        self, job_id: str, reason: str = "woken by an operator", *, conn: Connection | None = None
    ) -> Job:
        """An operator's wake. (:meth:`Operations.wake_job`)"""
        return self.operations.wake_job(job_id, reason, conn=conn)

    def make_due(self, job_ids: Sequence[str] | None = None) -> list[str]:
        """Make QUEUED jobs that are not due yet (sleeping, delayed, backing off) due now.
        (:meth:`Operations.make_due`)"""
        return self.operations.make_due(job_ids)

    def expire(
        self, job_id: str, owner: str, fence: int, reason: str, *, only_if_expired: bool = False
    ) -> Job | None:
        """Take a RUNNING job from an owner that lost its lease or is known dead.
        (:meth:`Operations.expire`)"""
        return self.operations.expire(job_id, owner, fence, reason, only_if_expired=only_if_expired)

    def sweep_expired(self, limit: int = 100) -> list[Job]:
        """Move every RUNNING job whose lease ran out (``lease_until <= now``) back to QUEUED with
        the attempt counted, or to FAILED when no attempts remain.
        (:meth:`Operations.sweep_expired`)"""
        return self.operations.sweep_expired(limit)

    # -- doorbell bookkeeping --------------------------------------------------
    def take_due_doorbell_ids(
        self, stale_seconds: float, limit: int = 100, stale_limit: int | None = None
    ) -> list[str]:
        """The IDs of :meth:`take_due_doorbells`, in the order they are to be rung.
        (:meth:`Doorbells.take_due_doorbell_ids`)"""
        return self.doorbells.take_due_doorbell_ids(stale_seconds, limit, stale_limit)

    def take_due_doorbells(
        self, stale_seconds: float, limit: int = 100, stale_limit: int | None = None
    ) -> list[Doorbell]:
        """QUEUED jobs that are due and were never published, or published more than
        ``stale_seconds`` ago without being claimed (the message was lost).
        (:meth:`Doorbells.take_due_doorbells`)"""
        return self.doorbells.take_due_doorbells(stale_seconds, limit, stale_limit)

    def mark_unrung(self, job_ids: Sequence[str]) -> None:
        """A publish failed. (:meth:`Doorbells.mark_unrung`)"""
        return self.doorbells.mark_unrung(job_ids)

    # -- schedules, retention, counters -----------------------------------------
    def put_schedule(self, schedule: Schedule) -> Schedule:
        """Create or update a schedule by name. (:meth:`Schedules.put_schedule`)"""
        return self.scheduling.put_schedule(schedule)

    def delete_schedule(self, name: str) -> bool:
        """Stop a schedule; jobs it already submitted are left alone.
        (:meth:`Schedules.delete_schedule`)"""
        return self.scheduling.delete_schedule(name)

    def advance_schedule(
        self, name: str, tick: dt.datetime, *, conn: Connection | None = None
    ) -> bool:
        """Move ``last_tick`` to ``tick`` if it is behind. (:meth:`Schedules.advance_schedule`)"""
        return self.scheduling.advance_schedule(name, tick, conn=conn)

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
        """Submit ``tick``'s job and move the schedule past it, in one transaction.
        (:meth:`Schedules.fire_tick`)"""
        return self.scheduling.fire_tick(
            schedule,
            tick,
            job_id=job_id,
            max_attempts=max_attempts,
            code_version=code_version,
            priority=priority,
            queue=queue,
        )

    def prune_finished(self, older_than_seconds: float, batch_size: int = 500) -> list[str]:
        """Delete one batch of finished jobs (COMPLETED, FAILED, CANCELLED) that finished more than
        ``older_than_seconds`` ago on the database clock, with their steps and history, oldest
        first, in one short transaction; returns their IDs (fewer than ``batch_size`` means
        nothing more is due). (:meth:`Schedules.prune_finished`)"""
        return self.scheduling.prune_finished(older_than_seconds, batch_size)

    def count_event(self, name: str, kind: str, amount: int = 1, *, wait: bool = True) -> None:
        """Add ``amount`` to an operational counter (``recovery_dead_owner``, ``lost_message``,
        ``admission_refused`` …) for a kind; never touches a job. (:meth:`Schedules.count_event`)"""
        return self.scheduling.count_event(name, kind, amount, wait=wait)


__all__ = [
    "BulkOutcome",
    "Claim",
    "Job",
    "JobReader",
    "JobStore",
    "KindLimits",
    "PendingStep",
    "Step",
    "Transition",
]
