"""Time limits: ``@jobs.job(timeout=…)`` and ``ctx.step(…, timeout=…)``.

The heartbeat reads its deadlines on the test's logical clock (the store's clock too), so
a step "hangs" for as long as the test says and the time-out is decided by the clock, not
by a race with the machine's load. The real worker (a pool child stuck in ``time.sleep``
and in a busy loop, ended and replaced) is tested in tests/acceptance/test_time_limits.py.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jobs._core.errors import InvalidInput
from jobs._core.heartbeat import LeaseHeartbeat
from jobs._core.registry import Registry
from jobs._core.states import State
from jobs._store import JobStore
from jobs._store.clock import LogicalClock
from jobs._worker.run_results import Outcome, RunResult
from jobs._worker.runner import Runner

LEASE = 30.0


class Hung:
    """A step function that blocks until released, and says when it started."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        self.started.set()
        self.release.wait(30)
        return "done"


@pytest.fixture
def registry() -> Registry:
    return Registry(imports=())


@pytest.fixture
def stopped() -> list[str]:
    """Reasons ``stop_process`` was called with (a prefork child would exit there)."""
    return []


@pytest.fixture
def heartbeat(store: JobStore, clock: LogicalClock, stopped: list[str]) -> Iterator[LeaseHeartbeat]:
    beat = LeaseHeartbeat(store, LEASE, stop_process=stopped.append, monotonic=lambda: clock.tick)
    yield beat
    beat.stop()


@pytest.fixture
def runner(store: JobStore, registry: Registry, heartbeat: LeaseHeartbeat) -> Runner:
    """A worker's runner, its heartbeat reading the test's logical clock."""
    return Runner(store, "A", registry=registry, heartbeat=heartbeat, lease_seconds=LEASE)


@pytest.fixture
def hung() -> Hung:
    """The step a test's handler hangs in (:func:`start_hung` releases it at the end)."""
    return Hung()


@dataclasses.dataclass
class HungRun:
    """A run in a thread of its own, its handler stuck in the ``hung`` step."""

    job_id: str
    hung: Hung
    thread: threading.Thread
    results: list[RunResult]

    def finish(self) -> RunResult:
        """Let the stuck step return, and the run's result once it ended."""
        self.hung.release.set()
        self.thread.join(10)
        assert not self.thread.is_alive(), "the run did not end"
        return self.results[0]


@pytest.fixture
def start_hung(store: JobStore, runner: Runner, hung: Hung) -> Iterator[Callable[..., HungRun]]:
    """``start_hung(kind, max_attempts=3)`` submits a job of ``kind`` (registered by the test,
    its handler calling the ``hung`` step), runs it in a thread and returns once the step
    has started. At the end, even of a failed test, the step is released and the runs
    are waited for: no thread is left stuck."""
    threads: list[threading.Thread] = []

    def start(kind: str, max_attempts: int = 3) -> HungRun:
        job_id = submit(store, kind, max_attempts)
        results: list[RunResult] = []
        thread = threading.Thread(target=lambda: results.append(runner.run(job_id)), daemon=True)
        thread.start()
        threads.append(thread)
        assert hung.started.wait(10), "the step never started"
        return HungRun(job_id, hung, thread, results)

    yield start
    hung.release.set()
    for thread in threads:
        thread.join(10)


