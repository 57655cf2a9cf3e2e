"""Cancelling a running job reaches the code that runs it: the heartbeat's renewal is
refused, one read beside it says the job was cancelled, and the run's context learns it
(``ctx.cancelled``, ``ctx.on_cancel``) while its step is still running. Nothing the
interrupted step returns is recorded.

Here through ``jobs.testing`` (the worker's runner and heartbeat, in this process) and
on the heartbeat itself; a real ``celery worker`` (prefork children ended, threads told)
is tested in tests/acceptance/test_cancel_reach.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import jobs
from jobs import testing
from jobs._core.context import JobContext
from jobs._core.errors import JobCancelled, LeaseLost
from jobs._core.heartbeat import LeaseHeartbeat
from jobs._core.records import Claim
from jobs._core.states import State
from jobs._store import JobStore
from jobs._worker.run_results import Outcome, RunResult
from tests.test_api import use_short_lease

SEEN: dict[str, Any] = {}
STARTED = threading.Event()


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    SEEN.clear()
    STARTED.clear()
    yield
    SEEN.clear()


def _wait_released(ctx: JobContext) -> str:
    released = threading.Event()

    def heard() -> None:
        SEEN.setdefault("threads", []).append(threading.current_thread().name)
        SEEN["heard_at"] = time.monotonic()
        released.set()

    def broken() -> None:
        raise RuntimeError("a callback that fails")

    ctx.on_cancel(broken)  # logged, and the next callback is still called
    ctx.on_cancel(heard)
    STARTED.set()
    released.wait(20)
    SEEN["cancelled_in_step"] = ctx.cancelled
    return "interrupted"


@jobs.job("cancel_blocked", max_attempts=1)
def cancel_blocked(ctx: JobContext) -> str:
    ctx.step("first", lambda: 1)
    ctx.step("long", _wait_released, ctx)
    SEEN["after"] = True
    return "finished anyway"


def _poll(ctx: JobContext) -> str:
    STARTED.set()
    until = time.monotonic() + 20
    while not ctx.cancelled and time.monotonic() < until:
        time.sleep(0.01)
    SEEN["noticed_at"] = time.monotonic()
    return "stopped early"


@jobs.job("cancel_polling", max_attempts=1)
def cancel_polling(ctx: JobContext) -> str:
    ctx.step("long", _poll, ctx)
    SEEN["after"] = True
    return "finished anyway"


@jobs.job("cancel_then_sleep", max_attempts=1)
def cancel_then_sleep(ctx: JobContext) -> str:
    STARTED.set()
    until = time.monotonic() + 20
    while not ctx.cancelled and time.monotonic() < until:
        time.sleep(0.01)
    SEEN["handler_thread"] = threading.current_thread().name
    late: list[str] = []
    ctx.on_cancel(lambda: late.append(threading.current_thread().name))
    SEEN["late"] = late  # known already: called at once, in the handler's thread
    try:
        ctx.sleep("nap", 600)
    except JobCancelled as stop:
        SEEN["sleep_raised"] = str(stop)
        raise
    SEEN["slept"] = True
    return "slept"


def run_and_cancel(kind: str, reason: str) -> tuple[str, RunResult, float]:
    """Run a job of ``kind`` in a thread, cancel it once its step started; the run's result
    and the monotonic instant of the cancel's commit."""
    job_id = jobs.submit(kind)
    results: list[RunResult] = []
    thread = threading.Thread(target=lambda: results.append(testing.run(job_id)), daemon=True)
    thread.start()
    assert STARTED.wait(10), "the step never started"
    assert jobs.cancel(job_id, reason).state is State.CANCELLED
    cancelled_at = time.monotonic()
    thread.join(20)
    assert not thread.is_alive(), "the cancelled run did not end"
    return job_id, results[0], cancelled_at


def test_on_cancel_is_called_once_from_the_heartbeat_while_the_step_runs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    use_short_lease(monkeypatch, 0.6)  # a beat every 0.2 s
    caplog.set_level(logging.ERROR, logger="jobs.context")
    job_id, result, cancelled_at = run_and_cancel("cancel_blocked", "customer withdrew")
    assert SEEN["threads"] == ["jobs-heartbeat"]  # once, from the heartbeat's thread
    latency = SEEN["heard_at"] - cancelled_at
    assert latency < 1.0, latency  # within a beat (0.2 s), with room for a loaded machine
    assert SEEN["cancelled_in_step"] is True
    assert "after" not in SEEN  # the run stopped at the end of the step
    assert "an on_cancel callback raised" in caplog.text
    assert result.outcome is Outcome.LEASE_LOST
    assert result.error is not None
    assert "cancelled" in result.error
    job = jobs.get(job_id)
    assert job.state is State.CANCELLED
    assert job.result is None
    # "first" was recorded when "long" started; "long"'s output was refused.
    assert [step.name for step in jobs.steps(job_id)] == ["first"]
    assert jobs.history(job_id)[-1].reason == "customer withdrew"


