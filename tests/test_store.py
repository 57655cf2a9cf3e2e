"""The store contract, on SQLite (a fresh file per test) and on PostgreSQL.

Every refusal is checked twice: the error says why, and a snapshot of every row of the
three job tables is identical before and after (a refusal changes nothing).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import ColumnElement, Engine, Float, bindparam, func, select, text

from jobs._core.errors import (
    DuplicateJob,
    IllegalTransition,
    InvalidInput,
    LeaseLost,
    NothingToWake,
    StepError,
    UnknownJob,
)
from jobs._core.records import Batch, Job
from jobs._core.states import TRANSITIONS, State
from jobs._store import Claim, JobStore
from jobs._store.clock import UTC, DatabaseClock, LogicalClock, db_now_plus
from jobs._store.db import READ_ONLY, make_engine
from jobs._store.tables import JobsTable
from tests.conftest import EXECUTORS, LEASE, STORE_TABLES, claimed, empty_database, snapshot

INSTANT_SLACK = dt.timedelta(seconds=0.5)


@dataclasses.dataclass(frozen=True, eq=False)
class Near:
    """An instant read off the server's clock: equal to any datetime within
    :data:`INSTANT_SLACK` of it (the statements that wrote it ran a moment ago)."""

    at: dt.datetime

    def __eq__(self, other: object) -> bool:
        return isinstance(other, dt.datetime) and abs(other - self.at) <= INSTANT_SLACK

    __hash__ = None  # type: ignore[assignment]


class ServerClock:
    """The PostgreSQL server's own ``clock_timestamp()``, moved on by :meth:`advance` as the
    logical clock is: every statement compares leases and due times on the server's clock
    plus the seconds advanced (a bound parameter, as a logical clock's instant is, so the
    driver runs the same statements), while real time runs on too. ``instant(tick)`` is the
    server's reading now had ``tick`` seconds been advanced, within :data:`INSTANT_SLACK`."""

    def __init__(self) -> None:
        self.tick = 0.0

    def advance(self, ticks: float = 1) -> float:
        self.tick += ticks
        return self.tick

    def _advanced(self) -> ColumnElement[float]:
        return bindparam("clock_advanced", type_=Float(), callable_=lambda: float(self.tick))

    def now(self) -> ColumnElement[dt.datetime]:
        return db_now_plus(self._advanced())

    def after(self, seconds: float | ColumnElement[float]) -> ColumnElement[dt.datetime]:
        return db_now_plus(self._advanced() + seconds)

    def values(self) -> dict[str, Any]:
        return {"clock_advanced": float(self.tick)}

    def instant(self, tick: float | None = None) -> Near:
        seconds = self.tick if tick is None else tick
        return Near(dt.datetime.now(UTC) + dt.timedelta(seconds=seconds))


SERVER_CLOCK = "postgres-driver-clock_timestamp"


@pytest.fixture(
    params=[
        *EXECUTORS,
        # The whole contract again on the driver, on PostgreSQL's clock_timestamp() (moved on
        # by a bound offset), not only a logical clock: production's clock and executor.
        pytest.param(SERVER_CLOCK, marks=pytest.mark.postgres),
    ]
)
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Engine]]:
    yield from empty_database(request, tmp_path)


def margin(clock: LogicalClock) -> float:
    """The smallest step a boundary test can rely on: a millisecond of the logical clock,
    a second of the server's (real time runs on while the statements run)."""
    return 1.0 if isinstance(clock, ServerClock) else 0.001


