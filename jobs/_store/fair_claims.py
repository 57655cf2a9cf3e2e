"""Fairness across keys (``@jobs.job(..., concurrency_key=…, fair=True)``): a delivery of a
fair kind claims, instead of the job its doorbell names, the due job of the key served
least recently (never served first), among the kind's highest priority; the job it
named keeps waiting.

Doorbells are per job, so the claim swaps doorbells: the job picked may have its own
doorbell out (``dispatched_at`` set: in the broker, or counted lost and rung again by the
sweeper), and that doorbell, when it comes, claims the next fair pick (the job swapped out,
or another); and the job swapped out is rung again at once (a surplus doorbell finds
nothing and is dropped). So every delivery of a fair kind claims some due job while one is
claimable, and every QUEUED job of the kind has a doorbell of its own out, or is held for
its key or its rate. Without that ring a swap spends the swapped-out job's doorbell: when
the doorbell of the job that ran arrives and every waiting job's key is full, it is dropped
as "already COMPLETED" and holds nothing for the key's finisher to ring, so the job waited
for the sweeper's lost-message rule (about one run in three with real workers). With it, a
held job (no doorbell out) is picked too and keeps its turn: under a rate most deliveries
are refused and hold their own job, and a held job is rung again only in the order it was
queued, so a late key's held jobs waited behind the backlog (claim 145 of 170 in
tests/acceptance/test_fair_claims.py). When no pick is claimable the delivery claims the
doorbell's own job. ``job_key_turns`` keeps when each key was last served.

The pick, the claim of the job picked, the record of its key served and the read of the
swapped-out job's doorbell are one transaction
(:meth:`jobs._store.claiming.Claims.claim_first`): on PostgreSQL the pick locks the job it
returns and skips the jobs other claims hold (``FOR UPDATE OF jobs SKIP LOCKED``), so
concurrent deliveries take different jobs, one pick each; SQLite's single writer
serializes them. The swapped-out job is rung after the commit. A pick is tried again (up
to :data:`PICKS` times) only when its job was not claimable after all (its key filled up
since the pick read it). A fair claim that the kind's rate refuses picks nothing and
claims nothing: falling back to its doorbell's own job would give the next start to a job
out of turn.

Picked apart (pick, claim, served and the re-read each on a connection of its own, the
picks racing for the same job: 2.6 picks a claim), a fair kind drained at 0.08-0.10 x the
rate of the same kind without fairness; in one transaction at 0.23-0.30 x, the pick's own
read now most of a fair claim (10 ms of 16 with 1,500 jobs queued over 50 keys): ``python -m
bench.fairness --only drain --rounds 3`` (docs/benchmarks.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, Select, and_, func, select

from jobs._core.records import Claim, Doorbell, Job
from jobs._core.states import State
from jobs._store.claiming import Claims, ClaimTerms, Untaken
from jobs._store.clauses import insert_for
from jobs._store.key_limits import key_full
from jobs._store.pause_clauses import not_paused
from jobs._store.statements import Statements
from jobs._store.tables import JobsTable, KeyTurnsTable

#: How many picks a delivery tries while the job picked turns out not claimable.
PICKS = 8


class FairTurns:
    """The fair pick of a kind's next job and the record of the keys served."""

    def __init__(self, statements: Statements, claims: Claims) -> None:
        self.clock = statements.clock
        self.claims = claims

    def pick_statement(self, kind: str) -> Select[Any]:
        """The fair pick's select (``id`` and ``concurrency_key``): the due QUEUED jobs of
        ``kind``, the highest priority first, then of the key served least recently (a key
        never served first; jobs without a key count as one key), then the longest due.
        Only jobs whose key has room; a job whose doorbell is not out (held for its key or
        its rate) is picked as well (see the module's docstring)."""
        turns = KeyTurnsTable.__table__
        key = func.coalesce(JobsTable.concurrency_key, "")
        joined = JobsTable.__table__.outerjoin(
            turns, and_(turns.c.kind == JobsTable.kind, turns.c.concurrency_key == key)
        )
        return (
            select(JobsTable.id, JobsTable.concurrency_key)
            .select_from(joined)
            .where(
                JobsTable.kind == kind,
                JobsTable.state == State.QUEUED.value,
                JobsTable.run_after <= self.clock.now(),
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

    def served(self, conn: Connection, job: Job) -> None:
        """A claim took ``job``: its key was served now (in the claim's transaction)."""
        key = job.concurrency_key or ""
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
        terms: ClaimTerms,
        ring: Callable[[Sequence[Doorbell]], Any] | None = None,
    ) -> Claim | None:
        """A delivery of ``job_id``'s doorbell for a fair ``kind``: the claim on ``terms``
        of the fair pick, in the pick's transaction with the record of its key served
        (picked again while the job picked is not claimable after all, up to
        :data:`PICKS` times: a delivery that claims nothing while a job waits would leave
        that job without a doorbell), else of ``job_id`` itself (its key served in the same
        transaction too); nothing while the kind's rate allows no start. The job swapped
        out is rung again through ``ring`` once the claim committed."""

        def then(conn: Connection, claim: Claim) -> list[Doorbell]:
            self.served(conn, claim.job)
            if claim.job_id == job_id:
                return []
            return self.still_queued(conn, job_id)  # its doorbell again: a surplus one is dropped

        claim: Claim | None
        swapped: list[Doorbell] = []
        statement = self.pick_statement(kind)
        for _ in range(PICKS):
            taken = self.claims.claim_first(kind, statement, terms, then)
            if taken is Untaken.RATE_HOLDS:
                # Not the doorbell's own job either: the start the rate allows next goes
                # to a fair pick (the caller waits for it, or holds the job for the rate).
                return None
            if taken is not Untaken.PICK_AGAIN:
                break
        if isinstance(taken, tuple):
            claim, swapped = taken
        else:  # no pick is claimable: the doorbell's own job, its key served with its claim
            own = select(JobsTable.id, JobsTable.concurrency_key).where(JobsTable.id == job_id)
            mine = self.claims.claim_first(  # waits for its row, as any claim of one job
                kind,
                own,
                terms,
                lambda conn, claim: self.served(conn, claim.job),
                skip_locked=False,
            )
            claim = mine[0] if isinstance(mine, tuple) else None
        if swapped and ring is not None:
            ring(swapped)
        return claim

    def still_queued(self, conn: Connection, job_id: str) -> list[Doorbell]:
        """The doorbell of ``job_id`` if it is still QUEUED (a job swapped out)."""
        row = conn.execute(
            select(JobsTable.id, JobsTable.priority, JobsTable.kind, JobsTable.queue).where(
                JobsTable.id == job_id, JobsTable.state == State.QUEUED.value
            )
        ).first()
        return [] if row is None else [Doorbell(row.id, row.priority, row.kind, row.queue)]


__all__ = ["PICKS", "FairTurns"]
