"""Doorbell bookkeeping: which due jobs are owed a doorbell (never sent, or sent so long
ago that the message counts as lost), marked sent in the same statement so concurrent
sweepers do not both send; marking unrung a doorbell whose publish failed; and ringing sooner,
by a random part of the delay, one a worker dropped for its job's version. None of these
writes moves a job between states.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Row, or_, select, update

from jobs._core.records import Claim, Doorbell, Job, KindLimits
from jobs._core.states import State
from jobs._store.key_limits import key_full
from jobs._store.pause_clauses import not_paused
from jobs._store.rate_limits import held_doorbells, hold_for_rate, rate_limited, ring_next_held
from jobs._store.statements import Statements
from jobs._store.tables import JobsTable


class Doorbells:
    """Due doorbells and forgotten ones (see the module's docstring)."""

    def __init__(self, statements: Statements) -> None:
        self.engine = statements.engine
        self.clock = statements.clock

    def take_due_doorbell_ids(
        self, stale_seconds: float, limit: int = 100, stale_limit: int | None = None
    ) -> list[str]:
        """The IDs of :meth:`take_due_doorbells`, in the order they are to be rung."""
        return [
            doorbell.job_id
            for doorbell in self.take_due_doorbells(stale_seconds, limit, stale_limit)
        ]

    def take_due_doorbells(
        self, stale_seconds: float, limit: int = 100, stale_limit: int | None = None
    ) -> list[Doorbell]:
        """QUEUED jobs that are due and were never published, or published more than
        ``stale_seconds`` ago without being claimed (the message was lost). Marks them
        rung now (``dispatched_at``), in the same statement, so concurrent sweepers do not
        both ring them; the mark re-checks QUEUED, due and unrung, so a job its owner claimed
        and put to sleep (or another sweeper rang) since the selection is left alone.
        ``stale_limit`` caps the second kind: the caller may know that most of those
        doorbells are still waiting in the broker's queue behind a backlog.

        Returned in the order to ring them: the highest priority first, then the longest
        due. Of more never-sent jobs than ``limit``, the higher priorities are taken in this
        pass; of stale ones, those sent the longest ago (the likeliest lost). Jobs of a
        paused kind or queue are not taken: their resume rings them; nor jobs whose
        concurrency key has its ``max_running_per_key`` RUNNING (a sweep after a slot of
        the key frees takes them, if the run that freed it did not ring them already). A
        job held by a rate (never sent) is rung one per bucket whose next start is allowed
        (:func:`jobs._store.rate_limits.held_doorbells`), first."""
        now = self.clock.now()
        stale = self.clock.after(-stale_seconds)
        # A paused job is left alone: no claim would take it (its resume rings it); so is
        # one whose concurrency key is full (a run of the key that ends rings it).
        queued_and_due = [
            JobsTable.state == State.QUEUED.value,
            JobsTable.run_after <= now,
            not_paused(),
            ~key_full(self.clock),
        ]
        # Never sent: the highest priority first. Sent long ago: the longest ago first, as
        # the likeliest lost (when the queue is short of only a few, those are the few).
        kinds_of_unsent: list[tuple[ColumnElement[bool], int, tuple[Any, ...]]] = [
            (
                # A job held by a rate is rung by a start of its bucket, or below.
                JobsTable.dispatched_at.is_(None) & ~rate_limited(),
                limit,
                (JobsTable.priority.desc(), JobsTable.run_after),
            )
        ]
        stale_take = limit if stale_limit is None else max(0, min(limit, stale_limit))
        if stale_take:
            kinds_of_unsent.append(
                (
                    JobsTable.dispatched_at <= stale,
                    stale_take,
                    (JobsTable.dispatched_at, JobsTable.priority.desc()),
                )
            )
        rate_rung = held_doorbells(self.engine, self.clock, limit)
        with self.engine.begin() as conn:
            taken: list[Row[Any, Any, Any, Any, Any]] = []
            for unsent, take, order in kinds_of_unsent:
                taken += conn.execute(
                    select(
                        JobsTable.id,
                        JobsTable.priority,
                        JobsTable.run_after,
                        JobsTable.kind,
                        JobsTable.queue,
                    )
                    .where(*queued_and_due, unsent)
                    .order_by(*order)
                    .limit(take)
                ).all()
            if not taken:
                return rate_rung
            marked = set(
                conn.execute(
                    update(JobsTable)
                    .where(
                        JobsTable.id.in_([row.id for row in taken]),
                        *queued_and_due,  # re-checked: claimed and put to sleep meanwhile
                        or_(JobsTable.dispatched_at.is_(None), JobsTable.dispatched_at <= stale),
                    )
                    .values(dispatched_at=now)
                    .returning(JobsTable.id)
                ).scalars()
            )
        ring_order = sorted(taken, key=lambda row: (-row.priority, row.run_after, row.id))
        return rate_rung + [
            Doorbell(row.id, row.priority, row.kind, row.queue)
            for row in ring_order
            if row.id in marked
        ]

    def hold_for_key(self, job_id: str) -> bool:
        """A delivery found the job's concurrency key full: clear its ``dispatched_at`` (its
        doorbell is used up) while the key is still full, so the run that frees a slot of
        the key rings it (:meth:`jobs._store.depth_reads.DepthReads.next_due_doorbells`
        with ``unrung``) and nothing rings the jobs whose doorbells still wait in the queue.
        ``False``: the key has room now (or the job moved on): ring it again."""
        with self.engine.begin() as conn:
            held = conn.execute(
                update(JobsTable)
                .where(
                    JobsTable.id == job_id,
                    JobsTable.state == State.QUEUED.value,
                    key_full(self.clock),
                )
                .values(dispatched_at=None)
                .returning(JobsTable.id)
            ).first()
        return held is not None

    def ring_again_sooner(self, job_id: str, by_seconds: float) -> None:
        """A delivery left the job to a worker of another version of its kind: count its
        doorbell as rung ``by_seconds`` earlier, so the sweeper rings it again that much
        sooner than ``JOBS_RING_AGAIN_AFTER_SECONDS``. The caller draws ``by_seconds`` at
        random: doorbells dropped together are then rung again apart, and reach the queue's
        workers in another order (rung again together, the broker's round robin could hand
        each to the same wrong worker every time). Not a state move."""
        with self.engine.begin() as conn:
            conn.execute(
                update(JobsTable)
                .where(
                    JobsTable.id == job_id,
                    JobsTable.state == State.QUEUED.value,
                    JobsTable.dispatched_at.is_not(None),
                )
                .values(dispatched_at=self.clock.after(-by_seconds))
            )

    def hold_for_rate(
        self, job: Job, limits: KindLimits | None, longest_wait: float
    ) -> tuple[str, float] | None:
        """A delivery found ``job`` held back by a rate of its kind's ``limits`` (as the
        delivery read them): ``(describe, wait)`` when this delivery waits ``wait`` seconds
        for the next start and claims again; else its doorbell is held for the rate
        (:func:`jobs._store.rate_limits.hold_for_rate`)."""
        return hold_for_rate(self.engine, self.clock, job, limits, longest_wait)

    def next_for_rate(self, claim: Claim) -> list[Doorbell]:
        """A claim took a start of each of its rate buckets (``claim.rate_buckets``): the
        next held job of each, marked rung (:func:`jobs._store.rate_limits.ring_next_held`),
        with no read of the limits."""
        return ring_next_held(self.engine, self.clock, claim.job.kind, claim.rate_buckets)

    def mark_unrung(self, job_ids: Sequence[str]) -> None:
        """A publish failed: clear ``dispatched_at`` so the next sweep sends the doorbells
        again instead of waiting for the messages to count as lost (not a state change)."""
        if not job_ids:
            return
        with self.engine.begin() as conn:
            conn.execute(
                update(JobsTable)
                .where(JobsTable.id.in_(list(job_ids)), JobsTable.state == State.QUEUED.value)
                .values(dispatched_at=None)
            )


__all__ = ["Doorbells"]