@pytest.fixture
def clock(request: pytest.FixtureRequest) -> LogicalClock:
    """The logical clock, or on the server's clock executor the server's clock moved on
    the same way (typed as the logical clock it stands in for)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("database") == SERVER_CLOCK:
        return ServerClock()  # type: ignore[return-value]
    return LogicalClock()


def row_counts(engine: Engine) -> tuple[int, ...]:
    with engine.connect().execution_options(**{READ_ONLY: True}) as conn:
        return tuple(
            conn.execute(select(func.count()).select_from(t)).scalar_one() for t in STORE_TABLES
        )


def new(store: JobStore, job_id: str = "j1", max_attempts: int = 3, **kw: Any) -> str:
    job, created = store.submissions.create(
        "kind", {"n": 1}, job_id=job_id, max_attempts=max_attempts, **kw
    )
    assert created
    return job.id


# -- create ------------------------------------------------------------------------------


def test_create_writes_a_queued_job_and_its_birth(store: JobStore, clock: LogicalClock) -> None:
    job, created = store.submissions.create(
        "kind", {"n": 1, "s": "x"}, job_id="j1", max_attempts=4, code_version="v2"
    )
    assert created
    assert job.state is State.QUEUED
    assert job.inputs == {"n": 1, "s": "x"}
    assert (job.fence, job.attempts, job.max_attempts) == (0, 0, 4)
    assert job.owner is None
    assert job.lease_until is None
    assert job.code_version == "v2"
    for instant in (job.created_at, job.updated_at, job.run_after):
        assert instant == clock.instant()
    assert job.dispatched_at == clock.instant()  # optimistic: the caller publishes next
    assert store.reads.get("j1") == job
    [birth] = store.reads.history("j1")
    assert birth.from_state is None
    assert birth.to_state is State.QUEUED
    assert birth.reason == "submitted"
    assert birth.at == clock.instant()


def test_create_is_idempotent_for_the_same_id_and_inputs(store: JobStore, engine: Engine) -> None:
    first, created = store.submissions.create(
        "kind", {"a": 1, "b": [1, 2]}, job_id="j1", max_attempts=3
    )
    assert created
    before = snapshot(engine)
    again, created_again = store.submissions.create(
        "kind", {"b": [1, 2], "a": 1}, job_id="j1", max_attempts=3
    )
    assert not created_again
    assert again == first
    assert snapshot(engine) == before


def test_create_stores_what_a_reader_gets_back(store: JobStore) -> None:
    job, _ = store.submissions.create("kind", {"pair": (1, 2)}, job_id="j1", max_attempts=3)
    assert job.inputs == {"pair": [1, 2]}
    assert store.reads.get("j1").inputs == {"pair": [1, 2]}
    _, created = store.submissions.create("kind", {"pair": (1, 2)}, job_id="j1", max_attempts=3)
    assert not created


@pytest.mark.parametrize(
    ("kind", "inputs"),
    [("kind", {"n": 2}), ("kind", {"n": 1, "extra": True}), ("kind", {}), ("other", {"n": 1})],
)
def test_create_same_id_other_kind_or_inputs_is_a_duplicate(
    store: JobStore, engine: Engine, kind: str, inputs: dict[str, Any]
) -> None:
    new(store)
    before = snapshot(engine)
    with pytest.raises(DuplicateJob, match="'j1' already exists"):
        store.submissions.create(kind, inputs, job_id="j1", max_attempts=3)
    assert snapshot(engine) == before


BAD_CREATES: dict[str, dict[str, Any]] = {
    "non-json value": {"inputs": {"x": object()}},
    "bytes value": {"inputs": {"x": b"raw"}},
    "nan": {"inputs": {"x": float("nan")}},
    "infinity": {"inputs": {"x": [float("-inf")]}},
    "oversized": {"inputs": {"x": "a" * 2000}},
    "list inputs": {"inputs": [1, 2]},
    "string inputs": {"inputs": "n=1"},
    "none inputs": {"inputs": None},
    "non-string key": {"inputs": {1: "a"}},
    "empty id": {"job_id": ""},
    "id with space": {"job_id": "a b"},
    "id with tab": {"job_id": "a\tb"},
    "id with control char": {"job_id": "a\x00b"},
    "id too long": {"job_id": "x" * 201},
    "id not a string": {"job_id": 42},
    "empty kind": {"kind": ""},
    "kind with space": {"kind": "my kind"},
    "zero max_attempts": {"max_attempts": 0},
}


@pytest.mark.parametrize("bad", list(BAD_CREATES), ids=list(BAD_CREATES))
def test_bad_create_writes_nothing(
    engine: Engine, make_store: Callable[..., JobStore], bad: str
) -> None:
    store = make_store(max_payload_bytes=1000)
    args: dict[str, Any] = {"kind": "kind", "inputs": {"n": 1}, "job_id": "j1", "max_attempts": 3}
    args.update(BAD_CREATES[bad])
    with pytest.raises(InvalidInput):
        store.submissions.create(args.pop("kind"), args.pop("inputs"), **args)
    assert row_counts(engine) == (0, 0, 0, 0)


def test_payload_limit_is_inclusive(make_store: Callable[..., JobStore]) -> None:
    store = make_store(max_payload_bytes=20)
    store.submissions.create(
        "kind", {"x": "a" * 12}, job_id="ok", max_attempts=1
    )  # exactly 20 bytes
    with pytest.raises(InvalidInput, match="21 bytes, over the limit of 20"):
        store.submissions.create("kind", {"x": "a" * 13}, job_id="big", max_attempts=1)
    assert [j.id for j in store.reads.list()] == ["ok"]


# -- what an owner's write returns ---------------------------------------------------------


@pytest.mark.parametrize(
    "move",
    [
        lambda store, claim: (
            store.ownership.complete(
                claim, {"total": 3}, steps=[store.ownership.pending_step("s", 1)]
            ).job
        ),
        lambda store, claim: store.ownership.fail(claim, "boom").job,
        lambda store, claim: store.ownership.release(claim, "shutting down"),
        lambda store, claim: store.ownership.sleep(
            claim, "nap", dt.datetime(2031, 1, 1, tzinfo=UTC)
        ),
    ],
    ids=["complete", "fail", "release", "sleep"],
)
def test_an_owners_move_returns_the_job_as_the_database_holds_it(
    store: JobStore, clock: LogicalClock, move: Callable[[JobStore, Claim], Job]
) -> None:
    """On PostgreSQL the move returns only the columns it changed and the rest comes from
    the claim; a lease renewed in between must not leave the old lease in the answer."""
    new(store)
    claim = claimed(store, liveness_key=5)
    clock.advance(1)
    store.leases.renew(claim, LEASE)
    clock.advance(1)
    assert move(store, claim) == store.reads.get("j1")


# -- claim ---------------------------------------------------------------------------------


def test_claim_takes_a_queued_job(store: JobStore, clock: LogicalClock) -> None:
    new(store)
    clock.advance(2)
    claim = claimed(store, owner="A")
    assert claim.owner == "A"
    assert claim.fence == 1
    job = claim.job
    assert job.state is State.RUNNING
    assert (job.owner, job.fence, job.attempts) == ("A", 1, 1)
    assert job.lease_until == clock.instant(2 + LEASE)
    assert store.reads.get("j1") == job
    last = store.reads.history("j1")[-1]
    assert (last.from_state, last.to_state, last.owner, last.fence) == (
        State.QUEUED,
        State.RUNNING,
        "A",
        1,
    )


def test_second_claim_is_refused_while_the_lease_is_live(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    new(store)
    claimed(store, owner="A")
    before = snapshot(engine)
    assert store.ownership.claim("j1", "B", LEASE) is None
    assert store.ownership.claim("j1", "A", LEASE) is None  # not even the owner claims twice
    clock.advance(LEASE - margin(clock))
    assert store.ownership.claim("j1", "B", LEASE) is None
    assert snapshot(engine) == before


def test_lease_expires_exactly_at_lease_until(store: JobStore, clock: LogicalClock) -> None:
    new(store)
    first = claimed(store, owner="A")
    clock.advance(LEASE)  # now == lease_until: expired
    second = store.ownership.claim("j1", "B", LEASE)
    assert second is not None
    assert second.fence == first.fence + 1 == 2
    assert second.job.attempts == first.job.attempts + 1 == 2
    assert second.job.owner == "B"
    assert second.job.lease_until == clock.instant(2 * LEASE)
    last = store.reads.history("j1")[-1]
    assert (last.from_state, last.to_state, last.owner, last.fence) == (
        State.RUNNING,
        State.RUNNING,
        "B",
        2,
    )


def test_expired_lease_is_not_claimable_once_attempts_are_exhausted(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    new(store, max_attempts=2)
    claimed(store, owner="A")
    clock.advance(LEASE)
    claimed(store, owner="B")
    clock.advance(LEASE)
    before = snapshot(engine)
    assert store.ownership.claim("j1", "C", LEASE) is None
    assert store.ownership.next_claimable() == []
    assert snapshot(engine) == before


def test_delayed_job_is_claimable_only_when_due(store: JobStore, clock: LogicalClock) -> None:
    job, _ = store.submissions.create("kind", {}, job_id="j1", max_attempts=1, delay_seconds=5)
    assert job.run_after == clock.instant(5)
    assert job.dispatched_at is None
    assert store.ownership.claim("j1", "A", LEASE) is None
    assert store.ownership.next_claimable() == []
    clock.advance(5)
    assert store.ownership.next_claimable() == ["j1"]
    assert store.ownership.claim("j1", "A", LEASE) is not None


def test_claim_by_kind(store: JobStore) -> None:
    new(store)
    assert store.ownership.claim("j1", "A", LEASE, kinds=["other"]) is None
    assert store.ownership.next_claimable(kinds=["other"]) == []
    assert store.ownership.next_claimable(kinds=["kind"]) == ["j1"]
    assert store.ownership.claim("j1", "A", LEASE, kinds=["other", "kind"]) is not None


def test_claim_of_unknown_or_ended_job_is_none(store: JobStore) -> None:
    assert store.ownership.claim("nope", "A", LEASE) is None
    new(store)
    store.ownership.complete(claimed(store), 1)
    assert store.ownership.claim("j1", "B", LEASE) is None


def test_claim_records_liveness_key_and_completion_clears_it(store: JobStore) -> None:
    new(store)
    claim = claimed(store, liveness_key=1234)
    assert store.depth.running_with_liveness() == [("j1", "A", 1, 1234)]
    store.ownership.complete(claim)
    assert store.depth.running_with_liveness() == []


# -- the owner's writes ----------------------------------------------------------------------


def test_renew_pushes_the_lease_out(store: JobStore, clock: LogicalClock) -> None:
    new(store)
    claim = claimed(store)
    clock.advance(LEASE - 0.5)
    assert store.leases.renew(claim, LEASE) == clock.instant(2 * LEASE - 0.5)
    clock.advance(LEASE - 0.5)  # past the first lease, within the renewed one
    assert store.ownership.claim("j1", "B", LEASE) is None
    store.ownership.record_step(claim, "s", 1)


def test_record_step_and_read_back(store: JobStore, clock: LogicalClock) -> None:
    new(store)
    claim = claimed(store)
    store.ownership.record_step(claim, "fetch", {"order": [1, 2], "ok": True})
    clock.advance(1)
    store.ownership.record_step(claim, "none", None)
    steps = store.reads.steps("j1")
    assert [(s.name, s.output, s.owner, s.fence) for s in steps] == [
        ("fetch", {"order": [1, 2], "ok": True}, "A", 1),
        ("none", None, "A", 1),
    ]
    assert steps[0].recorded_at == clock.instant(0)
    assert steps[1].recorded_at == clock.instant(1)


def test_record_step_twice_is_a_step_error(store: JobStore, engine: Engine) -> None:
    new(store)
    claim = claimed(store)
    store.ownership.record_step(claim, "s1", {"v": 1})
    before = snapshot(engine)
    with pytest.raises(StepError, match="'s1' is already recorded"):
        store.ownership.record_step(claim, "s1", {"v": 2})
    assert snapshot(engine) == before
    assert store.reads.steps("j1")[0].output == {"v": 1}


@pytest.mark.parametrize(
    ("name", "output"), [("s", float("nan")), ("s", {"x": object()}), ("bad name", 1), ("", 1)]
)
def test_bad_step_writes_nothing(store: JobStore, engine: Engine, name: str, output: Any) -> None:
    new(store)
    claim = claimed(store)
    before = snapshot(engine)
    with pytest.raises(InvalidInput):
        store.ownership.record_step(claim, name, output)
    assert snapshot(engine) == before


def test_complete(store: JobStore, clock: LogicalClock) -> None:
    new(store)
    claim = claimed(store, liveness_key=7)
    clock.advance(3)
    job = store.ownership.complete(claim, {"total": 12}).job
    assert job.state is State.COMPLETED
    assert job.result == {"total": 12}
    assert job.lease_until is None
    assert job.finished_at == clock.instant(3)
    assert store.reads.get("j1") == job
    assert store.reads.history("j1")[-1].reason == "completed"


def test_complete_with_a_non_json_result_changes_nothing(store: JobStore, engine: Engine) -> None:
    new(store)
    claim = claimed(store)
    before = snapshot(engine)
    with pytest.raises(InvalidInput):
        store.ownership.complete(claim, float("inf"))
    assert snapshot(engine) == before


def test_fail(store: JobStore, clock: LogicalClock) -> None:
    new(store)
    job = store.ownership.fail(claimed(store), "ValueError: nope").job
    assert job.state is State.FAILED
    assert job.last_error == "ValueError: nope"
    assert job.finished_at == clock.instant()
    assert store.reads.history("j1")[-1].reason == "ValueError: nope"


def test_retry_requeues_with_backoff_and_keeps_the_attempt(
    store: JobStore, clock: LogicalClock
) -> None:
    new(store)
    claim = claimed(store)
    job = store.ownership.retry(claim, "boom", 4)
    assert job.state is State.QUEUED
    assert (job.owner, job.lease_until, job.dispatched_at) == (None, None, None)
    assert job.attempts == 1
    assert job.last_error == "boom"
    assert job.run_after == clock.instant(4)
    assert store.ownership.claim("j1", "B", LEASE) is None
    clock.advance(4)
    again = claimed(store, owner="B")
    assert (again.fence, again.job.attempts) == (2, 2)


def test_retry_with_exhausted_attempts_fails_the_job(store: JobStore, clock: LogicalClock) -> None:
    new(store, max_attempts=1)
    job = store.ownership.retry(claimed(store), "boom", 4)
    assert job.state is State.FAILED
    assert job.last_error is not None
    assert "boom" in job.last_error
    assert "attempts exhausted" in job.last_error
    clock.advance(10)
    assert store.ownership.claim("j1", "B", LEASE) is None


def test_release_gives_the_attempt_back(store: JobStore, clock: LogicalClock) -> None:
    new(store)
    claim = claimed(store)
    clock.advance(1)
    job = store.ownership.release(claim, "delivery budget used up")
    assert job.state is State.QUEUED
    assert job.attempts == 0
    assert (job.owner, job.lease_until) == (None, None)
    assert job.run_after == clock.instant(1)
    assert job.dispatched_at == clock.instant(1)
    assert store.reads.history("j1")[-1].reason == "delivery budget used up"
    assert claimed(store, owner="B").job.attempts == 1


def test_wait_for_approval_parks_the_job(store: JobStore) -> None:
    new(store)
    job = store.ownership.wait_for_approval(claimed(store), "refund over limit", "approval-1")
    assert job.state is State.WAITING_APPROVAL
    assert (job.owner, job.lease_until) == (None, None)
    assert job.attempts == 0
    assert job.waiting_for == "approval-1"
    assert store.ownership.claim("j1", "B", LEASE) is None
    assert store.reads.history("j1")[-1].reason == "refund over limit"


@pytest.mark.parametrize("recorded_by", ["a step", "an approval"])
def test_wait_for_approval_under_a_recorded_step_name_is_refused(
    store: JobStore, engine: Engine, recorded_by: str
) -> None:
    """Otherwise approve() could never record the approval and the job would be stuck."""
    new(store)
    claim = claimed(store)
    if recorded_by == "a step":
        store.ownership.record_step(claim, "approval-1", 1)
    else:
        store.ownership.wait_for_approval(claim, "why", "approval-1")
        store.operator.approve("j1", "alice")
        claim = claimed(store, owner="B")
    before = snapshot(engine)
    with pytest.raises(StepError, match="'approval-1' is already recorded"):
        store.ownership.wait_for_approval(claim, "again", "approval-1")
    assert snapshot(engine) == before
    assert (
        store.ownership.wait_for_approval(claim, "again", "approval-2").state
        is State.WAITING_APPROVAL
    )
    assert store.operator.approve("j1", "bob").state is State.QUEUED


def _expired(store: JobStore, clock: LogicalClock, claim: Claim) -> str:
    clock.advance(LEASE)
    return "the lease expired"


def _newer_claim(store: JobStore, clock: LogicalClock, claim: Claim) -> str:
    clock.advance(LEASE)
    assert store.ownership.claim(claim.job_id, "B", LEASE) is not None
    return "now RUNNING under fence 2"


def _swept(store: JobStore, clock: LogicalClock, claim: Claim) -> str:
    clock.advance(LEASE)
    assert [j.id for j in store.operator.sweep_expired()] == [claim.job_id]
    return "now QUEUED"


def _swept_and_reclaimed_by_me(store: JobStore, clock: LogicalClock, claim: Claim) -> str:
    clock.advance(LEASE)
    store.operator.sweep_expired()
    assert (
        store.ownership.claim(claim.job_id, claim.owner, LEASE) is not None
    )  # same owner, new fence
    return "under fence 2"


def _cancelled(store: JobStore, clock: LogicalClock, claim: Claim) -> str:
    store.operator.cancel(claim.job_id)
    return "cancelled"


FENCED_WRITES: dict[str, Callable[[JobStore, Claim], object]] = {
    "renew": lambda s, c: s.leases.renew(c, LEASE),
    "record_step": lambda s, c: s.ownership.record_step(c, "s1", {"x": 1}),
    "record_progress": lambda s, c: s.progress.record(c, {"done": 1, "total": 2, "message": None}),
    "complete": lambda s, c: s.ownership.complete(c, {"ok": True}),
    "fail": lambda s, c: s.ownership.fail(c, "boom"),
    "retry": lambda s, c: s.ownership.retry(c, "boom", 5),
    "release": lambda s, c: s.ownership.release(c, "shutting down"),
    "wait_for_approval": lambda s, c: s.ownership.wait_for_approval(c, "needs a yes", "approval-1"),
}
LOSSES: dict[str, Callable[[JobStore, LogicalClock, Claim], str]] = {
    "expired": _expired,
    "newer_claim": _newer_claim,
    "swept": _swept,
    "reclaimed_by_same_owner": _swept_and_reclaimed_by_me,
    "cancelled": _cancelled,
}


@pytest.mark.parametrize("write", list(FENCED_WRITES))
def test_fenced_write_succeeds_while_the_lease_is_live(
    store: JobStore, clock: LogicalClock, write: str
) -> None:
    new(store)
    claim = claimed(store)
    clock.advance(LEASE - margin(clock))
    FENCED_WRITES[write](store, claim)  # does not raise


@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("write", list(FENCED_WRITES))
def test_fenced_write_after_losing_the_lease_is_refused_and_changes_nothing(
    store: JobStore, engine: Engine, clock: LogicalClock, write: str, loss: str
) -> None:
    new(store)
    claim = claimed(store)
    store.ownership.record_step(claim, "before", 0)
    why = LOSSES[loss](store, clock, claim)
    before = snapshot(engine)
    with pytest.raises(LeaseLost) as info:
        FENCED_WRITES[write](store, claim)
    assert snapshot(engine) == before
    message = str(info.value)
    assert "'j1'" in message
    assert "'A'" in message
    assert "fence 1" in message
    assert why in message
    assert (info.value.job_id, info.value.owner, info.value.fence) == ("j1", "A", 1)


@pytest.mark.parametrize("write", list(FENCED_WRITES))
def test_fenced_write_with_a_forged_owner_is_refused(
    store: JobStore, engine: Engine, write: str
) -> None:
    new(store)
    claim = claimed(store)
    before = snapshot(engine)
    with pytest.raises(LeaseLost):
        FENCED_WRITES[write](store, dataclasses.replace(claim, owner="B"))
    with pytest.raises(LeaseLost):
        FENCED_WRITES[write](store, dataclasses.replace(claim, fence=2))
    assert snapshot(engine) == before


# -- approvals and cancellation ------------------------------------------------------------


def test_approve_records_who_and_the_reclaim_sees_it(store: JobStore, clock: LogicalClock) -> None:
    new(store)
    claim = claimed(store)
    store.ownership.record_step(claim, "lookup", 42)
    store.ownership.wait_for_approval(claim, "refund over limit", "approval-1")
    clock.advance(60)
    job = store.operator.approve("j1", "alice", "fine by me")
    assert job.state is State.QUEUED
    assert job.waiting_for is None
    assert store.reads.get("j1").waiting_for is None
    assert job.run_after == clock.instant(60)
    assert job.dispatched_at == clock.instant(60)
    last = store.reads.history("j1")[-1]
    assert (last.from_state, last.to_state) == (State.WAITING_APPROVAL, State.QUEUED)
    assert last.approved_by == "alice"
    assert last.reason == "fine by me"
    again = claimed(store, owner="B")
    assert (again.fence, again.job.attempts) == (2, 1)
    outputs = {s.name: s.output for s in store.reads.steps("j1")}
    assert outputs == {"lookup": 42, "approval-1": {"approved_by": "alice", "note": "fine by me"}}
    store.ownership.record_step(again, "refund", True)
    assert store.ownership.complete(again, "done").job.state is State.COMPLETED


def test_approve_without_a_note(store: JobStore) -> None:
    new(store)
    store.ownership.wait_for_approval(claimed(store), "why", "approval-1")
    store.operator.approve("j1", "bob")
    assert store.reads.history("j1")[-1].reason == "approved"
    assert store.reads.steps("j1")[0].output == {"approved_by": "bob", "note": None}


def test_approve_with_a_bad_approver_changes_nothing(store: JobStore, engine: Engine) -> None:
    new(store)
    store.ownership.wait_for_approval(claimed(store), "why", "approval-1")
    before = snapshot(engine)
    with pytest.raises(InvalidInput):
        store.operator.approve("j1", "")
    assert snapshot(engine) == before


def _to_queued(store: JobStore) -> None:
    pass


def _to_running(store: JobStore) -> None:
    claimed(store)


def _to_waiting(store: JobStore) -> None:
    store.ownership.wait_for_approval(claimed(store), "why", "approval-1")


def _to_parked(store: JobStore) -> None:
    store.workflows.wait_for_event(claimed(store), "go", "event:go", None)


def _to_completed(store: JobStore) -> None:
    store.ownership.complete(claimed(store))


def _to_failed(store: JobStore) -> None:
    store.ownership.fail(claimed(store), "err")


def _to_cancelled(store: JobStore) -> None:
    store.operator.cancel("j1")


INTO: dict[State, Callable[[JobStore], None]] = {
    State.QUEUED: _to_queued,
    State.RUNNING: _to_running,
    State.WAITING_APPROVAL: _to_waiting,
    State.WAITING: _to_parked,
    State.COMPLETED: _to_completed,
    State.FAILED: _to_failed,
    State.CANCELLED: _to_cancelled,
}


@pytest.mark.parametrize(
    "source", [State.QUEUED, State.WAITING_APPROVAL, State.WAITING, State.RUNNING]
)
def test_cancel(store: JobStore, clock: LogicalClock, source: State) -> None:
    new(store)
    INTO[source](store)
    clock.advance(1)
    job = store.operator.cancel("j1", "customer asked")
    assert job.state is State.CANCELLED
    assert job.lease_until is None
    assert job.finished_at == clock.instant(1)
    last = store.reads.history("j1")[-1]
    assert (last.from_state, last.to_state, last.reason) == (
        source,
        State.CANCELLED,
        "customer asked",
    )
    assert store.ownership.claim("j1", "B", LEASE) is None


def test_running_owner_notices_the_cancel(store: JobStore, engine: Engine) -> None:
    new(store)
    claim = claimed(store)
    store.operator.cancel("j1")
    before = snapshot(engine)
    with pytest.raises(LeaseLost, match="the job was cancelled"):
        store.ownership.record_step(claim, "s", 1)
    with pytest.raises(LeaseLost, match="cancelled"):
        store.ownership.complete(claim, 1)
    assert snapshot(engine) == before


@pytest.mark.parametrize(
    ("source", "operation"),
    [
        (State.QUEUED, "approve"),
        (State.RUNNING, "approve"),
        (State.COMPLETED, "approve"),
        (State.FAILED, "approve"),
        (State.CANCELLED, "approve"),
        (State.COMPLETED, "cancel"),
        (State.FAILED, "cancel"),
        (State.CANCELLED, "cancel"),
    ],
)
def test_illegal_operator_moves_change_nothing(
    store: JobStore, engine: Engine, source: State, operation: str
) -> None:
    new(store)
    INTO[source](store)
    before = snapshot(engine)
    target = State.QUEUED if operation == "approve" else State.CANCELLED
    move = (
        (lambda: store.operator.approve("j1", "alice"))
        if operation == "approve"
        else (lambda: store.operator.cancel("j1"))
    )
    with pytest.raises(IllegalTransition) as info:
        move()
    assert snapshot(engine) == before
    assert (info.value.source, info.value.target, info.value.job_id) == (source, target, "j1")
    assert f"job 'j1': illegal transition {source.value} -> {target.value}" == str(info.value)


# -- an operator's wake -------------------------------------------------------------------------


def _waiting_on_a_timer(store: JobStore, timer: str) -> None:
    """Job j1, QUEUED and not due for an hour or more: asleep, delayed, or backing off."""
    new(store, delay_seconds=3600 if timer == "delayed" else 0)
    if timer == "sleeping":
        store.ownership.sleep(claimed(store), "nap", store.reads.now() + dt.timedelta(hours=1))
    elif timer == "backing off":
        store.ownership.retry(claimed(store), "boom", 3600)


@pytest.mark.parametrize("timer", ["sleeping", "delayed", "backing off"])
def test_wake_job_makes_a_job_waiting_on_a_timer_due_now(
    store: JobStore, clock: LogicalClock, timer: str
) -> None:
    _waiting_on_a_timer(store, timer)
    waiting = store.reads.get("j1")
    assert store.ownership.claim("j1", "B", LEASE) is None  # not due
    clock.advance(1)

    job = store.operator.wake_job("j1", "customer on the phone")

    assert job.state is State.QUEUED
    assert job.run_after == clock.instant(1)
    assert job.dispatched_at == clock.instant(1)  # the caller rings after the commit
    kept = ("attempts", "fence", "owner", "last_error", "priority", "max_attempts")
    assert {name: getattr(job, name) for name in kept} == {
        name: getattr(waiting, name) for name in kept
    }
    last = store.reads.history("j1")[-1]
    assert (last.from_state, last.to_state, last.reason, last.owner, last.fence) == (
        State.QUEUED,
        State.QUEUED,
        "customer on the phone",
        None,
        waiting.fence,
    )
    with pytest.raises(NothingToWake, match="due already"):
        store.operator.wake_job("j1")  # a second wake finds it due
    again = claimed(store, owner="B")
    assert again.job.attempts == waiting.attempts + 1


def test_wake_job_records_the_default_reason(store: JobStore) -> None:
    _waiting_on_a_timer(store, "delayed")
    store.operator.wake_job("j1")
    assert store.reads.history("j1")[-1].reason == "woken by an operator"


@pytest.mark.parametrize("source", list(State))
def test_wake_job_refuses_a_job_not_waiting_on_a_timer(
    store: JobStore, engine: Engine, source: State
) -> None:
    new(store)
    INTO[source](store)  # QUEUED: due at once
    before = snapshot(engine)
    with pytest.raises(NothingToWake) as info:
        store.operator.wake_job("j1")
    assert snapshot(engine) == before
    assert (info.value.job_id, info.value.state) == ("j1", source)
    why = (
        "is QUEUED and due already: nothing to wake"
        if source is State.QUEUED
        else f"is {source.value}: only a QUEUED job waiting on a timer can be woken"
    )
    assert str(info.value) == f"job 'j1' {why}"


def test_wake_job_refuses_a_job_whose_timer_ran_out(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    new(store, delay_seconds=5)
    clock.advance(5 + margin(clock))
    before = snapshot(engine)
    with pytest.raises(NothingToWake, match="due already"):
        store.operator.wake_job("j1")
    assert snapshot(engine) == before


def test_wake_job_refuses_a_bad_reason_and_changes_nothing(store: JobStore, engine: Engine) -> None:
    _waiting_on_a_timer(store, "delayed")
    before = snapshot(engine)
    with pytest.raises(InvalidInput, match="wake reason"):
        store.operator.wake_job("j1", "x" * 2001)
    assert snapshot(engine) == before


def test_wake_job_joins_the_callers_transaction(store: JobStore, engine: Engine) -> None:
    _waiting_on_a_timer(store, "sleeping")
    before = snapshot(engine)
    with engine.connect() as conn, conn.begin() as transaction:
        store.operator.wake_job("j1", conn=conn)
        transaction.rollback()
    assert snapshot(engine) == before


@pytest.mark.parametrize("source", [State.COMPLETED, State.FAILED, State.CANCELLED])
@pytest.mark.parametrize("write", ["complete", "fail", "retry", "wait_for_approval"])
def test_owner_write_on_an_ended_job_is_refused(
    store: JobStore, engine: Engine, source: State, write: str
) -> None:
    new(store)
    claim = claimed(store)
    if source is State.COMPLETED:
        store.ownership.complete(claim, 1)
    elif source is State.FAILED:
        store.ownership.fail(claim, "x")
    else:
        store.operator.cancel("j1")
    before = snapshot(engine)
    with pytest.raises((LeaseLost, IllegalTransition)):
        FENCED_WRITES[write](store, claim)
    assert snapshot(engine) == before


def test_unknown_ids(store: JobStore, engine: Engine) -> None:
    new(store)
    ghost = dataclasses.replace(
        claimed(store), job=dataclasses.replace(store.reads.get("j1"), id="nope")
    )
    before = snapshot(engine)
    with pytest.raises(UnknownJob, match="unknown job id 'nope'"):
        store.reads.get("nope")
    with pytest.raises(UnknownJob):
        store.operator.approve("nope", "alice")
    with pytest.raises(UnknownJob):
        store.operator.cancel("nope")
    with pytest.raises(UnknownJob):
        store.operator.wake_job("nope")
    for write in FENCED_WRITES.values():
        with pytest.raises(UnknownJob):
            write(store, ghost)
    assert store.reads.steps("nope") == []
    assert store.reads.history("nope") == []
    assert store.operator.expire("nope", "A", 1, "x") is None
    assert snapshot(engine) == before


# -- recovery --------------------------------------------------------------------------------


def test_sweep_expired(store: JobStore, engine: Engine, clock: LogicalClock) -> None:
    new(store, "live")
    new(store, "retry", max_attempts=3)
    new(store, "dead", max_attempts=1)
    store.ownership.claim("live", "A", 100)
    claimed(store, "retry", owner="B")
    claimed(store, "dead", owner="C")
    clock.advance(LEASE - margin(clock))
    assert store.operator.sweep_expired() == []
    clock.advance(margin(clock))
    live_before = store.reads.get("live")
    moved = {job.id: job for job in store.operator.sweep_expired()}
    assert set(moved) == {"retry", "dead"}

    retry = moved["retry"]
    assert retry == store.reads.get("retry")
    assert retry.state is State.QUEUED
    assert retry.attempts == 1  # the lost run counted
    assert (retry.owner, retry.lease_until, retry.dispatched_at) == (None, None, None)
    assert retry.run_after == clock.instant()
    assert retry.last_error == "lease expired"
    last = store.reads.history("retry")[-1]
    assert (last.from_state, last.to_state, last.owner, last.fence, last.reason) == (
        State.RUNNING,
        State.QUEUED,
        "B",
        1,
        "lease expired",
    )

    dead = moved["dead"]
    assert dead.state is State.FAILED
    assert dead.last_error == "lease expired; attempts exhausted"
    assert dead.finished_at == clock.instant()
    assert store.reads.history("dead")[-1].reason == "lease expired; attempts exhausted"

    assert store.reads.get("live") == live_before
    before = snapshot(engine)
    assert store.operator.sweep_expired() == []
    assert snapshot(engine) == before
    assert claimed(store, "retry", owner="D").job.attempts == 2


def test_sweeps_count_every_lost_run_until_failed(store: JobStore, clock: LogicalClock) -> None:
    new(store, max_attempts=2)
    for owner in ("A", "B"):
        claimed(store, owner=owner)
        clock.advance(LEASE)
        [job] = store.operator.sweep_expired()
    assert job.state is State.FAILED
    assert job.attempts == 2
    assert [(t.from_state, t.to_state) for t in store.reads.history("j1")] == [
        (None, State.QUEUED),
        (State.QUEUED, State.RUNNING),
        (State.RUNNING, State.QUEUED),
        (State.QUEUED, State.RUNNING),
        (State.RUNNING, State.FAILED),
    ]


def test_sweep_respects_a_renewed_lease(store: JobStore, clock: LogicalClock) -> None:
    new(store)
    claim = claimed(store)
    clock.advance(LEASE - 1)
    store.leases.renew(claim, LEASE)
    clock.advance(1)
    assert store.operator.sweep_expired() == []
    store.ownership.complete(claim)


def test_expire_is_fenced(store: JobStore, engine: Engine, clock: LogicalClock) -> None:
    new(store)
    claimed(store, owner="A")
    before = snapshot(engine)
    assert store.operator.expire("j1", "A", 2, "owner died") is None
    assert store.operator.expire("j1", "B", 1, "owner died") is None
    assert store.operator.expire("j1", "A", 1, "owner died", only_if_expired=True) is None
    assert snapshot(engine) == before
    job = store.operator.expire("j1", "A", 1, "owner died")
    assert job is not None
    assert job.state is State.QUEUED
    assert job.last_error == "owner died"
    after = snapshot(engine)
    assert store.operator.expire("j1", "A", 1, "owner died") is None  # a second sweeper: no-op
    assert snapshot(engine) == after


def test_expire_of_a_newer_claim_is_refused(store: JobStore, clock: LogicalClock) -> None:
    new(store)
    claimed(store, owner="A")
    clock.advance(LEASE)
    claimed(store, owner="B")
    assert store.operator.expire("j1", "A", 1, "A died") is None
    assert store.reads.get("j1").owner == "B"


def test_due_for_dispatch(store: JobStore, clock: LogicalClock) -> None:
    new(store, "sent")  # published optimistically at t=0
    store.submissions.create("kind", {}, job_id="later", max_attempts=1, delay_seconds=5)
    new(store, "running")
    claimed(store, "running")
    assert store.doorbells.take_due_doorbell_ids(30) == []
    clock.advance(5)
    assert store.doorbells.take_due_doorbell_ids(30) == ["later"]  # never dispatched, now due
    assert store.reads.get("later").dispatched_at == clock.instant(5)
    assert store.doorbells.take_due_doorbell_ids(30) == []  # not twice within the stale window
    clock.advance(29)  # t=34: "sent" was published 34 s ago, "later" 29 s ago
    assert store.doorbells.take_due_doorbell_ids(30) == ["sent"]
    assert store.doorbells.take_due_doorbell_ids(30) == []
    clock.advance(1)  # t=35: "later" is exactly 30 s stale
    assert store.doorbells.take_due_doorbell_ids(30) == ["later"]
    assert store.doorbells.take_due_doorbell_ids(30) == []
    store.doorbells.mark_unrung(["sent"])  # a failed publish: at once, not after the window
    assert store.reads.get("sent").dispatched_at is None
    assert store.doorbells.take_due_doorbell_ids(30) == ["sent"]
    store.doorbells.mark_unrung(["running"])  # not QUEUED: untouched
    assert store.reads.get("running").dispatched_at is not None


def test_due_for_dispatch_limit(store: JobStore) -> None:
    for i in range(5):
        store.doorbells.mark_unrung([new(store, f"j{i}")])
    first = store.doorbells.take_due_doorbell_ids(30, limit=3)
    assert len(first) == 3
    rest = store.doorbells.take_due_doorbell_ids(30, limit=3)
    assert sorted(first + rest) == [f"j{i}" for i in range(5)]


def test_a_backlog_in_the_queue_is_not_published_twice(
    store: JobStore, clock: LogicalClock
) -> None:
    """The sweeper's rule: of the jobs whose doorbell is stale, only as many are re-sent as the
    broker's queue is short of (the rest are waiting behind a backlog, not lost)."""
    from jobs._config.settings import from_env  # noqa: PLC0415
    from jobs._sweeper.sweeper import sweep_once  # noqa: PLC0415

    settings = from_env({"JOBS_RING_AGAIN_AFTER_SECONDS": "30"})
    for i in range(5):
        new(store, f"old{i}")  # published at t=0
        clock.advance(0.001)
    clock.advance(31)
    store.doorbells.mark_unrung([new(store, "never")])  # its publish failed: always sent
    assert store.depth.stale_doorbells(30) == 5
    sent: list[str] = []

    def publish(batch: Batch) -> bool:
        sent.extend(batch.job_ids)
        return True

    report = sweep_once(store, settings, publish, waiting=lambda: 5)  # all 5 still in the queue
    assert sent == ["never"]
    assert report.rung == ("never",)
    sweep_once(store, settings, publish, waiting=lambda: 3)  # the queue is 2 short: 2 lost
    assert sent == ["never", "old0", "old1"]
    sweep_once(store, settings, publish, waiting=lambda: None)  # the broker cannot say
    assert sent == ["never", "old0", "old1", "old2", "old3", "old4"]