def test_a_step_polling_ctx_cancelled_returns_within_a_beat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    use_short_lease(monkeypatch, 0.6)
    job_id, result, cancelled_at = run_and_cancel("cancel_polling", "stop it")
    assert SEEN["noticed_at"] - cancelled_at < 1.0
    assert "after" not in SEEN
    assert result.outcome is Outcome.LEASE_LOST
    assert jobs.get(job_id).state is State.CANCELLED
    assert jobs.steps(job_id) == []  # "stopped early" is not recorded
    assert jobs.history(job_id)[-1].reason == "stop it"


def test_after_a_cancel_on_cancel_runs_at_once_and_a_timer_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    use_short_lease(monkeypatch, 0.6)
    job_id, result, _at = run_and_cancel("cancel_then_sleep", "not needed any more")
    assert SEEN["late"] == [SEEN["handler_thread"]]
    assert "the job was cancelled" in SEEN["sleep_raised"]
    assert "slept" not in SEEN
    assert result.outcome is Outcome.LEASE_LOST
    job = jobs.get(job_id)
    assert job.state is State.CANCELLED
    assert jobs.steps(job_id) == []  # no timer recorded


@jobs.job("cancel_bad_callback", max_attempts=1)
def cancel_bad_callback(ctx: JobContext) -> None:
    ctx.on_cancel("not a function")  # type: ignore[arg-type]


def test_on_cancel_refuses_what_it_cannot_call() -> None:
    job = testing.perform_job("cancel_bad_callback")
    assert job.state is State.FAILED
    assert job.last_error == "InvalidInput: on_cancel needs a callable, got str"


# -- the heartbeat: one read for the refused, and the process ended for a stuck run ----


def _claimed(store: JobStore, job_id: str, owner: str = "A") -> Claim:
    store.submissions.create("k", {}, job_id=job_id, max_attempts=3)
    claim = store.ownership.claim(job_id, owner, 30)
    assert claim is not None
    return claim


def test_why_lost_many_tells_a_cancel_from_a_takeover_in_one_read(store: JobStore) -> None:
    cancelled = _claimed(store, "c1")
    live = _claimed(store, "c2")
    store.operator.cancel("c1", "by alice")
    explained = store.leases.why_lost_many([cancelled, live])
    assert isinstance(explained["c1"], JobCancelled)
    assert not isinstance(explained["c2"], JobCancelled)
    assert isinstance(explained["c2"], LeaseLost)
    assert store.leases.why_lost_many([]) == {}


class _Run:
    """What the runner hands the heartbeat for one run: its on_lost, recording the calls."""

    def __init__(self) -> None:
        self.lost: list[LeaseLost] = []

    def __call__(self, lost: LeaseLost) -> None:
        self.lost.append(lost)


def test_a_cancelled_run_still_in_its_handler_has_its_process_ended(store: JobStore) -> None:
    stopped: list[str] = []
    now = [0.0]
    heartbeat = LeaseHeartbeat(
        store, 30, stop_process=stopped.append, monotonic=lambda: now[0], cancel_grace=0.25
    )
    try:
        stuck, returned, running = (
            _claimed(store, "s1"),
            _claimed(store, "s2"),
            _claimed(store, "s3"),
        )
        told = {claim.job_id: _Run() for claim in (stuck, returned, running)}
        for claim in (stuck, returned, running):
            heartbeat.watch(claim, told[claim.job_id])
        store.operator.cancel("s1")
        store.operator.cancel("s2")
        heartbeat.beat()
        assert [type(lost) for lost in told["s1"].lost] == [JobCancelled]
        assert [type(lost) for lost in told["s2"].lost] == [JobCancelled]
        assert told["s3"].lost == []
        assert [claim.job_id for claim in heartbeat.watching()] == ["s3"]
        heartbeat.unwatch(returned)  # s2's handler returned within the grace
        assert heartbeat.end_cancelled_runs() == []  # the grace is not over yet
        now[0] = 0.3
        assert heartbeat.end_cancelled_runs() == ["s1"]
        assert stopped == ["job s1: the job was cancelled"]
        assert heartbeat.end_cancelled_runs() == []  # once
        assert store.reads.get("s1").state is State.CANCELLED
    finally:
        heartbeat.stop()
