"""Scale-out on a RabbitMQ cluster (issue 10): nodes die under running jobs.

A private 3-node cluster (tests/acceptance/rabbit_cluster.py; the service on 5672 is
never touched), two real workers (one solo, one prefork with two children) and a sweeper
reach it through a failover URL list.
Nodes are stopped with SIGKILL, the way a crashed host goes. In every case every job
completes within a stated time, no worker exits, and no job is lost.

Wall time: about 35 s to start the cluster once per session, then 20-60 s per test
(a node restart costs about 10 s, a fresh node joining about 20 s).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable

import pytest
from kombu import Connection

from jobs._core.states import State
from jobs._doorbell.queues import task_queue
from jobs.application import default_app
from tests.acceptance.conftest import (
    PG_RABBIT_CLUSTER,
    Proc,
    Stack,
    assert_recorded_steps_ran_once,
    wait_until,
)
from tests.acceptance.rabbit_cluster import RabbitCluster, RabbitNode

pytestmark = [pytest.mark.acceptance, pytest.mark.slow, pytest.mark.rabbit_cluster]

JOB = {"steps": 3, "seconds": 0.2}


def declare_on(node: RabbitNode) -> None:
    """Declare the stack's queue through ``node``: a classic queue lives there, a quorum
    queue's first leader is there."""
    with Connection(node.url, connect_timeout=5) as conn:
        task_queue(default_app().settings).bind(conn.default_channel).declare()


def point_at(stack: Stack, nodes: Iterable[RabbitNode]) -> None:
    """Failover URL list in this order: processes connect to the first live one."""
    stack.configure(JOBS_BROKER_URL=";".join(node.url for node in nodes))


def submit(stack: Stack, count: int) -> list[str]:
    return [stack.submit("sleep_steps", JOB) for _ in range(count)]


def wait_all_done(stack: Stack, job_ids: list[str], timeout: float) -> float:
    """Seconds until every job COMPLETED (fails past ``timeout``)."""
    started = time.monotonic()

    def done() -> bool:
        states = [stack.job(job_id).state for job_id in job_ids]
        failed = [s for s in states if s in (State.FAILED, State.CANCELLED)]
        assert not failed, states
        return all(s is State.COMPLETED for s in states)

    wait_until(done, timeout, f"{len(job_ids)} jobs to complete", interval=0.2)
    return time.monotonic() - started


def check_nothing_lost(stack: Stack, job_ids: list[str], workers: list[Proc]) -> None:
    for job_id in job_ids:
        job = stack.job(job_id)
        assert job.state is State.COMPLETED, job
        assert len(stack.steps(job_id)) == JOB["steps"], job_id
        assert_recorded_steps_ran_once(stack, job_id)
    for worker in workers:
        assert worker.alive(), f"{worker.name} exited:\n{worker.output()[-3000:]}"
        log = worker.output()
        assert "Unrecoverable error" not in log, log[-3000:]
        assert "delayed delivery" not in log.lower(), log[-3000:]


def start_processes(stack: Stack) -> list[Proc]:
    workers = [
        stack.worker("A", wait=False),
        stack.worker("B", pool="prefork", concurrency=2, wait=False),
    ]
    stack.sweeper()
    for worker in workers:
        worker.wait_ready(timeout=60)
    return workers