# -- reads ------------------------------------------------------------------------------------


def test_history_of_a_full_life(store: JobStore, clock: LogicalClock) -> None:
    new(store)
    claimed(store, owner="A")
    clock.advance(LEASE)
    claim_b = claimed(store, owner="B")
    clock.advance(1)
    store.ownership.wait_for_approval(claim_b, "why", "approval-1")
    clock.advance(1)
    store.operator.approve("j1", "alice")
    claim_c = claimed(store, owner="C")
    clock.advance(1)
    store.ownership.complete(claim_c, "ok")
    history = store.reads.history("j1")
    assert [(t.from_state, t.to_state) for t in history] == [
        (None, State.QUEUED),
        (State.QUEUED, State.RUNNING),
        (State.RUNNING, State.RUNNING),
        (State.RUNNING, State.WAITING_APPROVAL),
        (State.WAITING_APPROVAL, State.QUEUED),
        (State.QUEUED, State.RUNNING),
        (State.RUNNING, State.COMPLETED),
    ]
    assert all((t.from_state, t.to_state) in TRANSITIONS for t in history)
    claims = [t for t in history if t.to_state is State.RUNNING]
    assert [(t.owner, t.fence) for t in claims] == [("A", 1), ("B", 2), ("C", 3)]
    assert history[-1].owner == "C"
    assert history[-1].fence == 3
    assert [t.approved_by for t in history].count("alice") == 1
    assert all(t.at.tzinfo is not None and t.at.utcoffset() == dt.timedelta(0) for t in history)
    assert [t.at for t in history] == sorted(t.at for t in history)
    assert history[-1].at == clock.instant()


