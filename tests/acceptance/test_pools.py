"""Every Celery pool is a first-class execution path: the same cases run on prefork,
threads, gevent and solo, each on a real ``celery worker`` against PostgreSQL and
RabbitMQ.

- A drain of three-step jobs (:mod:`jobs.examples.agent`): every job whose delivery Celery
  logged as succeeded is COMPLETED in the table, none is left RUNNING.
- SIGKILL of the worker mid-step: the jobs resume from their recorded steps on another
  worker, and no recorded step runs again.
- A warm shutdown (SIGTERM) mid-drain: the worker exits with nothing left RUNNING (running
  jobs are handed back at their next step, finished ones are committed), and another
  worker finishes the rest without running a recorded step again.
- Time limits, where the pool can end a stuck step (prefork); elsewhere the run's own
  time limit is noticed at the next step.
- A database outage mid-drain (a throwaway PostgreSQL stopped for a few seconds while
  steps are in flight): every job completes once it is back, and no recorded step runs
  twice.
"""

from __future__ import annotations

import importlib.util
import re
import signal
import time
from typing import Any

import pytest

from jobs._core.states import State
from tests.acceptance.conftest import (
    KINDS,
    PG_RABBITMQ,
    PRIVATE_PG_RABBITMQ,
    PrivatePostgres,
    Proc,
    Stack,
    assert_recorded_steps_ran_once,
    wait_until,
)

pytestmark = pytest.mark.acceptance


def _pool(name: str, concurrency: int, drain: int, module: str | None = None) -> Any:
    marks = []
    if module is not None and importlib.util.find_spec(module) is None:
        marks.append(pytest.mark.skip(reason=f"{module} is not installed"))
    return pytest.param(name, concurrency, drain, marks=marks, id=name)


# The pools, each with its concurrency (many jobs per process where the pool shares one:
# threads, gevent) and the size of its drain: several rounds of its concurrency, few
# enough for a loaded machine (the solo pool stalls up to 2 s between deliveries with late
# acknowledgement, and Celery's gevent pool takes about 10 deliveries a second with a
# prefetch of one per greenlet, plain Celery's as ours). eventlet is not among them:
# psycopg does not cooperate with its hub (a database round trip blocks every greenlet,
# and leases run out), and Celery deprecates it.
POOLS = [
    _pool("prefork", 4, 24),
    _pool("threads", 50, 200),
    _pool("gevent", 100, 100, "gevent"),
    _pool("solo", 1, 8),
]

# The pools whose jobs share one process.
SHARED = ("threads", "gevent")
# The agent's turn, written sync and ``async def`` (jobs.examples.agent): every case runs
# both on every pool.
AGENTS = [
    pytest.param("agent_turn", id="sync"),
    pytest.param("agent_turn_async", id="async"),
]
ENDED = "ending pool process"
# Celery's line for a delivery that succeeded with its job's run completed (a hand-back
# or a dropped duplicate also succeeds, with another outcome).
COMPLETED_DELIVERY = re.compile(r"\] succeeded in [0-9.e-]+s: '([\w-]+): completed'")


@pytest.fixture
def agents(stack: Stack) -> Stack:
    """The stack, its workers importing the agent kind beside the others."""
    stack.configure(JOBS_IMPORTS=f"{KINDS},jobs.examples.agent")
    return stack


def _states(stack: Stack, job_ids: list[str]) -> dict[str, State]:
    return {job_id: stack.job(job_id).state for job_id in job_ids}


def _completed_now_or_soon(stack: Stack, job_ids: list[str], pool: str) -> None:
    """Where jobs share a process every completion committed before its run returned, so
    before Celery logged it succeeded: COMPLETED now. Where a process runs one job at a
    time its last completion may be held for the next claim, a few milliseconds: COMPLETED
    within a few seconds. (A completion lost is never COMPLETED: no sweeper runs here.)"""
    if pool in SHARED:
        states = _states(stack, job_ids)
    else:
        wait_until(
            lambda: all(state is State.COMPLETED for state in _states(stack, job_ids).values()),
            10,
            "every held completion to be sent",
            interval=0.2,
        )
        states = _states(stack, job_ids)
    left = {job_id: state for job_id, state in states.items() if state is not State.COMPLETED}
    assert not left, f"{len(left)} of {len(job_ids)} jobs not COMPLETED after Celery's succeeded"