def wait_for(check: Callable[[], Any], what: str, timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def submit(store: JobStore, kind: str, max_attempts: int = 3) -> str:
    job, _ = store.submissions.create(kind, {}, job_id="t1", max_attempts=max_attempts)
    return job.id


def left_state(store: JobStore, job_id: str, state: State = State.RUNNING) -> Any:
    return wait_for(
        lambda: (job := store.reads.get(job_id)).state is not state and job, f"job to leave {state}"
    )


def test_a_hung_step_past_its_timeout_is_retried_with_the_reason(
    store: JobStore,
    clock: LogicalClock,
    registry: Registry,
    heartbeat: LeaseHeartbeat,
    stopped: list[str],
    hung: Hung,
    start_hung: Callable[..., HungRun],
) -> None:
    @registry.job("hangs")
    def hangs(ctx: Any) -> str:
        return ctx.step("wait", hung, timeout=2)

    run = start_hung("hangs")
    job_id = run.job_id
    clock.advance(1.9)
    time.sleep(0.2)  # the heartbeat looks every 50 ms: nothing is due yet
    assert store.reads.get(job_id).state is State.RUNNING
    assert stopped == []

    clock.advance(0.2)
    job = left_state(store, job_id)
    assert job.state is State.QUEUED
    assert job.attempts == 1  # the attempt counts
    assert job.owner is None
    assert job.last_error == "step 'wait' passed its timeout of 2 s"
    assert store.reads.history(job_id)[-1].reason == "retry: step 'wait' passed its timeout of 2 s"
    assert clock.ticks_of(job.run_after) == pytest.approx(clock.tick + 1.0)  # the backoff
    # The handler was still stuck when the outcome was written: its process is stopped.
    assert stopped == [f"job {job_id}: step 'wait' passed its timeout of 2 s"]
    assert heartbeat.watching() == []  # its lease is no longer renewed

    # In-process the stuck step returns in the end: it writes nothing.
    assert run.finish().outcome is Outcome.LEASE_LOST
    assert store.reads.steps(job_id) == []
    assert store.reads.get(job_id).state is State.QUEUED


def test_a_hung_step_on_the_last_attempt_fails_the_job_with_the_reason(
    store: JobStore,
    clock: LogicalClock,
    registry: Registry,
    hung: Hung,
    start_hung: Callable[..., HungRun],
) -> None:
    @registry.job("hangs")
    def hangs(ctx: Any) -> str:
        return ctx.step("wait", hung, timeout=5)

    run = start_hung("hangs", max_attempts=1)
    clock.advance(5)
    job = left_state(store, run.job_id)
    assert job.state is State.FAILED
    assert job.last_error == "step 'wait' passed its timeout of 5 s"
    assert run.finish().outcome is Outcome.LEASE_LOST


def test_the_job_timeout_covers_the_whole_run(
    store: JobStore,
    clock: LogicalClock,
    registry: Registry,
    stopped: list[str],
    hung: Hung,
    start_hung: Callable[..., HungRun],
) -> None:
    @registry.job("slow", timeout=10)
    def slow(ctx: Any) -> str:
        ctx.step("first", lambda: 1)
        clock.advance(6)
        return ctx.step("second", hung)  # no step timeout: the job's runs out

    run = start_hung("slow")
    job_id = run.job_id
    time.sleep(0.2)
    assert store.reads.get(job_id).state is State.RUNNING
    clock.advance(4)
    job = left_state(store, job_id)
    assert job.state is State.QUEUED
    assert job.last_error == "the job passed its timeout of 10 s"
    assert [step.name for step in store.reads.steps(job_id)] == ["first"]  # recorded with it
    assert len(stopped) == 1
    assert run.finish().outcome is Outcome.LEASE_LOST


def test_steps_within_their_limits_run_on_and_stop_nothing(
    store: JobStore, clock: LogicalClock, registry: Registry, runner: Runner, stopped: list[str]
) -> None:
    @registry.job("quick", timeout=100)
    def quick(ctx: Any) -> int:
        ctx.step("a", lambda: clock.advance(1), timeout=2)
        clock.advance(20)  # long after step a's limit, but a returned in time
        time.sleep(0.2)  # the heartbeat looks meanwhile
        return int(ctx.step("b", lambda: 7, timeout=2))

    job_id = submit(store, "quick")
    assert runner.run(job_id).outcome is Outcome.COMPLETED
    assert store.reads.get(job_id).result == 7
    assert stopped == []


def test_a_step_returning_late_without_a_heartbeat_is_timed_out(
    store: JobStore, registry: Registry
) -> None:
    calls = []

    @registry.job("late")
    def late(ctx: Any) -> str:
        def sleepy() -> str:
            calls.append(1)
            time.sleep(0.3)
            return "late"

        return ctx.step("sleepy", sleepy, timeout=0.1)

    job_id = submit(store, "late")
    runner = Runner(store, "A", registry=registry, heartbeat=None, lease_seconds=LEASE)
    result = runner.run(job_id)
    assert result.outcome is Outcome.RETRYING
    assert result.error == "step 'sleepy' passed its timeout of 0.1 s"
    job = store.reads.get(job_id)
    assert (job.state, job.attempts) == (State.QUEUED, 1)
    assert store.reads.steps(job_id) == []  # a timed-out step's output is not recorded
    assert calls == [1]


@pytest.mark.parametrize(
    ("timeout", "message"),
    [
        (0, "job kind 'k': timeout must be between 0.1 and 604800, got 0"),
        (-5, "job kind 'k': timeout must be between 0.1 and 604800, got -5"),
        (float("nan"), "job kind 'k': timeout must be between 0.1 and 604800, got nan"),
        (float("inf"), "job kind 'k': timeout must be between 0.1 and 604800, got inf"),
        (1e9, "job kind 'k': timeout must be between 0.1 and 604800, got 1000000000.0"),
        (True, "job kind 'k': timeout must be a number"),
        ("5", "job kind 'k': timeout must be a number"),
    ],
)
def test_a_job_timeout_is_checked_when_the_kind_is_declared(
    registry: Registry, timeout: Any, message: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        registry.job("k", timeout=timeout)(lambda ctx: None)
    assert str(refused.value) == message
    assert registry.names() == []


def test_a_bad_step_timeout_fails_the_job_before_the_step_runs(
    store: JobStore, registry: Registry
) -> None:
    calls = []

    @registry.job("bad")
    def bad(ctx: Any) -> None:
        ctx.step("s", lambda: calls.append(1), timeout=-1)

    job_id = submit(store, "bad")
    result = Runner(store, "A", registry=registry, lease_seconds=LEASE).run(job_id)
    assert result.outcome is Outcome.FAILED
    assert result.error == "timeout of step 's' must be between 0.1 and 604800, got -1"
    assert calls == []
    assert store.reads.get(job_id).attempts == 1


def test_the_backstop_is_armed_one_lease_past_a_deadline_and_disarmed_after(
    store: JobStore, clock: LogicalClock, registry: Registry
) -> None:
    armed: list[float | None] = []
    beat = LeaseHeartbeat(
        store,
        LEASE,
        stop_process=lambda why: None,
        backstop=armed.append,
        monotonic=lambda: clock.tick,
    )

    @registry.job("timed")
    def timed(ctx: Any) -> int:
        clock.advance(1)
        return int(ctx.step("a", lambda: 5, timeout=2))

    @registry.job("untimed")
    def untimed(ctx: Any) -> int:
        return int(ctx.step("a", lambda: 5))

    runner = Runner(store, "A", registry=registry, heartbeat=beat, lease_seconds=LEASE)
    try:
        first, _ = store.submissions.create("timed", {}, job_id="t1", max_attempts=1)
        assert runner.run(first.id).outcome is Outcome.COMPLETED
        assert armed == [2 + LEASE, None]  # at the step's start; disarmed when it returned
        armed.clear()
        second, _ = store.submissions.create("untimed", {}, job_id="t2", max_attempts=1)
        assert runner.run(second.id).outcome is Outcome.COMPLETED
        assert armed == []  # no limit, no timer calls
    finally:
        beat.stop()