def test_list_and_counts(store: JobStore, clock: LogicalClock) -> None:
    new(store, "a")
    clock.advance(1)
    store.submissions.create("other", {}, job_id="b", max_attempts=1)
    clock.advance(1)
    new(store, "c")
    claimed(store, "c")
    assert [j.id for j in store.reads.list()] == ["c", "b", "a"]
    assert [j.id for j in store.reads.list(state=State.RUNNING)] == ["c"]
    assert [j.id for j in store.reads.list(kind="other")] == ["b"]
    assert [j.id for j in store.reads.list(limit=1)] == ["c"]
    assert store.depth.counts() == {
        ("kind", "QUEUED"): 1,
        ("kind", "RUNNING"): 1,
        ("other", "QUEUED"): 1,
    }
    assert store.depth.oldest_queued() == ("a", pytest.approx(2.0, abs=margin(clock) / 2))


def test_logical_timestamps_round_trip_exactly(store: JobStore, clock: LogicalClock) -> None:
    clock.advance(1.123456)
    new(store)
    claim = claimed(store)
    job = store.reads.get("j1")
    for instant in (job.created_at, job.updated_at, job.run_after, job.lease_until):
        assert instant is not None
        assert instant.tzinfo is not None
        assert instant.utcoffset() == dt.timedelta(0)
    assert job.created_at == clock.instant(1.123456)
    assert job.lease_until == clock.instant(1.123456 + LEASE)
    assert claim.job.lease_until == job.lease_until


