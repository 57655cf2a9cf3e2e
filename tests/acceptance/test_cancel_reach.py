"""A cancel reaches the code a real worker runs: ``jobctl cancel`` of a job 60 s into a
long step interrupts it within about one heartbeat (a third of the 3 s lease), the job
ends CANCELLED with the cancel's reason and nothing recorded for the step, and the worker
goes on to the next job.

On a prefork pool the child stuck in ``time.sleep`` is ended (as at a time limit) and
the pool starts a new one; a step that returns on ``ctx.on_cancel`` keeps its child. On a
threads pool nothing can end a thread: the step polls ``ctx.cancelled``. An ``async def``
step (``how == "async"``) is cancelled where it awaits, on every pool, and keeps its
process.

``test_cancel_latency`` measures the latency over ten cancels per pool (from the cancel's
history row to the step's end) and prints p50/p99 (run with ``-s`` to read them).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import psutil
import pytest

from jobs._core.states import State
from tests.acceptance.conftest import PG_RABBITMQ, Proc, Stack, wait_until

pytestmark = pytest.mark.acceptance

REASON = "customer withdrew (alice)"
# One beat (1 s) plus the prefork grace (0.5 s) plus the child's exit, with room.
WITHIN = 2.0


def jobctl_cancel(stack: Stack, job_id: str, reason: str = REASON) -> None:
    subprocess.run(
        [sys.executable, "-m", "jobs", "cancel", job_id, "--reason", reason],
        env=stack.env,
        check=True,
        capture_output=True,
        timeout=60,
    )


def cancelled_at(stack: Stack, job_id: str) -> float:
    """The wall-clock instant of the cancel's history row (the database's clock)."""
    history = stack.history(job_id)
    assert history[-1].to_state is State.CANCELLED
    assert history[-1].reason == REASON
    return history[-1].at.timestamp()


def started(stack: Stack, job_id: str) -> int:
    """The pid of the process running ``job_id``'s long step, once it started."""
    return stack.wait_effect(job_id, "long:start", timeout=60)[0][1]


def ended_process(pid: int) -> bool:
    """Whether ``pid`` exited (a zombie until the pool's main process reaps it, which may
    come seconds later)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def cancel_one(stack: Stack, how: str) -> tuple[str, int, float]:
    """Submit a 60 s step, cancel it with ``jobctl cancel`` once it runs; returns the job,
    the pid that ran the step and the instant its end was seen (for ``how == "sleep"``
    the pid's exit, else the step's own ``long:cancelled`` effect)."""
    if how == "async":
        job_id = stack.submit("async_long_step", {"seconds": 60})
    else:
        job_id = stack.submit("long_step", {"how": how, "seconds": 60})
    pid = started(stack, job_id)
    time.sleep(0.3)  # well inside the step
    jobctl_cancel(stack, job_id)
    if how == "sleep":
        wait_until(lambda: ended_process(pid), 30, "the stuck pool child to be ended", 0.01)
        ended = time.time()
    else:
        ended = wait_until(
            lambda: [
                at for name, _pid, at in stack.timed_effects(job_id) if name == "long:cancelled"
            ],
            30,
            f"job {job_id}'s step to return",
        )[0]
    return job_id, pid, ended


def check_cancelled(stack: Stack, job_id: str) -> None:
    job = stack.wait_state(job_id)
    assert job.state is State.CANCELLED
    assert job.result is None
    assert stack.steps(job_id) == []  # the interrupted step's output is not recorded
    assert stack.effect_count(job_id, "long:done") == 0
    assert stack.effect_count(job_id, "after") == 0
    assert stack.effect_count(job_id, "long:start") == 1  # not run again


def next_job_runs(stack: Stack, n: int) -> None:
    after = stack.submit("check_order", {"order_id": n, "check_seconds": 0.1})
    assert stack.wait_state(after).state is State.COMPLETED


def timed_cancel(stack: Stack, how: str) -> float:
    job_id, _pid, ended = cancel_one(stack, how)
    latency = ended - cancelled_at(stack, job_id)
    check_cancelled(stack, job_id)
    return latency


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_prefork_child_stuck_in_a_cancelled_step_is_ended(stack: Stack) -> None:
    worker = stack.worker("A", pool="prefork", concurrency=1)
    before = set(worker.pool_children())
    latency = timed_cancel(stack, "sleep")
    print(f"prefork, time.sleep step: ended {latency:.2f} s after the cancel")
    assert latency < WITHIN
    assert "the job was cancelled; ending pool process" in worker.output()
    wait_until(
        lambda: len(children := set(worker.pool_children())) == 1 and not children & before,
        30,
        "the pool to replace its child",
    )
    next_job_runs(stack, 1)
    assert worker.alive()


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_prefork_step_released_by_on_cancel_keeps_its_child(stack: Stack) -> None:
    worker = stack.worker("A", pool="prefork", concurrency=1)
    job_id, pid, ended = cancel_one(stack, "wait")
    latency = ended - cancelled_at(stack, job_id)
    print(f"prefork, step released by on_cancel: {latency:.2f} s after the cancel")
    assert latency < WITHIN
    check_cancelled(stack, job_id)
    next_job_runs(stack, 2)
    assert worker.pool_children() == [pid]  # returned on its own: not ended
    assert "ending pool process" not in worker.output()


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_threads_pool_step_polling_ctx_cancelled_returns(stack: Stack) -> None:
    worker = stack.worker("A", pool="threads", concurrency=2)
    latency = timed_cancel(stack, "poll")
    print(f"threads, polling step: returned {latency:.2f} s after the cancel")
    assert latency < WITHIN
    next_job_runs(stack, 3)
    assert worker.alive()


def percentiles(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return (
        f"n={len(ordered)} p50={statistics.median(ordered):.2f} s p99={p99:.2f} s "
        f"max={ordered[-1]:.2f} s"
    )


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
@pytest.mark.parametrize("pool", ["prefork", "threads", "gevent", "solo"])
def test_an_async_step_is_cancelled_where_it_awaits(stack: Stack, pool: str) -> None:
    worker = stack.worker("A", pool=pool, concurrency=2 if pool != "solo" else 1)
    job_id, pid, ended = cancel_one(stack, "async")
    latency = ended - cancelled_at(stack, job_id)
    print(f"{pool}, async step: CancelledError {latency:.2f} s after the cancel")
    assert latency < WITHIN
    check_cancelled(stack, job_id)
    next_job_runs(stack, 5)
    assert not ended_process(pid)  # the step returned: its process goes on
    assert "ending pool process" not in worker.output()


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
@pytest.mark.parametrize(
    ("pool", "how"),
    [("prefork", "sleep"), ("threads", "poll"), ("prefork", "async"), ("threads", "async")],
)
def test_cancel_latency(stack: Stack, pool: str, how: str) -> None:
    worker: Proc = stack.worker("A", pool=pool, concurrency=1)
    latencies = []
    for _ in range(10):
        if pool == "prefork":  # the ended child's replacement is up before the next job
            wait_until(
                lambda: [pid for pid in worker.pool_children() if not ended_process(pid)],
                30,
                "the pool's child",
            )
        latencies.append(timed_cancel(stack, how))
    print(f"cancel latency, {pool} pool, {how} step: {percentiles(latencies)}")
    assert statistics.median(latencies) < WITHIN
    next_job_runs(stack, 4)
