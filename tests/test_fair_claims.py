"""Fairness across keys (issue 27 part 3): a ``fair=True`` kind's deliveries claim the due job
of the least recently served key, among the highest priority, on SQLite and PostgreSQL (both
executors); the doorbell's own job keeps waiting and the picked job's doorbell, still out,
claims it later; a pick another claim holds is skipped, in one pick (PostgreSQL); the
kind's rate and running limit hold for the fair claim; a job whose key is full is not
picked, a held one is; ``fair=`` checked in one line."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import event, func, select, update

from jobs._core.context import JobContext
from jobs._core.errors import InvalidInput
from jobs._core.registry import Registry
from jobs._core.states import State
from jobs._store import Claim, ClaimTerms, JobStore
from jobs._store.clock import LogicalClock
from jobs._store.tables import JobsTable
from tests.conftest import POSTGRES_EXECUTORS

KIND = "fair"
LEASE = 10.0


def new(store: JobStore, job_id: str, key: str | None, priority: int = 0) -> str:
    job, created = store.submissions.create(
        KIND, {}, job_id=job_id, max_attempts=3, concurrency_key=key, priority=priority
    )
    assert created
    return job.id


TERMS = ClaimTerms("A", LEASE)


def deliver(store: JobStore, clock: LogicalClock, job_id: str) -> str:
    """One delivery of ``job_id``'s doorbell: the job it claimed."""
    clock.advance(1)
    claim = store.fairness.claim(job_id, KIND, TERMS)
    assert claim is not None
    return claim.job_id


def test_claims_rotate_across_keys_and_a_late_key_is_served_next(
    store: JobStore, clock: LogicalClock
) -> None:
    early = [new(store, f"a{n}", "A") for n in range(6)]
    started = [deliver(store, clock, early[n]) for n in range(2)]
    assert started == ["a0", "a1"]
    late = [new(store, f"b{n}", "B") for n in range(2)]
    # Each delivery below names a job of A (A's doorbells come first in the queue), but
    # the next claim goes to B, never served, then the keys take turns.
    order = [deliver(store, clock, job_id) for job_id in early[2:]]
    assert order == ["b0", "a2", "b1", "a3"]
    # The swapped-out jobs of A still wait, and the late doorbells (B's) claim them.
    assert store.reads.get("a4").state is State.QUEUED
    assert [deliver(store, clock, job_id) for job_id in late] == ["a4", "a5"]


def test_the_job_swapped_out_is_rung_again(store: JobStore, clock: LogicalClock) -> None:
    new(store, "a0", "A")
    assert deliver(store, clock, "a0") == "a0"
    new(store, "a1", "A")
    new(store, "b0", "B")
    rung: list[str] = []
    claim = store.fairness.claim(
        "a1",
        KIND,
        TERMS,
        lambda doorbells: rung.extend(doorbell.job_id for doorbell in doorbells),
    )
    assert claim is not None
    assert claim.job_id == "b0"
    assert rung == ["a1"]


def test_priority_comes_before_the_turns(store: JobStore, clock: LogicalClock) -> None:
    new(store, "a0", "A")
    assert deliver(store, clock, "a0") == "a0"
    new(store, "a1", "A", priority=5)
    new(store, "b0", "B")
    assert deliver(store, clock, "b0") == "a1"


