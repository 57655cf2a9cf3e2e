"""``async def`` handlers and steps (issue 28 part 1): recorded and replayed as sync steps
are, on the store contract's every executor with a logical clock; cancelled where they
await; on one loop per thread, reused across jobs and never across a fork.

A crash is a step function raising ``SystemExit`` (it escapes the runner as a dying
process would, leaving the job RUNNING under its claim); the clock then passes the lease
and another owner resumes the job. Real worker processes (every Celery pool, a SIGKILL)
are in tests/acceptance/test_pools.py.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

import jobs
from jobs import testing
from jobs._core.async_context import AsyncJobContext
from jobs._core.registry import Registry
from jobs._core.states import State
from jobs._service.replay_check import replay_check
from jobs._store import JobStore
from jobs._store.clock import LogicalClock
from jobs._store.db import make_engine
from jobs._store.deferred import hold_completions
from jobs._worker.event_loops import EventLoops
from jobs._worker.run_results import Outcome, RunResult
from jobs._worker.runner import EVENT_LOOPS
from tests.conftest import StoreRuns, step_positions
from tests.test_api import use_short_lease
from tests.test_held_completions import _busy

KINDS = Registry(imports=[])
RAN: Counter[str] = Counter()
SEEN: dict[str, Any] = {}
CODE: dict[str, Any] = {}
CRASH: set[str] = set()
STARTED = threading.Event()


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    for held in (RAN, SEEN, CODE, CRASH):
        held.clear()
    STARTED.clear()
    yield
    for held in (RAN, SEEN, CODE, CRASH):
        held.clear()


def _count(name: str) -> None:
    RAN[name] += 1
    if name in CRASH:
        CRASH.discard(name)
        raise SystemExit(f"crash inside {name}")


async def fetch(name: str, ctx: AsyncJobContext | None = None) -> dict[str, Any]:
    """An async step's body: awaits, counts the run, notes its thread and key."""
    await asyncio.sleep(0)
    SEEN.setdefault("async_threads", set()).add(threading.get_ident())
    if ctx is not None:
        SEEN.setdefault(f"key/{name}", []).append(ctx.idempotency_key())
    _count(name)
    return {"name": name}


def compute(name: str) -> str:
    """A sync step's body, inside an async handler: runs in a thread, off the loop."""
    SEEN.setdefault("sync_threads", set()).add(threading.get_ident())
    _count(name)
    return name


@KINDS.job("async_steps", max_attempts=5)
async def async_steps(ctx: AsyncJobContext) -> list[Any]:
    SEEN["loop_thread"] = threading.get_ident()
    SEEN.setdefault("loops", []).append(id(asyncio.get_running_loop()))
    names = CODE.get("steps", ["a", "b", "c"])
    first = await ctx.step(names[0], fetch, names[0], ctx)
    second = await ctx.step(names[1], compute, names[1])
    third = await ctx.step(names[2], fetch, names[2], ctx)
    return [first, second, third]


@KINDS.job("async_gathered", max_attempts=5)
async def async_gathered(ctx: AsyncJobContext) -> list[Any]:
    """Two steps asked for at once: recorded one after the other, in the order asked."""
    return list(await asyncio.gather(ctx.step("x", fetch, "x"), ctx.step("y", fetch, "y")))


@KINDS.job("async_waits", max_attempts=5)
async def async_waits(ctx: AsyncJobContext) -> str:
    await ctx.step("before", fetch, "before")
    await ctx.sleep("nap", 30)
    approval = await ctx.wait_for_approval("sign off")
    ctx.progress(3, total=3, message="done")
    await ctx.step("after", fetch, "after")
    return str(approval["approved_by"])


@KINDS.job("async_leaf", max_attempts=3)
async def async_leaf(ctx: AsyncJobContext, n: int) -> int:
    return int(await ctx.step("double", _double, n))


async def _double(n: int) -> int:
    await asyncio.sleep(0)
    return 2 * n