def test_one_statement_built_once_reads_each_tick_of_a_logical_clock(engine: Engine) -> None:
    """A logical clock is a bound parameter: a statement built once reads the instant of the
    tick it runs at, and seconds given as a bound parameter or as a number agree."""
    clock = LogicalClock(1.5)
    statement = select(clock.now(), clock.after(bindparam("s", type_=Float())), clock.after(2.25))
    with engine.connect() as conn:
        for tick in (1.5, 7.25):
            clock.tick = tick
            now, bound, given = conn.execute(statement, {"s": 2.25}).one()
            assert now == clock.instant(tick)
            assert bound == given == clock.instant(tick + 2.25)
            assert conn.execute(statement, {"s": 2.25, **clock.values()}).one() == (
                now,
                bound,
                given,
            )


def test_naive_datetimes_are_refused() -> None:
    from jobs._store.clock import UtcDateTime  # noqa: PLC0415

    with pytest.raises(ValueError, match="naive datetime"):
        UtcDateTime().process_bind_param(dt.datetime(2000, 1, 1), make_engine("sqlite://").dialect)


# -- the real database clock ---------------------------------------------------------------


def test_real_clock_timestamps_are_aware_utc_and_now(make_store: Callable[..., JobStore]) -> None:
    store = make_store(clock=DatabaseClock())
    before = dt.datetime.now(UTC)
    new(store)
    claim = claimed(store)
    after = dt.datetime.now(UTC)
    job = store.reads.get("j1")
    slack = dt.timedelta(seconds=2)
    history = [t.at for t in store.reads.history("j1")]
    for instant in (job.created_at, job.updated_at, job.run_after, *history):
        assert instant.tzinfo is not None
        assert instant.utcoffset() == dt.timedelta(0)
        assert before - slack <= instant <= after + slack
    assert job.lease_until is not None
    lease = (job.lease_until - job.updated_at).total_seconds()
    assert LEASE - 0.5 < lease < LEASE + 0.5
    assert claim.job == job