# PostgreSQL only: SQLite's single writer serializes claims, none is mid-transaction.
@pytest.mark.parametrize("database", POSTGRES_EXECUTORS, indirect=True)
def test_a_pick_another_claim_holds_is_skipped_in_one_pick(
    request: pytest.FixtureRequest, store: JobStore, clock: LogicalClock
) -> None:
    """PostgreSQL: another fair claim, mid-transaction, holds the first pick's row locked;
    this claim takes the next pick at once, in one pick (picked apart, it read the same
    job and waited on its row, then picked again)."""
    new(store, "a0", "A")
    new(store, "b0", "B")
    new(store, "c0", "C")
    picks: list[str] = []

    def count_picks(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "job_key_turns" in statement and statement.lstrip().upper().startswith("SELECT"):
            picks.append(statement)

    event.listen(store.engine, "before_cursor_execute", count_picks)
    request.addfinalizer(lambda: event.remove(store.engine, "before_cursor_execute", count_picks))
    claimed: list[Claim | None] = []
    with store.engine.connect() as other, other.begin() as holding:
        locked = other.execute(
            select(JobsTable.id).where(JobsTable.id == "a0").with_for_update()
        ).scalar_one()
        assert locked == "a0"
        picks.clear()
        claiming = threading.Thread(
            target=lambda: claimed.append(store.fairness.claim("c0", KIND, TERMS))
        )
        claiming.start()
        claiming.join(timeout=10)
        waited = claiming.is_alive()
        holding.rollback()  # a claim that waited on the row goes on now
    claiming.join()
    assert not waited, "the claim waited on the row another claim holds"
    assert [claim.job_id for claim in claimed if claim is not None] == ["b0"]
    assert len(picks) == 1, picks
    assert store.reads.get("a0").state is State.QUEUED
    assert store.reads.get("c0").state is State.QUEUED


# PostgreSQL only: SQLite's single writer serializes claims, none is mid-transaction.
@pytest.mark.parametrize("database", POSTGRES_EXECUTORS, indirect=True)
def test_a_pick_whose_key_another_claim_holds_waits_for_the_key_without_the_row(
    store: JobStore, clock: LogicalClock
) -> None:
    """PostgreSQL, a kind limited per key: another claim holds the pick's key's lock and
    then claims the picked row (as the per-key claim does: key first, then row). The fair
    claim lets the row go while it waits for the key (holding the row would deadlock),
    then picks again: both go through, and the fair claim takes the next pick."""
    store.submissions.set_limits(KIND, max_running=None, max_queued=None, max_running_per_key=1)
    new(store, "a0", "A")
    new(store, "b0", "B")
    claimed: list[Claim | None] = []
    failed: list[BaseException] = []

    def fair_claim() -> None:
        try:
            claimed.append(store.fairness.claim("b0", KIND, TERMS))
        except BaseException as error:
            failed.append(error)

    key_lock = select(func.pg_advisory_xact_lock(func.hashtext(KIND), func.hashtext("A")))
    with store.engine.connect() as other, other.begin():
        other.execute(key_lock)
        claiming = threading.Thread(target=fair_claim)
        claiming.start()
        time.sleep(0.5)  # the fair claim has picked a0 and found its key's lock taken
        other.execute(  # the other claim takes a0's row, under its key's lock
            update(JobsTable).where(JobsTable.id == "a0").values(state=State.RUNNING.value)
        )
    claiming.join(timeout=30)
    assert not claiming.is_alive()
    assert failed == []
    assert [claim.job_id for claim in claimed if claim is not None] == ["b0"]


# PostgreSQL only: SQLite's single writer serializes claims, none is mid-transaction.
@pytest.mark.parametrize("database", POSTGRES_EXECUTORS, indirect=True)
def test_a_delivery_whose_own_job_another_claim_holds_waits_for_it(
    store: JobStore, clock: LogicalClock
) -> None:
    """PostgreSQL: no fair pick is claimable (the one job is held locked by another claim,
    mid-transaction, that then lets it go), so the delivery falls back to its own job: it
    waits for the row as any claim of a named job does, and claims it once let go (skipping
    the row, it claimed nothing and its doorbell was spent)."""
    new(store, "a0", "A")
    claimed: list[Claim | None] = []
    with store.engine.connect() as other, other.begin() as holding:
        other.execute(select(JobsTable.id).where(JobsTable.id == "a0").with_for_update())
        claiming = threading.Thread(
            target=lambda: claimed.append(store.fairness.claim("a0", KIND, TERMS))
        )
        claiming.start()
        time.sleep(0.5)  # the fair pick skipped a0; the fallback is on a0's row
        holding.rollback()  # the other claim took nothing
    claiming.join(timeout=30)
    assert not claiming.is_alive()
    assert [claim.job_id for claim in claimed if claim is not None] == ["a0"]
    assert store.reads.get("a0").state is State.RUNNING


@pytest.mark.parametrize(
    "limits", [{"rate_limit": "1/m"}, {"max_running": 1}], ids=["rate", "max_running"]
)
def test_a_fair_pick_keeps_the_kinds_limits(
    store: JobStore, clock: LogicalClock, limits: dict[str, Any]
) -> None:
    """The fair claim keeps the kind's rate and ``max_running`` as any claim does: a second
    start within the rate's interval, or while the first job runs, is not taken (nothing
    claimed), on either backend; once the interval passed and the first job's lease ran
    out, it is."""
    store.submissions.set_limits(KIND, **{"max_running": None, "max_queued": None, **limits})
    new(store, "a0", "A")
    new(store, "b0", "B")
    assert deliver(store, clock, "a0") == "a0"
    clock.advance(1)
    assert store.fairness.claim("b0", KIND, TERMS) is None
    assert store.reads.get("b0").state is State.QUEUED
    clock.advance(61)
    assert deliver(store, clock, "b0") == "b0"


def picked(store: JobStore) -> str | None:
    """The job the next fair claim of the kind would take, read without claiming it."""
    with store.engine.connect() as conn:
        pick = store.fairness.pick_statement(KIND).with_only_columns(JobsTable.id)
        return conn.execute(pick).scalar_one_or_none()


def test_a_job_of_a_full_key_is_not_picked_and_a_held_one_is(
    store: JobStore, clock: LogicalClock
) -> None:
    """A held job (no doorbell out: held for its key or its rate) keeps its turn: the
    delivery that claims it instead of its own rings its own job's doorbell again."""
    store.submissions.set_limits(KIND, max_running=None, max_queued=None, max_running_per_key=1)
    new(store, "a0", "A")
    new(store, "a1", "A")
    new(store, "b0", "B")
    assert deliver(store, clock, "a0") == "a0"
    # A is full: the pick is B's, held (no doorbell out) or not.
    assert picked(store) == "b0"
    store.doorbells.mark_unrung(["b0"])
    assert picked(store) == "b0"
    rung: list[str] = []
    claim = store.fairness.claim(
        "a1", KIND, TERMS, lambda doorbells: rung.extend(doorbell.job_id for doorbell in doorbells)
    )
    assert claim is not None
    assert claim.job_id == "b0"
    assert rung == ["a1"]


def fair_handler(ctx: JobContext, tenant: str = "") -> None:
    return None


def test_fair_needs_a_concurrency_key_and_a_bool() -> None:
    registry = Registry(imports=())
    kind = registry.register("fair_ok", fair_handler, concurrency_key="tenant", fair=True)
    assert kind.fair
    assert registry.is_fair("fair_ok")
    assert not registry.is_fair("unknown")
    with pytest.raises(InvalidInput, match="fair=True needs a concurrency_key"):
        registry.register("fair_unkeyed", fair_handler, fair=True)
    with pytest.raises(InvalidInput, match="fair must be True or False"):
        registry.register("fair_bad", fair_handler, concurrency_key="tenant", fair="yes")  # type: ignore[arg-type]