@KINDS.job("async_fan_out", max_attempts=3)
async def async_fan_out(ctx: AsyncJobContext) -> int:
    child = await ctx.spawn("async_leaf", {"n": 10}, key="one")
    mapped = await ctx.map("async_leaf", [{"n": 1}, {"n": 2}])
    (alone,) = await ctx.wait_for([child])
    return int(sum(mapped) + alone)


@KINDS.job("async_nested", max_attempts=1)
async def async_nested(ctx: AsyncJobContext) -> None:
    async def inner() -> None:
        await ctx.step("inner", fetch, "inner")

    await ctx.step("outer", inner)


@KINDS.job("async_timed", max_attempts=2)
async def async_timed(ctx: AsyncJobContext) -> None:
    await ctx.step("slow", asyncio.sleep, 30, timeout=0.2)


@KINDS.job("async_failing", max_attempts=2)
async def async_failing(ctx: AsyncJobContext) -> None:
    await ctx.step("fine", fetch, "fine")
    await ctx.step("broken", _broken)


async def _broken() -> None:
    raise ValueError("provider down")


@KINDS.job("async_left_over", max_attempts=1)
async def async_left_over(ctx: AsyncJobContext) -> str:
    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            SEEN["left_over_cancelled"] = True
            raise

    SEEN["task"] = asyncio.ensure_future(forever())
    await asyncio.sleep(0)
    return "left a task running"


RUNS = StoreRuns(KINDS, CRASH)


# -- steps, replay, determinism --------------------------------------------------------------


def test_async_and_sync_steps_run_and_are_recorded(store: JobStore) -> None:
    store.submissions.create("async_steps", {}, job_id="s1", max_attempts=5)
    result = RUNS.runner(store).run("s1")
    assert result.outcome is Outcome.COMPLETED, result.error
    assert result.ran_steps == ("a", "b", "c")
    job = store.reads.get("s1")
    assert job.result == [{"name": "a"}, "b", {"name": "c"}]
    assert step_positions(store, "s1") == {"a": 0, "b": 1, "c": 2}
    # Async steps run on the loop's thread; the sync one in a thread of its own.
    assert SEEN["async_threads"] == {SEEN["loop_thread"]}
    assert SEEN["loop_thread"] not in SEEN["sync_threads"]


def test_a_crash_resumes_without_running_a_recorded_step_again(
    store: JobStore, clock: LogicalClock
) -> None:
    store.submissions.create("async_steps", {}, job_id="s2", max_attempts=5)
    RUNS.crash(store, "s2", inside="c")
    assert step_positions(store, "s2") == {"a": 0, "b": 1}
    result = RUNS.resume(store, clock, "s2")
    assert result.outcome is Outcome.COMPLETED, result.error
    assert result.replayed_steps == ("a", "b")
    assert result.ran_steps == ("c",)
    assert (RAN["a"], RAN["b"], RAN["c"]) == (1, 1, 2)  # c's first run died unrecorded
    # c's idempotency key is the same on the run that died and the one that recorded it.
    first, second = SEEN["key/c"]
    assert first == second
    assert store.reads.get("s2").result == [{"name": "a"}, "b", {"name": "c"}]


def test_a_renamed_async_step_fails_the_job_as_non_deterministic(
    store: JobStore, clock: LogicalClock
) -> None:
    store.submissions.create("async_steps", {}, job_id="s3", max_attempts=5)
    RUNS.crash(store, "s3", inside="c")
    CODE["steps"] = ["a", "b_renamed", "c"]
    result = RUNS.resume(store, clock, "s3")
    assert result.outcome is Outcome.FAILED
    error = store.reads.get("s3").last_error or ""
    assert error.startswith("NonDeterministic: ")
    assert "position 1" in error
    assert "'b_renamed'" in error
    assert RAN["b_renamed"] == 0
    assert step_positions(store, "s3") == {"a": 0, "b": 1}


def test_gathered_steps_are_recorded_one_after_the_other_in_the_order_asked(
    store: JobStore, clock: LogicalClock
) -> None:
    store.submissions.create("async_gathered", {}, job_id="g1", max_attempts=5)
    RUNS.crash(store, "g1", inside="y")
    assert step_positions(store, "g1") == {"x": 0}
    result = RUNS.resume(store, clock, "g1")
    assert result.outcome is Outcome.COMPLETED, result.error
    assert step_positions(store, "g1") == {"x": 0, "y": 1}
    assert store.reads.get("g1").result == [{"name": "x"}, {"name": "y"}]
    assert RAN["x"] == 1