@pytest.mark.parametrize("stack", [PG_RABBIT_CLUSTER], indirect=True)
def test_quorum_queue_loses_its_leader_then_the_workers_node(
    stack: Stack, cluster: RabbitCluster
) -> None:
    """Quorum queue, leader on node 2, workers connected to node 1. Kill the leader: the
    queue elects another and the 20 jobs finish within 20 s with no node restarted. Bring it
    back, then kill node 1 (the workers' own connection): they fail over to the next URL
    and 8 jobs finish within 10 s. Nothing lost, no worker exits."""
    first, second, third = cluster.nodes
    stack.configure(JOBS_QUEUE_TYPE="quorum", JOBS_RING_AGAIN_AFTER_SECONDS=120)
    declare_on(second)
    assert cluster.queue_info(stack.queue)["type"] == "quorum"
    leader = cluster.leader(stack.queue)
    connected = next(node for node in (first, second, third) if node is not leader)
    point_at(stack, [connected, *(n for n in cluster.nodes if n is not connected)])
    workers = start_processes(stack)

    before = submit(stack, 12)
    wait_until(
        lambda: sum(stack.job(j).state is State.COMPLETED for j in before) >= 2,
        30,
        "the first jobs to complete",
    )
    cluster.stop_node(leader)
    during = submit(stack, 8)
    took_leader = wait_all_done(stack, before + during, timeout=20)
    new_leader = cluster.leader(stack.queue)
    assert new_leader is not leader

    cluster.restart_node(leader)
    after_restart = submit(stack, 6)
    wait_all_done(stack, after_restart, timeout=30)
    cluster.stop_node(connected)
    last = submit(stack, 8)
    took_connected = wait_all_done(stack, last, timeout=10)

    all_jobs = before + during + after_restart + last
    check_nothing_lost(stack, all_jobs, workers)
    print(
        f"\n[quorum] leader {leader.name} killed: all {len(before + during)} jobs done "
        f"{took_leader:.1f}s later (new leader {new_leader.name}); workers' node "
        f"{connected.name} killed: {len(last)} jobs done {took_connected:.1f}s later"
    )


@pytest.mark.parametrize("stack", [PG_RABBIT_CLUSTER], indirect=True)
def test_classic_queue_home_node_down_workers_wait_and_resume(
    stack: Stack, cluster: RabbitCluster
) -> None:
    """Classic queue on node 1, workers on node 2. Kill node 1: the queue is unusable, the
    workers log the refusal and retry (no exit, no crash loop). Restart node 1: the
    workers consume again within seconds, and the sweeper rings at once for the jobs
    whose doorbells were published while the queue was down (the ring-again delay is
    120 s here, so the watch did it)."""
    home, second, third = cluster.nodes
    stack.configure(JOBS_QUEUE_TYPE="classic", JOBS_RING_AGAIN_AFTER_SECONDS=120)
    declare_on(home)
    point_at(stack, [second, third, home])
    workers = start_processes(stack)
    before = submit(stack, 6)
    wait_all_done(stack, before, timeout=30)

    cluster.stop_node(home)
    waiting = submit(stack, 8)
    wait_until(
        lambda: all("broker refused queue" in w.output() for w in workers),
        30,
        "both workers to log the refused queue",
    )
    time.sleep(5)  # an outage long enough for several retries
    for worker in workers:
        assert worker.alive(), worker.output()[-3000:]
        lines = [ln for ln in worker.output().splitlines() if "broker refused queue" in ln]
        assert any("home node" in line for line in lines), lines
    assert all(stack.job(j).state is State.QUEUED for j in waiting)

    outage = time.monotonic()
    cluster.restart_node(home)
    outage = time.monotonic() - outage
    took = wait_all_done(stack, waiting, timeout=30)
    check_nothing_lost(stack, before + waiting, workers)
    sweeper_log = stack.procs[-1].output()
    assert "serves again; ringing every due job's doorbell" in sweeper_log, sweeper_log[-3000:]
    print(
        f"\n[classic] {len(waiting)} jobs submitted while the home node was down done "
        f"{took:.1f}s after it was back (its restart took {outage:.1f}s)"
    )


