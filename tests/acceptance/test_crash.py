"""Workers die mid-step; the job outlives them (scenarios 1, 2, 3 and 10).

Two identical workers run; whichever claims the job is the victim, the other one is the
survivor that must finish it. Evidence comes from the job row, its recorded steps, its
history and ``effects.log`` (each line is one real run of a step function, with its pid).
"""

from __future__ import annotations

import datetime as dt
import re
import signal
import time

import psutil
import pytest

from jobs._core.states import State
from tests.acceptance.conftest import (
    BOTH,
    PG_RABBITMQ,
    Proc,
    Stack,
    assert_recorded_steps_ran_once,
    wait_until,
)

pytestmark = pytest.mark.acceptance

RECEIVED = re.compile(r"Task jobs\.[\w.:-]+\[([0-9a-f-]+)\] received")
CHILD_EXITED = re.compile(
    r"^\[([0-9-]+ [0-9:,]+): ERROR/MainProcess\] Process 'ForkPoolWorker-1' "
    r"pid:\d+ exited with 'signal 9",
    re.MULTILINE,
)


def received_task_ids(proc: Proc) -> list[str]:
    return RECEIVED.findall(proc.output())


def victim_in_second_step(stack: Stack, job_id: str, workers: list[Proc]) -> Proc:
    """Wait until one worker has recorded lookup_order and is inside check_payment."""

    def inside() -> Proc | None:
        job = stack.job(job_id)
        recorded = {step.name for step in stack.steps(job_id)}
        started = stack.effect_count(job_id, "check_payment:start") > 0
        if job.state is State.RUNNING and "lookup_order" in recorded and started:
            return next((w for w in workers if w.owns(job.owner)), None)
        return None

    return wait_until(inside, 60, f"a worker to be inside check_payment of {job_id}")


def crash_setup(stack: Stack, pool: str) -> tuple[str, Proc, Proc]:
    """Workers A and B and a sweeper; a check_order job whose owner is inside its second
    step. Returns (job id, the owner, the other worker)."""
    workers = [stack.worker("A", pool=pool, wait=False), stack.worker("B", pool=pool, wait=False)]
    stack.sweeper()
    for worker in workers:
        worker.wait_ready()
    job_id = stack.submit("check_order", {"order_id": 42, "check_seconds": 3.0})
    victim = victim_in_second_step(stack, job_id, workers)
    return job_id, victim, next(w for w in workers if w is not victim)


def dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def assert_taken_over(stack: Stack, job_id: str, victim: Proc, survivor: Proc) -> float:
    """The crash story's invariants; returns the instant (epoch s) of the survivor's claim."""
    job = stack.job(job_id)
    assert job.state is State.COMPLETED, job
    assert job.result == {"order_id": 42, "ok": True, "approved_by": None}
    assert survivor.owns(job.owner), job.owner

    # The recorded step never ran again; the step the victim died in ran again (no record).
    assert stack.effect_count(job_id, "lookup_order") == 1, stack.effects(job_id)
    assert stack.effect_count(job_id, "check_payment:start") == 2, stack.effects(job_id)
    assert stack.effect_count(job_id, "check_payment:done") == 1, stack.effects(job_id)
    assert_recorded_steps_ran_once(stack, job_id)

    claims = stack.claims(job_id)
    assert victim.owns(claims[0].owner), claims
    assert survivor.owns(claims[-1].owner), claims
    assert claims[-1].fence is not None
    assert claims[0].fence is not None
    assert claims[-1].fence > claims[0].fence

    steps = {step.name: step for step in stack.steps(job_id)}
    assert set(steps) == {"lookup_order", "check_payment"}
    assert victim.owns(steps["lookup_order"].owner)
    assert steps["lookup_order"].fence == claims[0].fence
    assert survivor.owns(steps["check_payment"].owner)
    assert steps["check_payment"].fence == claims[-1].fence

    # No write by the victim after the takeover was accepted.
    history = stack.history(job_id)
    takeover = history.index(claims[-1])
    assert not [t for t in history[takeover:] if victim.owns(t.owner)], history
    assert history[-1].to_state is State.COMPLETED
    assert survivor.owns(history[-1].owner)
    return claims[-1].at.timestamp()