def test_real_clock_lease_expiry(make_store: Callable[..., JobStore]) -> None:
    store = make_store(clock=DatabaseClock())
    new(store)
    first = store.ownership.claim("j1", "A", 0.5)
    assert first is not None
    assert store.ownership.claim("j1", "B", 0.5) is None
    store.ownership.record_step(first, "s1", 1)
    time.sleep(0.55)
    with pytest.raises(LeaseLost, match="expired"):
        store.ownership.record_step(first, "s2", 2)
    second = store.ownership.claim("j1", "B", LEASE)
    assert second is not None
    assert second.fence == 2
    with pytest.raises(LeaseLost):
        store.leases.renew(first, LEASE)
    store.leases.renew(second, LEASE)
    store.ownership.complete(second, "done")
    assert [s.name for s in store.reads.steps("j1")] == ["s1"]


def test_real_clock_sweep_and_dispatch(make_store: Callable[..., JobStore]) -> None:
    store = make_store(clock=DatabaseClock())
    new(store, "a")
    new(store, "b")
    store.ownership.claim("a", "A", 0.2)
    store.ownership.claim("b", "B", 30)
    time.sleep(0.25)
    assert [j.id for j in store.operator.sweep_expired()] == ["a"]
    assert store.doorbells.take_due_doorbell_ids(30) == ["a"]
    assert store.doorbells.take_due_doorbell_ids(30) == []
    time.sleep(0.25)
    assert store.doorbells.take_due_doorbell_ids(0.2) == ["a"]