@pytest.mark.parametrize("stack", [PG_RABBIT_CLUSTER], indirect=True)
def test_node_lost_for_good_queue_declared_again_and_doorbells_rung(
    stack: Stack, cluster: RabbitCluster
) -> None:
    """Classic queue on node 3, which is lost for good (killed, then
    ``forget_cluster_node``). The queue goes with it; the queue is declared again on a
    live node (by the sweeper's watch or a retrying worker, whichever is first) and the
    sweeper rings every due doorbell at once: all jobs complete within 30 s of the
    operator's ``forget_cluster_node`` although the ring-again delay is 120 s."""
    first, second, doomed = cluster.nodes
    stack.configure(JOBS_QUEUE_TYPE="classic", JOBS_RING_AGAIN_AFTER_SECONDS=120)
    declare_on(doomed)
    point_at(stack, [first, second, doomed])
    jobs = submit(stack, 10)  # their doorbells wait in the doomed queue
    wait_until(lambda: cluster.queue_info(stack.queue).get("ready") == "10", 10, "10 ready")
    cluster.stop_node(doomed)
    # Workers and a sweeper that start while the queue's node is down.
    workers = [stack.worker("A", wait=False), stack.worker("B", wait=False)]
    sweeper = stack.sweeper()
    wait_until(lambda: "is unavailable" in sweeper.output(), 30, "the sweeper to see it")
    wait_until(
        lambda: all("broker refused queue" in w.output() for w in workers),
        30,
        "both workers to log the refused queue",
    )
    assert all(stack.job(j).state is State.QUEUED for j in jobs)
    cluster.forget(doomed)
    took = wait_all_done(stack, jobs, timeout=30)
    check_nothing_lost(stack, jobs, workers)
    assert cluster.queue_info(stack.queue)["type"] == "classic"
    rang = [ln for ln in sweeper.output().splitlines() if "ringing every due job" in ln]
    assert rang, sweeper.output()[-3000:]
    print(
        f"\n[lost for good] {len(jobs)} jobs done {took:.1f}s after forget_cluster_node; {rang[0]}"
    )


@pytest.mark.parametrize("stack", [PG_RABBIT_CLUSTER], indirect=True)
def test_refused_permission_then_granted_and_a_dead_first_url(
    stack: Stack, cluster: RabbitCluster
) -> None:
    """A user without configure permission: the worker logs ``ACCESS_REFUSED`` and retries
    (no exit) until an operator grants it, then consumes within seconds. Then a worker
    whose first failover URL is a dead node starts and runs jobs within a few seconds."""
    first = cluster.nodes[0]
    user = f"limited{uuid.uuid4().hex[:6]}"
    cluster.ctl(first, "add_user", user, "secret")
    try:
        cluster.ctl(first, "set_permissions", "-p", "/", user, "^$", ".*", ".*")
        urls = [node.url.replace("guest:guest", f"{user}:secret") for node in cluster.nodes]
        stack.configure(JOBS_QUEUE_TYPE="quorum")
        declare_on(first)  # by guest: the queue exists, the limited user may not declare it
        worker = stack.worker("L", wait=False, env={"JOBS_BROKER_URL": ";".join(urls)})
        stack.sweeper()
        job_id = stack.submit("sleep_steps", JOB)
        wait_until(
            lambda: worker.output().count("ACCESS_REFUSED") >= 3, 30, "three refusals logged"
        )
        assert worker.alive(), worker.output()[-3000:]
        assert stack.job(job_id).state is State.QUEUED
        cluster.ctl(first, "set_permissions", "-p", "/", user, ".*", ".*", ".*")
        granted = time.monotonic()
        stack.wait_state(job_id, timeout=30)
        after_grant = time.monotonic() - granted
        assert stack.job(job_id).state is State.COMPLETED
        assert after_grant < 15, after_grant
        assert worker.alive()
    finally:
        cluster.ctl(first, "delete_user", user, check=False)

    cluster.stop_node(first)
    started = time.monotonic()
    late = stack.worker("D", wait=True)  # JOBS_BROKER_URL: the full list, node 1 first
    ready = time.monotonic() - started
    more = submit(stack, 4)
    took = wait_all_done(stack, more, timeout=20)
    assert late.alive()
    print(
        f"\n[permissions] job done {after_grant:.1f}s after the grant; [dead first URL] "
        f"worker ready in {ready:.1f}s, 4 jobs done {took:.1f}s later"
    )
    assert ready < 20, ready