def _completed_deliveries(proc: Proc) -> set[str]:
    """The jobs whose delivery Celery logged as succeeded with the run completed."""
    return set(COMPLETED_DELIVERY.findall(proc.output()))


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize(("pool", "concurrency", "drain"), POOLS)
@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_drain_leaves_every_succeeded_delivery_completed(
    agents: Stack, agent: str, pool: str, concurrency: int, drain: int
) -> None:
    stack = agents
    n = drain
    job_ids = [stack.submit(agent, {"prompt": f"order {i}"}) for i in range(n)]
    started = time.monotonic()
    worker = stack.worker("A", pool=pool, concurrency=concurrency)  # a backlog to drain
    wait_until(
        lambda: _completed_deliveries(worker) >= set(job_ids),
        60 + n * 0.5,
        f"Celery to report {n} deliveries succeeded",
        interval=0.2,
    )
    drained_in = time.monotonic() - started
    _completed_now_or_soon(stack, job_ids, pool)
    for job_id in job_ids:
        assert [step.name for step in stack.steps(job_id)] == ["model", "tool", "write"]
        assert stack.effect_count(job_id, "write") == 1
    print(f"\n[{pool} x{concurrency} {agent}] {n} jobs drained in {drained_in:.1f} s")


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize(("pool", "concurrency", "drain"), POOLS)
@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_worker_killed_mid_step_resumes_from_its_recorded_steps(
    agents: Stack, agent: str, pool: str, concurrency: int, drain: int
) -> None:
    stack = agents
    victim = stack.worker("A", pool=pool, concurrency=concurrency, wait=False)
    stack.sweeper()
    victim.wait_ready()
    m = min(concurrency, 4)
    job_ids = [stack.submit(agent, {"prompt": f"order {i}", "tool_seconds": 3.0}) for i in range(m)]

    def inside_the_tool_step() -> bool:
        for job_id in job_ids:
            job = stack.job(job_id)
            recorded = [step.name for step in stack.steps(job_id)]
            if not (job.state is State.RUNNING and victim.owns(job.owner)):
                return False
            if recorded != ["model"] or stack.effect_count(job_id, "tool:start") != 1:
                return False
        return True

    wait_until(inside_the_tool_step, 60, f"{m} jobs to be inside their tool step")
    victim.kill_group()  # SIGKILL, the pool's processes with it
    survivor = stack.worker("B", pool=pool, concurrency=concurrency)
    for job_id in job_ids:
        job = stack.wait_state(job_id, timeout=90)
        assert job.state is State.COMPLETED, job
        assert survivor.owns(job.owner), job.owner
        # The recorded step did not run again; the step the victim died in did, once.
        assert stack.effect_count(job_id, "model:start") == 1, stack.effects(job_id)
        assert stack.effect_count(job_id, "tool:start") == 2, stack.effects(job_id)
        assert stack.effect_count(job_id, "write") == 1, stack.effects(job_id)
        assert_recorded_steps_ran_once(stack, job_id)
        steps = {step.name: step for step in stack.steps(job_id)}
        assert victim.owns(steps["model"].owner)
        assert survivor.owns(steps["tool"].owner)


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize(("pool", "concurrency", "drain"), POOLS)
@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_warm_shutdown_mid_drain_leaves_nothing_running_and_loses_nothing(
    agents: Stack, agent: str, pool: str, concurrency: int, drain: int
) -> None:
    stack = agents
    n = max(drain, 2 * concurrency)  # more than one round: some wait when the shutdown comes
    job_ids = [stack.submit(agent, {"prompt": f"order {i}"}) for i in range(n)]
    first = stack.worker("A", pool=pool, concurrency=concurrency)
    wait_until(
        lambda: len(_completed_deliveries(first)) >= n // 4,
        60 + n * 0.5,
        "a quarter of the drain",
        interval=0.1,
    )
    _stop(first, signal.SIGTERM)
    succeeded = _completed_deliveries(first)
    assert len(succeeded) < n, "the drain ended before the warm shutdown: nothing was tested"
    # Nothing is left RUNNING: finished runs are committed (held completions sent as the
    # worker stopped), running ones handed back at their next step.
    states = _states(stack, job_ids)
    running = [job_id for job_id, state in states.items() if state is State.RUNNING]
    assert not running, f"{len(running)} jobs left RUNNING by a warm shutdown"
    assert set(states.values()) <= {State.QUEUED, State.COMPLETED}, states
    completed_by_a = {job_id for job_id, state in states.items() if state is State.COMPLETED}
    assert succeeded <= completed_by_a, succeeded - completed_by_a

    second = stack.worker("B", pool=pool, concurrency=concurrency)
    stack.sweeper()  # rings the doorbells of jobs whose messages went with the first worker
    for job_id in job_ids:
        job = stack.wait_state(job_id, timeout=120)
        assert job.state is State.COMPLETED, job
        assert stack.effect_count(job_id, "write") == 1, stack.effects(job_id)
        assert_recorded_steps_ran_once(stack, job_id)
    for job_id in completed_by_a:
        assert first.owns(stack.job(job_id).owner)
    assert second.alive()


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize(("pool", "concurrency", "drain"), POOLS)
@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_step_past_its_timeout_fails_the_job_with_the_reason(
    agents: Stack, agent: str, pool: str, concurrency: int, drain: int
) -> None:
    """The process's heartbeat writes the outcome at the deadline on every pool. A prefork
    pool child stuck in the step is ended; elsewhere the stuck step runs on until it
    returns, and writes nothing more (its lease is gone), while a pool of several serves
    other jobs meanwhile. An async step is cancelled at its deadline on every pool."""
    stack = agents
    worker = stack.worker("A", pool=pool, concurrency=concurrency)
    stuck = stack.submit(agent, {"tool_seconds": 6.0, "tool_timeout": 1.0}, max_attempts=1)
    job = stack.wait_state(stuck, timeout=60)
    assert job.state is State.FAILED, job
    assert job.last_error == "step 'tool' passed its timeout of 1 s"
    assert [step.name for step in stack.steps(stuck)] == ["model"]
    other = stack.submit(agent, {"prompt": "meanwhile"})
    if agent == "agent_turn_async":
        # The loop cancels the awaiting step at its deadline, on every pool: it never
        # finishes, and a prefork child is ended only if the heartbeat saw it first.
        assert stack.wait_state(other, timeout=30).state is State.COMPLETED
        assert stack.effect_count(stuck, "tool:done") == 0
    elif pool == "prefork":
        wait_until(lambda: ENDED in worker.output(), 30, "the stuck pool child to be ended")
    if concurrency > 1:  # another slot serves it while the stuck step still sleeps
        assert stack.wait_state(other, timeout=30).state is State.COMPLETED
        if pool != "prefork":
            assert stack.effect_count(stuck, "tool:done") == 0
    assert stack.wait_state(other, timeout=60).state is State.COMPLETED
    assert stack.effect_count(stuck, "write") == 0
    assert worker.alive()