def test_a_failing_async_step_is_retried_and_records_nothing(store: JobStore) -> None:
    store.submissions.create("async_failing", {}, job_id="f1", max_attempts=2)
    result = RUNS.runner(store).run("f1")
    assert result.outcome is Outcome.RETRYING
    assert result.error == "ValueError: provider down"
    assert step_positions(store, "f1") == {"fine": 0}


def test_a_context_call_inside_a_step_is_refused(store: JobStore) -> None:
    store.submissions.create("async_nested", {}, job_id="n1", max_attempts=1)
    result = RUNS.runner(store).run("n1")
    assert result.outcome is Outcome.FAILED
    assert "a context call inside step 'outer'" in (result.error or "")


def test_an_async_step_past_its_timeout_is_cancelled_and_the_attempt_counts(
    store: JobStore,
) -> None:
    store.submissions.create("async_timed", {}, job_id="t1", max_attempts=2)
    began = time.monotonic()
    result = RUNS.runner(store).run("t1")  # no heartbeat: the step's own time-out stops it
    assert time.monotonic() - began < 5
    assert result.outcome is Outcome.RETRYING
    assert result.error == "step 'slow' passed its timeout of 0.2 s"
    assert step_positions(store, "t1") == {}


# -- waits, timers, children -----------------------------------------------------------------


def test_async_sleep_and_approval_park_the_job_and_resume_past_them(
    store: JobStore, clock: LogicalClock
) -> None:
    store.submissions.create("async_waits", {}, job_id="w1", max_attempts=5)
    assert RUNS.runner(store).run("w1").outcome is Outcome.SLEEPING
    clock.advance(31)
    assert RUNS.runner(store).run("w1").outcome is Outcome.WAITING_APPROVAL
    store.operator.approve("w1", by="alice")
    result = RUNS.runner(store).run("w1")
    assert result.outcome is Outcome.COMPLETED, result.error
    assert result.replayed_steps == ("before", "nap", "approval-1")
    assert RAN["before"] == 1
    job = store.reads.get("w1")
    assert job.result == "alice"
    assert job.progress is not None
    assert job.progress["done"] == 3
    assert step_positions(store, "w1") == {"before": 0, "nap": 1, "approval-1": 2, "after": 3}


def test_async_spawn_map_and_wait_for(store: JobStore) -> None:
    store.submissions.create("async_fan_out", {}, job_id="p1", max_attempts=3)
    assert RUNS.runner(store).run("p1").outcome is Outcome.WAITING
    children = ["p1.one", "p1.map.0", "p1.map.1"]
    for child in children:
        assert RUNS.runner(store).run(child).outcome is Outcome.COMPLETED
    result = RUNS.runner(store).run("p1")
    assert result.outcome is Outcome.COMPLETED, result.error
    assert store.reads.get("p1").result == 2 + 4 + 20


# -- the loop ----------------------------------------------------------------------------


def test_one_loop_per_thread_is_reused_and_left_clean(store: JobStore) -> None:
    loops = EventLoops()
    for job_id in ("l1", "l2"):
        store.submissions.create("async_steps", {}, job_id=job_id, max_attempts=5)
        assert RUNS.runner(store, event_loops=loops).run(job_id).outcome is Outcome.COMPLETED
    assert SEEN["loops"][0] == SEEN["loops"][1] == id(loops.loop())
    store.submissions.create("async_left_over", {}, job_id="l3", max_attempts=1)
    assert RUNS.runner(store, event_loops=loops).run("l3").outcome is Outcome.COMPLETED
    assert SEEN["left_over_cancelled"] is True  # not left to run inside the next job
    other: list[int] = []
    thread = threading.Thread(target=lambda: other.append(id(loops.loop())))
    thread.start()
    thread.join()
    assert other[0] != id(loops.loop())  # another thread, another loop
    loops.close()


