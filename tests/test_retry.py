"""An operator's retry (FAILED or CANCELLED -> QUEUED) and the bulk actions on selected
jobs, on every executor (SQLite, PostgreSQL through SQLAlchemy, PostgreSQL on the driver).

Every refusal is checked twice: the error says why, and a snapshot of every row of the job
tables is identical before and after.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest
from sqlalchemy import Engine

from jobs._core.errors import IllegalTransition, InvalidInput, LeaseLost, UnknownJob
from jobs._core.records import JobFilter, Selected
from jobs._core.states import State
from jobs._store import Claim, JobStore
from jobs._store.clock import LogicalClock
from jobs._store.operations import retry_reason
from tests.conftest import LEASE, claimed, snapshot


def new(store: JobStore, job_id: str = "j1", kind: str = "kind", max_attempts: int = 3) -> str:
    job, created = store.submissions.create(
        kind, {"n": 1}, job_id=job_id, max_attempts=max_attempts
    )
    assert created
    return job.id


def failed_at_third_step(store: JobStore, job_id: str = "j1") -> Claim:
    """A job whose run recorded two steps and failed at the third, for good (one attempt)."""
    new(store, job_id, max_attempts=1)
    claim = claimed(store, job_id)
    store.ownership.record_step(claim, "charge", {"charged": 10})
    store.ownership.record_step(claim, "ship", {"parcel": "P1"})
    job = store.ownership.retry(claim, "email: ConnectionTimeout", 5)  # no attempts left: FAILED
    assert job.state is State.FAILED
    return claim


# -- one job ------------------------------------------------------------------------------


def test_retry_of_a_failed_job_keeps_its_steps_and_gives_fresh_attempts(
    store: JobStore, clock: LogicalClock
) -> None:
    claim = failed_at_third_step(store)
    clock.advance(5)
    job = store.operator.retry("j1", "alice", "fixed the mailer")
    assert job.state is State.QUEUED
    assert (job.attempts, job.max_attempts) == (0, 1)
    assert job.fence == claim.fence + 1
    assert (job.owner, job.lease_until, job.finished_at, job.waiting_for) == (None,) * 4
    assert job.run_after == clock.instant()  # due now
    assert job.dispatched_at == clock.instant()  # the caller rings after the commit
    assert job.last_error == "email: ConnectionTimeout; attempts exhausted"
    assert [step.name for step in store.reads.steps("j1")] == ["charge", "ship"]
    last = store.reads.history("j1")[-1]
    assert (last.from_state, last.to_state, last.at) == (
        State.FAILED,
        State.QUEUED,
        clock.instant(),
    )
    assert last.reason == retry_reason("alice", "fixed the mailer", from_start=False)
    assert "retried by alice: fixed the mailer" in (last.reason or "")
    assert "kept" in (last.reason or "")
    again = store.ownership.claim("j1", "B", LEASE)  # the re-run replays the recorded steps
    assert again is not None
    assert again.has_steps
    assert (again.fence, again.job.attempts) == (claim.fence + 2, 1)


def test_retry_from_the_start_drops_the_recorded_steps(store: JobStore) -> None:
    failed_at_third_step(store)
    job = store.operator.retry("j1", "alice", "bad data in step one", from_start=True)
    assert job.state is State.QUEUED
    assert store.reads.steps("j1") == []
    reason = store.reads.history("j1")[-1].reason or ""
    assert "from the start" in reason
    assert "dropped" in reason
    again = store.ownership.claim("j1", "B", LEASE)
    assert again is not None
    assert not again.has_steps


def test_retry_of_a_job_cancelled_while_waiting_for_approval(store: JobStore) -> None:
    new(store)
    store.ownership.wait_for_approval(claimed(store), "needs a yes", "approval-1")
    store.operator.cancel("j1", "not today")
    job = store.operator.retry("j1", "bob", "today after all")
    assert job.state is State.QUEUED
    assert job.waiting_for is None  # the re-run asks for the approval again
    assert store.reads.history("j1")[-1].from_state is State.CANCELLED


@pytest.mark.parametrize("source", [State.QUEUED, State.RUNNING, State.WAITING_APPROVAL])
def test_retry_of_a_job_not_ended_is_refused_and_changes_nothing(
    store: JobStore, engine: Engine, source: State
) -> None:
    new(store)
    if source is State.RUNNING:
        claimed(store)
    elif source is State.WAITING_APPROVAL:
        store.ownership.wait_for_approval(claimed(store), "why", "approval-1")
    before = snapshot(engine)
    with pytest.raises(IllegalTransition) as info:
        store.operator.retry("j1", "alice", "again")
    assert (info.value.source, info.value.target, info.value.job_id) == (source, State.QUEUED, "j1")
    assert snapshot(engine) == before


def test_retry_of_a_completed_job_is_refused(store: JobStore, engine: Engine) -> None:
    new(store)
    store.ownership.complete(claimed(store), {"ok": True})
    before = snapshot(engine)
    with pytest.raises(IllegalTransition, match=r"COMPLETED -> QUEUED"):
        store.operator.retry("j1", "alice", "again")
    assert snapshot(engine) == before


def test_retry_of_an_unknown_job_or_by_nobody_changes_nothing(
    store: JobStore, engine: Engine
) -> None:
    failed_at_third_step(store)
    before = snapshot(engine)
    with pytest.raises(UnknownJob):
        store.operator.retry("nope", "alice", "again")
    with pytest.raises(InvalidInput, match="retrier"):
        store.operator.retry("j1", "", "again")
    with pytest.raises(InvalidInput, match="retry reason"):
        store.operator.retry("j1", "alice", "nul\x00")
    assert snapshot(engine) == before


def test_the_fence_bump_refuses_the_old_owners_writes(store: JobStore, engine: Engine) -> None:
    new(store)
    old = claimed(store)
    store.operator.cancel("j1", "stop")  # the owner has not noticed yet
    store.operator.retry("j1", "alice", "go on")
    newer = claimed(store, owner=old.owner)  # the same worker name, even
    assert newer.fence == old.fence + 2
    before = snapshot(engine)
    with pytest.raises(LeaseLost):
        store.ownership.record_step(old, "late", 1)
    with pytest.raises(LeaseLost):
        store.ownership.complete(old, "stale result")
    assert snapshot(engine) == before
    assert store.ownership.complete(newer, "fresh").job.state is State.COMPLETED


def test_the_fence_bump_makes_an_older_selection_stale(store: JobStore) -> None:
    """Selected as CANCELLED, then retried and cancelled again by someone else: back in the
    same state, but not the job that was selected. Without the bump the stale bulk write
    would match it."""
    new(store)
    store.operator.cancel("j1", "first")
    [seen] = store.reads.select_jobs(JobFilter(state=State.CANCELLED), 10)[1]
    store.operator.retry("j1", "bob", "retry")
    store.operator.cancel("j1", "second thoughts")
    outcome = store.operator.retry_selected([seen], "alice", "bulk")
    assert (outcome.done, outcome.skipped) == ([], ["j1"])
    assert store.reads.get("j1").state is State.CANCELLED
    assert store.reads.history("j1")[-1].reason == "second thoughts"


# -- many jobs ----------------------------------------------------------------------------


def test_select_jobs_by_kind_state_since_and_error(store: JobStore, clock: LogicalClock) -> None:
    for job_id, kind, error in [
        ("a", "sync", "Timeout talking to the bank"),
        ("b", "sync", "KeyError: 'vat'"),
        ("c", "mail", "timeout"),
    ]:
        new(store, job_id, kind, max_attempts=1)
        store.ownership.fail(claimed(store, job_id), error)
        clock.advance(10)
    new(store, "d", "sync")
    later = clock.instant(15)  # after a (tick 0) and b (tick 10) failed
    count, selected = store.reads.select_jobs(JobFilter(kind="sync", state=State.FAILED), 10)
    assert (count, [s.id for s in selected]) == (2, ["a", "b"])
    assert selected[0] == Selected("a", State.FAILED, 1)
    by_error = store.reads.select_jobs(JobFilter(error_like="TIMEOUT"), 10)[1]
    assert [s.id for s in by_error] == ["a", "c"]  # case-insensitive, anywhere in the error
    assert [s.id for s in store.reads.select_jobs(JobFilter(error_like="KeyError:"), 10)[1]] == [
        "b"
    ]
    assert store.reads.select_jobs(JobFilter(error_like="KeyError%"), 10)[1] == []  # literal %
    assert [s.id for s in store.reads.select_jobs(JobFilter(since=later), 10)[1]] == ["c", "d"]
    count, first = store.reads.select_jobs(JobFilter(kind="sync"), 2)
    assert (count, [s.id for s in first]) == (3, ["a", "b"])  # the count is of all matches
    listed = store.reads.list(where=JobFilter(kind="sync", error_like="timeout"))
    assert [job.id for job in listed] == ["a"]


def test_bulk_retry_skips_jobs_that_changed_since_the_selection(store: JobStore) -> None:
    for job_id in ("a", "b", "c", "d"):
        failed_at_third_step(store, job_id)
    _count, selected = store.reads.select_jobs(JobFilter(state=State.FAILED), 10)
    # Meanwhile: b is retried by someone else and running again; c is retried and failed
    # again (FAILED once more, under a newer fence).
    store.operator.retry("b", "bob", "one by one")
    claimed(store, "b", "W")
    store.operator.retry("c", "bob", "one by one")
    store.ownership.fail(claimed(store, "c", "W"), "still broken")
    b_before, c_before = store.reads.get("b"), store.reads.get("c")
    outcome = store.operator.retry_selected(selected, "alice", "deployed the fix")
    assert sorted(job.id for job in outcome.done) == ["a", "d"]
    assert sorted(outcome.skipped) == ["b", "c"]
    assert store.reads.get("b") == b_before
    assert store.reads.get("c") == c_before
    assert {store.reads.get(job_id).state for job_id in ("a", "d")} == {State.QUEUED}


def test_bulk_cancel_never_cancels_a_job_that_started_running_meanwhile(
    store: JobStore,
) -> None:
    new(store, "a")
    new(store, "b")
    selected = store.reads.select_jobs(JobFilter(state=State.QUEUED), 10)[1]
    claimed(store, "b")  # RUNNING -> CANCELLED is legal, but it is not what was selected
    outcome = store.operator.cancel_selected(selected, "poisoned queue")
    assert [job.id for job in outcome.done] == ["a"]
    assert outcome.skipped == ["b"]
    assert store.reads.get("b").state is State.RUNNING


def test_bulk_approve_only_approves_waiting_jobs(store: JobStore) -> None:
    new(store, "a")
    store.ownership.wait_for_approval(claimed(store, "a"), "why", "approval-1")
    failed_at_third_step(store, "f")
    selected = store.reads.select_jobs(JobFilter(), 10)[1]
    outcome = store.operator.approve_selected(selected, "carol", "ok")
    assert [job.id for job in outcome.done] == ["a"]
    assert outcome.skipped == ["f"]  # a FAILED job is not retried by an approval
    assert store.reads.get("f").state is State.FAILED
    assert store.reads.history("a")[-1].approved_by == "carol"
    assert [step.name for step in store.reads.steps("a")] == ["approval-1"]


@pytest.mark.parametrize(
    "bulk",
    [
        lambda s, selected: s.operator.retry_selected(selected, "", "x"),
        lambda s, selected: s.operator.approve_selected(selected, "\x1b[31m"),
        lambda s, selected: s.operator.cancel_selected(selected, "nul\x00"),
    ],
)
def test_bad_bulk_input_changes_nothing(
    store: JobStore, engine: Engine, bulk: Callable[[JobStore, list[Selected]], object]
) -> None:
    failed_at_third_step(store)
    selected = store.reads.select_jobs(JobFilter(), 10)[1]
    before = snapshot(engine)
    with pytest.raises(InvalidInput):
        bulk(store, selected)
    assert snapshot(engine) == before


def test_job_filter_describes_itself() -> None:
    assert JobFilter().empty
    since = dt.datetime(2025, 1, 2, 9, 0, tzinfo=dt.UTC)
    where = JobFilter(State.FAILED, "sync", since, "Timeout")
    assert not where.empty
    assert where.described() == (
        "--kind sync --state FAILED --since 2025-01-02T09:00:00+00:00 --error-like 'Timeout'"
    )
