"""Fairness across keys (``@jobs.job(..., concurrency_key=…, fair=True)``): a delivery of a
fair kind claims, instead of the job its doorbell names, the due job of the key served
least recently (never served first), among the kind's highest priority; the job it
named keeps waiting.

Doorbells are per job, so the claim swaps doorbells: the picked job is one whose own
doorbell is still out (``dispatched_at`` set: in the broker, or counted lost and rung again
by the sweeper), and that doorbell, when it comes, claims the next fair pick (the job
swapped out, or another). Every delivery of a fair kind claims some due job while one is
claimable; and the job swapped out is rung again at once (a surplus doorbell finds nothing
and is dropped), so every QUEUED job of the kind has a doorbell of its own out, or is held
for its key. Without that ring a swap spends the swapped-out job's doorbell: when the
doorbell of the job that ran arrives and every waiting job's key is full, it is dropped as
"already COMPLETED" and holds nothing for the key's finisher to ring, so the job waited for
the sweeper's lost-message rule (about one run in three with real workers). A pick
another claim took first falls back to the next pick (a concurrent claim took the first),
then to the doorbell's own job. ``job_key_turns`` keeps when each key was last served,
written after each fair claim.

The pick is a read that sorts the kind's due jobs by their key's turn, once or more per
delivery (20-90 ms mid-drain with 950-1,440 jobs queued over 50 keys on the shared test
machine). A fair kind drains about a tenth as fast as the same kind without fairness
(``python -m bench.fairness --only drain``): concurrent deliveries pick the same job, so a
claim picks 2.6 times on average (docs/benchmarks.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import and_, func, select

from jobs._core.records import Claim, Doorbell, Job
from jobs._core.states import State
from jobs._store.clauses import insert_for
from jobs._store.key_limits import key_full
from jobs._store.pause_clauses import not_paused
from jobs._store.statements import Statements
from jobs._store.tables import JobsTable, KeyTurnsTable

#: How many picks a delivery tries while other claims take its picks first.
PICKS = 8


class FairTurns:
    """The fair pick of a kind's next job and the record of the keys served."""

    def __init__(self, statements: Statements) -> None:
        self.engine = statements.engine
        self.clock = statements.clock

    def pick(self, kind: str) -> str | None:
        """The due QUEUED job of ``kind`` to claim next: the highest priority, then the key
        served least recently (a key never served first; jobs without a key count as one
        key), then the longest due. Only jobs whose doorbell is out (``dispatched_at``
        set) and whose key has room; ``None``: none."""
        turns = KeyTurnsTable.__table__
        key = func.coalesce(JobsTable.concurrency_key, "")
        joined = JobsTable.__table__.outerjoin(
            turns, and_(turns.c.kind == JobsTable.kind, turns.c.concurrency_key == key)
        )
        stmt = (
            select(JobsTable.id)
            .select_from(joined)
            .where(
                JobsTable.kind == kind,
                JobsTable.state == State.QUEUED.value,
                JobsTable.run_after <= self.clock.now(),
                JobsTable.dispatched_at.is_not(None),
                not_paused(),
                ~key_full(self.clock),
            )
            .order_by(
                JobsTable.priority.desc(),
                turns.c.served_at.asc().nulls_first(),
                JobsTable.run_after,
                JobsTable.created_at,
                JobsTable.id,
            )
            .limit(1)
        )
        with self.engine.connect() as conn:
            picked: str | None = conn.execute(stmt).scalar_one_or_none()
        return picked

    def served(self, job: Job) -> None:
        """A claim took ``job``: its key was served now."""
        key = job.concurrency_key or ""
        with self.engine.begin() as conn:
            conn.execute(
                insert_for(conn, KeyTurnsTable)
                .values(kind=job.kind, concurrency_key=key, served_at=self.clock.now())
                .on_conflict_do_update(
                    index_elements=[KeyTurnsTable.kind, KeyTurnsTable.concurrency_key],
                    set_={"served_at": self.clock.now()},
                )
            )

    def claim(
        self,
        job_id: str,
        kind: str,
        take: Callable[[str], Claim | None],
        ring: Callable[[Sequence[Doorbell]], Any] | None = None,
    ) -> Claim | None:
        """A delivery of ``job_id``'s doorbell for a fair ``kind``: ``take`` (the claim of
        one job) of the fair pick, picked again while another claim took it first (up to
        :data:`PICKS` times: a delivery that claims nothing while a job waits would leave
        that job without a doorbell), else of ``job_id`` itself; the claimed job's key is
        recorded as served."""
        claim = None
        for _ in range(PICKS):
            picked = self.pick(kind)
            if picked is None:
                break
            claim = take(picked)
            if claim is not None:
                break
        if claim is None:
            claim = take(job_id)
        if claim is not None:
            self.served(claim.job)
        if claim is not None and claim.job_id != job_id and ring is not None:
            ring(self.still_queued(job_id))  # its doorbell again: a surplus one is dropped
        return claim

    def still_queued(self, job_id: str) -> list[Doorbell]:
        """The doorbell of ``job_id`` if it is still QUEUED (a job swapped out)."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(JobsTable.id, JobsTable.priority, JobsTable.kind, JobsTable.queue).where(
                    JobsTable.id == job_id, JobsTable.state == State.QUEUED.value
                )
            ).first()
        return [] if row is None else [Doorbell(row.id, row.priority, row.kind, row.queue)]


__all__ = ["PICKS", "FairTurns"]