def test_the_shared_loop_cancels_what_a_run_left_and_no_other_runs_tasks() -> None:
    """The gevent pool's path (``run_shared``), from two threads standing in for two
    greenlets: the run that ends first has its left-over task cancelled, while the task
    the other run still awaits runs on to its end."""
    loops = EventLoops()
    started = threading.Event()
    outcomes: dict[str, str] = {}

    async def sleeper(name: str, seconds: float) -> None:
        try:
            await asyncio.sleep(seconds)
            outcomes[name] = "finished"
        except asyncio.CancelledError:
            outcomes[name] = "cancelled"
            raise

    async def leaves_a_task() -> str:
        SEEN["task"] = asyncio.ensure_future(sleeper("left", 3600))
        await asyncio.sleep(0)
        return "left a task running"

    async def awaits_its_task() -> str:
        child = asyncio.ensure_future(sleeper("awaited", 0.5))
        started.set()
        await child
        return "awaited its task"

    other = threading.Thread(
        target=lambda: outcomes.update(other=loops.run_shared(awaits_its_task()))
    )
    other.start()
    assert started.wait(5)
    assert loops.run_shared(leaves_a_task()) == "left a task running"
    assert outcomes["left"] == "cancelled"
    other.join(5)
    assert outcomes["other"] == "awaited its task"
    assert outcomes["awaited"] == "finished"
    loops.close()


def test_a_forked_child_builds_a_loop_of_its_own() -> None:
    parent = EVENT_LOOPS.loop()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a loop of its own, never the parent's
        try:
            fresh = EVENT_LOOPS.loop()
            same = fresh is parent
            ran = fresh.run_until_complete(asyncio.sleep(0, "ran"))
            os.write(write, f"{same} {ran}".encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 100).decode() == "False ran"
    assert EVENT_LOOPS.loop() is parent


# -- cancellation reaches an awaiting step ---------------------------------------------------


@jobs.job("async_cancel_in_step", max_attempts=1)
async def async_cancel_in_step(ctx: AsyncJobContext) -> str:
    await ctx.step("first", fetch, "first")
    await ctx.step("long", _long_call)
    SEEN["after"] = True
    return "finished anyway"


async def _long_call() -> str:
    STARTED.set()
    try:
        await asyncio.sleep(20)
    except asyncio.CancelledError:
        SEEN["cancelled_at"] = time.monotonic()
        raise
    return "done"


@jobs.job("async_cancel_outside", max_attempts=1)
async def async_cancel_outside(ctx: AsyncJobContext) -> str:
    STARTED.set()
    try:
        await asyncio.sleep(20)  # not in a step: the handler itself is cancelled here
    except asyncio.CancelledError:
        SEEN["cancelled_at"] = time.monotonic()
        raise
    await ctx.step("late", fetch, "late")
    return "finished anyway"


def _run_and_cancel(kind: str) -> tuple[str, RunResult, float]:
    job_id = jobs.submit(kind)
    results: list[RunResult] = []
    thread = threading.Thread(target=lambda: results.append(testing.run(job_id)), daemon=True)
    thread.start()
    assert STARTED.wait(10), "the step never started"
    assert jobs.cancel(job_id, "not needed").state is State.CANCELLED
    cancelled_at = time.monotonic()
    thread.join(20)
    assert not thread.is_alive(), "the cancelled run did not end"
    return job_id, results[0], cancelled_at


