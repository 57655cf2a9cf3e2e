"""The statements a rate-limited kind's deliveries send, counted on a real engine (SQLite and
PostgreSQL, both executors) with SQLAlchemy's ``before_cursor_execute`` event: the ring
after a claim that took a start reads no limits (the claim carries its buckets:
``Claim.rate_buckets``), and a delivery the rate held back reads the job, its kind's limits,
the pauses and the database's now once for both the rate's hold and the log line's reason
(:class:`jobs._worker.unclaimed.Unclaimed`).

Before these were shared, the ring read the kind's limits again (one statement more per
claim: 5 on PostgreSQL where 4 now, 6 on SQLite where 5), and a dropped delivery read the
limits three times (the wait, the hold, the reason) and the job, the pauses and now twice
each (11 statements on PostgreSQL where 6 now, 20 on SQLite where 11: each read there
sends its own ``BEGIN``)."""

from __future__ import annotations

from sqlalchemy import Engine, select, update

from jobs._core.context import JobContext
from jobs._core.rate_syntax import parse_rate
from jobs._core.registry import Registry
from jobs._store import JobStore
from jobs._store.tables import JobsTable, KindLimitsTable
from jobs._worker.runner import Runner
from jobs._worker.unclaimed import Unclaimed, wait_for_rate, why_not_claimed
from tests.conftest import sent

KIND = "rl"
LEASE = 10.0


def begins(engine: Engine, transactions: int) -> int:
    """The ``BEGIN`` statements of ``transactions`` transactions: SQLite's are sent by the
    store (``BEGIN IMMEDIATE``, or ``BEGIN`` for a read), PostgreSQL's by the driver unseen."""
    return transactions if engine.dialect.name == "sqlite" else 0


def reads_limits(statement: str) -> bool:
    return KindLimitsTable.__table__.name in statement


def held_back(store: JobStore, engine: Engine, *job_ids: str) -> None:
    """The jobs' doorbells are used up on the rate (as a delivery the rate held leaves them)."""
    with engine.begin() as conn:
        conn.execute(update(JobsTable).where(JobsTable.id.in_(job_ids)).values(dispatched_at=None))


def test_the_ring_after_a_rate_limited_claim_reads_no_limits(
    store: JobStore, engine: Engine
) -> None:
    store.submissions.set_limits(
        KIND, max_running=None, max_queued=None, rate_limit="2/s", rate_limit_per_key="1/s"
    )
    for job_id in ("j0", "j1", "j2"):
        store.submissions.create(KIND, {}, job_id=job_id, max_attempts=3, concurrency_key="k")
    held_back(store, engine, "j1", "j2")
    claim = store.ownership.claim("j0", "A", LEASE)
    assert claim is not None
    assert claim.rate_buckets == (("", parse_rate("2/s")), ("k", parse_rate("1/s")))
    with sent(engine) as ring:
        rung = store.doorbells.next_for_rate(claim)
    # The kind's bucket rings its next held job, the key's the next of the key after it.
    assert [doorbell.job_id for doorbell in rung] == ["j1", "j2"]
    # Per bucket: the held job locked, then marked rung; no read of the limits (before:
    # one more statement, the kind's limits row).
    assert not [statement for statement in ring if reads_limits(statement)]
    assert len(ring) == begins(engine, 1) + 2 * 2


def test_a_delivery_the_rate_held_back_reads_each_thing_once(
    store: JobStore, engine: Engine
) -> None:
    store.submissions.set_limits(KIND, max_running=None, max_queued=None, rate_limit="1/m")
    for job_id in ("j0", "j1"):
        store.submissions.create(KIND, {}, job_id=job_id, max_attempts=3)
    assert store.ownership.claim("j0", "A", LEASE) is not None  # the minute's start
    kinds = Registry(imports=[])

    def handler(ctx: JobContext) -> None:
        return None

    kinds.register(KIND, handler)
    runner = Runner(store, "w1", lease_seconds=LEASE, registry=kinds)
    with sent(engine) as dropped:
        seen = Unclaimed(store.reads, "j1")
        assert not wait_for_rate(runner, seen, lambda: False)  # a minute off: held
        why, held, other_version = why_not_claimed(runner, seen)
    assert (why, held, other_version) == ("QUEUED, claimed by no one yet (try again)", None, False)
    with engine.connect() as conn:
        dispatched = conn.execute(
            select(JobsTable.dispatched_at).where(JobsTable.id == "j1")
        ).scalar_one()
    assert dispatched is None  # held for the rate: its next start rings it
    # Read once each: the job, the limits, the pauses, now (four reads); then the hold, in
    # one transaction: the bucket's row, the doorbell cleared. Before: the hold read the
    # limits again, and the reason the job, the pauses, now and the limits again.
    assert len([statement for statement in dropped if reads_limits(statement)]) == 1
    assert len(dropped) == begins(engine, 4 + 1) + 4 + 2