OUTAGE_SECONDS = 3.0


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize(("pool", "concurrency", "drain"), POOLS)
@pytest.mark.parametrize("stack", [PRIVATE_PG_RABBITMQ], indirect=True)
def test_a_database_outage_mid_drain_completes_every_job_and_reruns_no_step(
    agents: Stack,
    private_pg: PrivatePostgres,
    agent: str,
    pool: str,
    concurrency: int,
    drain: int,
) -> None:
    """PostgreSQL (the test's own server) stopped for a few seconds while steps are in
    flight, a sweeper running: steps end inside the outage and free slots take doorbells
    they cannot claim. Once the server is back every job completes, no recorded step runs
    again, and the worker is still up."""
    stack = agents
    stack.configure(JOBS_LEASE_SECONDS=30, JOBS_SWEEP_INTERVAL_SECONDS=0.5)
    n = max(min(drain, 2 * concurrency), 8)
    worker = stack.worker("A", pool=pool, concurrency=concurrency)
    stack.sweeper()
    inputs = {"model_seconds": 1.0, "tool_seconds": 1.0}  # the drain spans the outage
    job_ids = [stack.submit(agent, {"prompt": f"order {i}", **inputs}) for i in range(n)]
    in_flight = min(concurrency, 4)
    wait_until(
        lambda: (
            sum(state is State.RUNNING for state in _states(stack, job_ids).values()) >= in_flight
        ),
        60,
        f"{in_flight} jobs in flight",
        interval=0.05,
    )
    _, back = private_pg.outage(OUTAGE_SECONDS)

    def every_job_completed() -> bool:
        return all(state is State.COMPLETED for state in _states(stack, job_ids).values())

    wait_until(every_job_completed, 90 + n * 0.5, f"{n} jobs to complete", interval=0.2)
    print(
        f"\n[{pool} x{concurrency} {agent}] {n} jobs done "
        f"{time.monotonic() - back:.1f} s after the outage"
    )
    for job_id in job_ids:
        assert [step.name for step in stack.steps(job_id)] == ["model", "tool", "write"]
        assert stack.effect_count(job_id, "write") == 1, stack.effects(job_id)
        assert_recorded_steps_ran_once(stack, job_id)
    assert worker.alive()
    log = worker.output()
    assert "database unreachable" in log, "the outage did not reach the worker"
    assert log.count("raised unexpected") == 0, log[-4000:]


def _stop(proc: Proc, sig: int, timeout: float = 60) -> None:
    proc.kill(sig)
    proc.popen.wait(timeout)