def test_real_clock_oldest_queued(make_store: Callable[..., JobStore]) -> None:
    store = make_store(clock=DatabaseClock())
    assert store.depth.oldest_queued() is None
    new(store, "first")
    time.sleep(0.05)
    new(store, "second")
    oldest = store.depth.oldest_queued()
    assert oldest is not None
    assert oldest[0] == "first"
    assert 0.04 <= oldest[1] < 5


def test_real_clock_history_is_ordered(make_store: Callable[..., JobStore]) -> None:
    store = make_store(clock=DatabaseClock())
    new(store)
    claim = claimed(store)
    store.ownership.record_step(claim, "s", 1)
    store.ownership.complete(claim)
    at = [t.at for t in store.reads.history("j1")]
    assert len(at) == 3
    assert at == sorted(at)


@pytest.mark.postgres
def test_postgres_history_uses_clock_timestamp(clean_pg_engine: Engine) -> None:
    store = JobStore(clean_pg_engine)
    new(store)
    claim = claimed(store)
    store.ownership.complete(claim)
    at = [t.at for t in store.reads.history("j1")]
    assert len(at) == 3
    assert at[0] < at[1] < at[2]  # microsecond instants, not one per second or transaction
    # Inside one transaction now() stands still; the store's clock must not.
    clock = DatabaseClock()
    with clean_pg_engine.begin() as conn:
        first = conn.execute(select(clock.now())).scalar_one()
        conn.execute(text("SELECT pg_sleep(0.01)"))
        second = conn.execute(select(clock.now())).scalar_one()
        later = conn.execute(select(clock.after(5))).scalar_one()
    assert first < second
    assert later - second > dt.timedelta(seconds=4.9)


@pytest.mark.postgres
def test_postgres_timestamps_are_utc_whatever_the_session_zone(clean_pg_engine: Engine) -> None:
    store = JobStore(clean_pg_engine, clock=LogicalClock(tick=0.5))
    new(store)
    with clean_pg_engine.connect() as conn:
        conn.execute(text("SET TIME ZONE 'America/Los_Angeles'"))
        created = conn.execute(select(JobsTable.created_at)).scalar_one()
        conn.rollback()
    assert created == LogicalClock.EPOCH + dt.timedelta(seconds=0.5)
    assert created.utcoffset() == dt.timedelta(0)