@pytest.mark.parametrize("pool", ["solo", "prefork"])
@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_sigkill_worker_main_process_mid_step(stack: Stack, pool: str) -> None:
    """Scenarios 1 and 10: SIGKILL of the worker's MainProcess while a step runs.

    pg-rabbitmq: RabbitMQ redelivers the unacked message at once, the survivor drops it
    (the job is RUNNING under a live-looking lease), and the sweeper sees the dead owner's
    liveness lock gone and re-queues the job well before the 3 s lease would run out.
    embedded: the killed worker's message is gone with it (the filesystem transport has no
    acknowledgements); the sweeper, on the same host, sees the owner's process is gone,
    re-queues the job before the lease runs out and re-sends it.
    """
    job_id, victim, survivor = crash_setup(stack, pool)
    children = victim.pool_children()
    lease_at_kill = stack.job(job_id).lease_until
    assert lease_at_kill is not None
    if pool == "prefork":
        assert len(children) == 1, children  # -c 1
        # The job is run by the pool child, not by the main process we are about to kill.
        assert stack.effects(job_id)[-1][1] == children[0]
    killed_at = victim.kill(signal.SIGKILL)
    victim.popen.wait(10)

    if pool == "prefork":
        # billiard's children do not run on as orphans: Celery's pool initializer sets
        # PR_SET_PDEATHSIG=SIGKILL, so the kernel kills the child when its parent dies.
        wait_until(
            lambda: all(dead(pid) for pid in children),
            5,
            f"pool children {children} to die with their parent",
        )

    job = stack.wait_state(job_id, timeout=60)
    claimed_at = assert_taken_over(stack, job_id, victim, survivor)
    recovery = claimed_at - killed_at
    print(
        f"\n[{stack.backend}/{pool}] survivor claimed {recovery:.2f}s after SIGKILL "
        f"(lease {stack.env['JOBS_LEASE_SECONDS']}s); final fence {job.fence}"
    )

    history = stack.history(job_id)
    # The move that took the job from A: the sweeper's re-queue, or (PostgreSQL) a claim by
    # the survivor straight from RUNNING when A's liveness lock was already gone.
    requeue = next(
        t
        for t in history
        if t.from_state is State.RUNNING and t.to_state in (State.QUEUED, State.RUNNING)
    )
    stack.wait_queue_empty()  # every delivery has been received (and logged) by now
    victim_ids = received_task_ids(victim)
    assert len(victim_ids) == 1, victim_ids
    if stack.rabbitmq:
        # The dead owner's liveness lock was released with its connection: no lease wait.
        if requeue.to_state is State.QUEUED:
            assert "liveness lock released" in (requeue.reason or ""), requeue
        else:
            assert requeue.owner is not None
            assert survivor.node is not None
            assert requeue.owner.startswith(survivor.node), requeue
        assert requeue.at < lease_at_kill, (requeue.at, lease_at_kill)
        # RabbitMQ redelivered the dead worker's message to the survivor.
        assert victim_ids[0] in received_task_ids(survivor)
    else:
        # Scenario 10: nothing redelivers the lost message. The sweeper, on the same host as
        # every embedded worker, sees A's process is gone, re-queues the job before the
        # lease would have run out, and re-sends it.
        assert "is gone" in (requeue.reason or ""), requeue
        assert requeue.at < lease_at_kill, (requeue.at, lease_at_kill)
        assert victim_ids[0] not in received_task_ids(survivor)


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_sigkill_pool_child_mid_step_requeues_message(stack: Stack) -> None:
    """Scenario 2: SIGKILL of a prefork pool child; the main process survives, and
    ``task_reject_on_worker_lost`` puts the message back on RabbitMQ. The job is taken over
    through the dead child's liveness (its lock went with its connection), long before its
    10 s lease would have run out: the lease cannot be what recovered it."""
    stack.configure(JOBS_LEASE_SECONDS=10)
    worker = stack.worker("A", pool="prefork", concurrency=1, wait=False)
    stack.sweeper()
    worker.wait_ready()
    job_id = stack.submit("check_order", {"order_id": 42, "check_seconds": 3.0})
    victim_in_second_step(stack, job_id, [worker])
    children = worker.pool_children()
    assert len(children) == 1, children
    child = children[0]
    assert stack.effects(job_id)[-1] == ("check_payment:start", child)
    first_owner = stack.job(job_id).owner
    assert first_owner is not None
    assert first_owner.endswith(f":{child}")

    lease_at_kill = stack.job(job_id).lease_until
    assert lease_at_kill is not None
    killed_at = time.time()
    psutil.Process(child).kill()

    job = stack.wait_state(job_id, timeout=60)
    assert job.state is State.COMPLETED, job
    assert worker.alive(), "the worker's main process must survive its child's death"
    assert stack.effect_count(job_id, "lookup_order") == 1, stack.effects(job_id)
    assert stack.effect_count(job_id, "check_payment:done") == 1, stack.effects(job_id)
    assert_recorded_steps_ran_once(stack, job_id)
    steps = {step.name: step for step in stack.steps(job_id)}
    assert steps["lookup_order"].owner == first_owner
    new_owner = steps["check_payment"].owner
    assert new_owner != first_owner
    assert worker.owns(new_owner), new_owner
    assert steps["check_payment"].fence > steps["lookup_order"].fence
    claims = stack.claims(job_id)
    rescued = next(t for t in stack.history(job_id) if t.from_state is State.RUNNING)
    noticed = CHILD_EXITED.search(worker.output())
    assert noticed, worker.output()[-3000:]
    noticed_at = dt.datetime.strptime(noticed.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    print(
        f"\n[child kill] after SIGKILL of the pool child: sweeper re-queued the job in "
        f"{rescued.at.timestamp() - killed_at:.2f}s ({rescued.reason}); Celery's main "
        f"process noticed the dead child after {noticed_at - killed_at:.2f}s; a new child "
        f"claimed the job after {claims[-1].at.timestamp() - killed_at:.2f}s"
    )

    # The mechanism: the first move away from the dead child's claim is a takeover by the
    # liveness rule (a claim RUNNING -> RUNNING, or the sweeper's "liveness lock released"),
    # made before the dead child's lease ran out; never a lease expiry.
    assert rescued.at < lease_at_kill, (rescued.at, lease_at_kill)
    by_claim = rescued.to_state is State.RUNNING and rescued.reason == "claimed"
    by_sweeper = "liveness lock released" in (rescued.reason or "")
    assert by_claim or by_sweeper, rescued
    assert "expired" not in (rescued.reason or ""), rescued
    assert lease_at_kill.timestamp() - rescued.at.timestamp() > 3, (rescued.at, lease_at_kill)

    stack.wait_queue_empty()
    log = worker.output()
    assert "WorkerLostError" in log, log[-3000:]
    # Requeued, not acked: the same delivery (task id) arrived again.
    ids = received_task_ids(worker)
    assert len(ids) != len(set(ids)), ids


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_default_lease_dead_owner_rescued_within_seconds(stack: Stack) -> None:
    """Scenario 3: a 30 s lease, yet the job runs again under another owner within 5 s of
    the kill: the sweeper sees the dead worker's liveness lock released."""
    stack.configure(JOBS_LEASE_SECONDS=30, JOBS_SWEEP_INTERVAL_SECONDS=1)
    job_id, victim, survivor = crash_setup(stack, "solo")
    lease = stack.job(job_id).lease_until
    killed_at = victim.kill(signal.SIGKILL)

    def running_elsewhere() -> bool:
        job = stack.job(job_id)
        return job.state in (State.RUNNING, State.COMPLETED) and survivor.owns(job.owner)

    wait_until(running_elsewhere, 10, "the survivor to claim the job")
    claim = stack.claims(job_id)[-1]
    seconds = claim.at.timestamp() - killed_at
    print(
        f"\n[lease 30s] RUNNING under {claim.owner} {seconds:.2f}s after SIGKILL "
        f"(the old lease had {lease.timestamp() - killed_at:.1f}s left)"
        if lease
        else ""
    )
    assert seconds < 5, f"took {seconds:.2f}s"
    stack.wait_state(job_id, timeout=30)
    assert_taken_over(stack, job_id, victim, survivor)


SUCCEEDED = re.compile(r"Task jobs\.[\w.]+\[([0-9a-f-]+)\] succeeded")


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_sigkill_with_a_completion_held_loses_no_job_and_reruns_no_recorded_step(
    stack: Stack,
) -> None:
    """Issue 19: a pool process holds a job's completion for its next claim to carry in
    the same round trip. The Celery task has returned and its message is acknowledged, the
    job is still RUNNING (never COMPLETED before its completion commits), and the worker is
    SIGKILLed: the job is not lost (the sweeper sees the dead owner's liveness lock gone and
    re-sends it; the broker holds nothing), the recorded step does not run again, and the
    step whose record was held runs again, once, under the new owner."""
    stack.configure(JOBS_HOLD_COMPLETION_SECONDS=60, JOBS_LEASE_SECONDS=10)
    victim = stack.worker("A", pool="prefork", concurrency=1, wait=False)
    stack.sweeper()
    victim.wait_ready()
    # Two jobs before it make the pool process busy, so the next job's completion is held
    # (an idle process writes a completion at once).
    for order_id in (40, 41):
        warm_up = stack.submit("check_order", {"order_id": order_id, "check_seconds": 0.0})
        assert stack.wait_state(warm_up, timeout=60).state is State.COMPLETED
    job_id = stack.submit("check_order", {"order_id": 42, "check_seconds": 0.2})
    wait_until(
        lambda: len(SUCCEEDED.findall(victim.output())) >= 3,
        60,
        "the victim's task to return (succeeded)",
    )
    stack.wait_queue_empty()  # acknowledged: RabbitMQ holds nothing of this job any more
    assert stack.effect_count(job_id, "check_payment:done") == 1, stack.effects(job_id)
    for _ in range(10):  # the completion is held, and nothing says COMPLETED meanwhile
        job = stack.job(job_id)
        assert job.state is State.RUNNING, job
        assert victim.owns(job.owner), job.owner
        assert [step.name for step in stack.steps(job_id)] == ["lookup_order"]
        time.sleep(0.1)

    # The whole group at once: the pool process dies holding the completion. SIGKILL of the
    # main process alone closes the child's pipe a moment before the kernel's parent-death
    # SIGKILL reaches it, and a child that reads that end first sends its completion on the
    # way out (correct too, and the job is then COMPLETED by the victim), but not this case.
    killed_at = time.time()
    victim.kill_group()
    survivor = stack.worker("B", pool="prefork", env={"JOBS_HOLD_COMPLETION_SECONDS": "0.005"})
    job = stack.wait_state(job_id, timeout=60)

    assert job.state is State.COMPLETED, job
    assert job.result == {"order_id": 42, "ok": True, "approved_by": None}
    assert survivor.owns(job.owner), job.owner
    assert stack.effect_count(job_id, "lookup_order") == 1, stack.effects(job_id)
    assert stack.effect_count(job_id, "check_payment:done") == 2, stack.effects(job_id)
    assert_recorded_steps_ran_once(stack, job_id)
    steps = {step.name: step for step in stack.steps(job_id)}
    assert victim.owns(steps["lookup_order"].owner)
    assert survivor.owns(steps["check_payment"].owner)
    rescued = next(t for t in stack.history(job_id) if t.from_state is State.RUNNING)
    assert "liveness lock released" in (rescued.reason or "") or rescued.reason == "claimed"
    lease_at_kill = stack.claims(job_id)[0].at.timestamp() + 10
    assert rescued.at.timestamp() < lease_at_kill, (rescued.at, killed_at)