@pytest.mark.parametrize("kind", ["async_cancel_in_step", "async_cancel_outside"])
def test_a_cancel_raises_cancelled_error_where_the_job_awaits(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_short_lease(monkeypatch, 0.6)  # a beat every 0.2 s
    job_id, result, cancelled_at = _run_and_cancel(kind)
    assert SEEN["cancelled_at"] - cancelled_at < 1.0  # within a beat, on a loaded machine
    assert "after" not in SEEN
    assert RAN["late"] == 0
    assert result.outcome is Outcome.LEASE_LOST
    assert "cancelled" in (result.error or "")
    assert jobs.get(job_id).state is State.CANCELLED
    recorded = [step.name for step in jobs.steps(job_id)]
    assert recorded == (["first"] if kind == "async_cancel_in_step" else [])


# -- held completions (PostgreSQL) -------------------------------------------------------


@pytest.mark.postgres
def test_an_async_jobs_completion_is_held_for_the_next_claim(
    pg_url: str, clean_pg_engine: Engine
) -> None:
    """The outcome is written by the runner after the loop returns, as for a sync job: on
    a busy process it is held and carried by the next claim, never seen COMPLETED first."""
    engine = make_engine(pg_url)
    try:
        store = JobStore(engine)
        hold_completions(store.statements, 60.0)
        _busy(store)
        for job_id in ("h1", "h2"):
            store.submissions.create("async_leaf", {"n": 4}, job_id=job_id, max_attempts=3)
        assert RUNS.runner(store).run("h1").outcome is Outcome.COMPLETED
        with clean_pg_engine.connect() as conn:
            state = conn.execute(text("SELECT state FROM jobs WHERE id = 'h1'")).scalar_one()
        assert state == "RUNNING"  # held: not committed yet
        assert store.statements.held is not None
        assert RUNS.runner(store).run("h2").outcome is Outcome.COMPLETED  # its claim carries h1's
        done = store.reads.get("h1")
        assert done.state is State.COMPLETED
        assert done.result == 8
        assert [step.name for step in store.reads.steps("h1")] == ["double"]
        assert store.statements.held.carried >= 1
    finally:
        engine.dispose()


# -- the replay check ----------------------------------------------------------------------


def test_the_replay_check_replays_an_async_handler_in_dry_mode(
    store: JobStore, clock: LogicalClock
) -> None:
    store.submissions.create("async_steps", {}, job_id="r1", max_attempts=5)
    RUNS.crash(store, "r1", inside="c")
    ran = dict(RAN)
    report = replay_check(store, KINDS)
    assert (report.checked, report.ok, report.findings) == (1, 1, [])
    assert dict(RAN) == ran  # no step function ran: a and b replayed, c is new code
    CODE["steps"] = ["a", "b_renamed", "c"]
    report = replay_check(store, KINDS)
    (found,) = report.findings
    assert found.verdict == "diverged"
    assert found.error is not None
    assert (found.error.position, found.error.recorded, found.error.asked) == (1, "b", "b_renamed")
    assert found.replayed == 1
    assert dict(RAN) == ran
    assert store.reads.get("r1").state is State.RUNNING  # nothing written


# -- the loop is not blocked; the run's time limit -------------------------------------------


@KINDS.job("async_ticking", max_attempts=1)
async def async_ticking(ctx: AsyncJobContext) -> int:
    """A sync step (a blocking call) runs in a thread: the loop's other coroutines go on."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.ensure_future(tick())
    await ctx.step("blocking", time.sleep, 0.5)
    ticker.cancel()
    return ticks


def test_a_sync_step_blocks_none_of_the_loops_other_coroutines(store: JobStore) -> None:
    store.submissions.create("async_ticking", {}, job_id="k1", max_attempts=1)
    result = RUNS.runner(store).run("k1")
    assert result.outcome is Outcome.COMPLETED, result.error
    assert store.reads.get("k1").result >= 10  # ticked all through the half second


@jobs.job("async_run_timeout", max_attempts=1, timeout=1)
async def async_run_timeout(ctx: AsyncJobContext) -> None:
    await ctx.step("long", _long_call)  # no step timeout: the kind's limit stops it


def test_the_kinds_time_limit_cancels_an_awaiting_step(monkeypatch: pytest.MonkeyPatch) -> None:
    use_short_lease(monkeypatch, 0.6)  # the heartbeat watches the deadline
    job_id = jobs.submit("async_run_timeout")
    began = time.monotonic()
    result = testing.run(job_id)
    assert time.monotonic() - began < 5
    assert SEEN["cancelled_at"] - began < 3  # CancelledError inside the step, at the limit
    assert result.outcome is Outcome.LEASE_LOST  # the heartbeat wrote the outcome
    job = jobs.get(job_id)
    assert job.state is State.FAILED
    assert job.last_error == "the job passed its timeout of 1 s"
    assert jobs.steps(job_id) == []
