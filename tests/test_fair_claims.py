"""Fairness across keys (issue 27 part 3): a ``fair=True`` kind's deliveries claim the due job
of the least recently served key, among the highest priority, on SQLite and PostgreSQL (both
executors); the doorbell's own job keeps waiting and the picked job's doorbell, still out,
claims it later; a pick taken first falls back to the doorbell's job; a job whose doorbell
is not out, or whose key is full, is not picked; ``fair=`` checked in one line."""

from __future__ import annotations

import pytest

from jobs._core.context import JobContext
from jobs._core.errors import InvalidInput
from jobs._core.registry import Registry
from jobs._core.states import State
from jobs._store import Claim, JobStore
from jobs._store.clock import LogicalClock

KIND = "fair"
LEASE = 10.0


def new(store: JobStore, job_id: str, key: str | None, priority: int = 0) -> str:
    job, created = store.submissions.create(
        KIND, {}, job_id=job_id, max_attempts=3, concurrency_key=key, priority=priority
    )
    assert created
    return job.id


def take(store: JobStore, owner: str = "A") -> object:
    def claim(job_id: str) -> Claim | None:
        return store.ownership.claim(job_id, owner, LEASE)

    return claim


def deliver(store: JobStore, clock: LogicalClock, job_id: str) -> str:
    """One delivery of ``job_id``'s doorbell: the job it claimed."""
    clock.advance(1)
    claim = store.fairness.claim(job_id, KIND, take(store))  # type: ignore[arg-type]
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
        take(store),
        lambda doorbells: rung.extend(d.job_id for d in doorbells),  # type: ignore[arg-type]
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


def test_a_pick_taken_first_is_picked_again(store: JobStore, clock: LogicalClock) -> None:
    new(store, "a0", "A")
    new(store, "b0", "B")
    assert store.fairness.pick(KIND) == "a0"
    new(store, "c0", "C")

    def first_taken(job_id: str) -> Claim | None:
        if job_id == "a0":  # another worker takes it between the pick and the claim
            assert store.ownership.claim(job_id, "other", LEASE) is not None
        return store.ownership.claim(job_id, "A", LEASE)

    claim = store.fairness.claim("c0", KIND, first_taken)
    assert claim is not None
    assert claim.job_id == "b0"  # picked again: the next key's
    assert store.reads.get("c0").state is State.QUEUED


def test_a_job_without_a_doorbell_out_or_of_a_full_key_is_not_picked(
    store: JobStore, clock: LogicalClock
) -> None:
    store.submissions.set_limits(KIND, max_running=None, max_queued=None, max_running_per_key=1)
    new(store, "a0", "A")
    new(store, "a1", "A")
    new(store, "b0", "B")
    assert deliver(store, clock, "a0") == "a0"
    # A is full: the pick is B's, and B held (no doorbell out) is not picked.
    assert store.fairness.pick(KIND) == "b0"
    store.doorbells.mark_unrung(["b0"])
    assert store.fairness.pick(KIND) is None


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
