"""Database outages (issue 8): a PostgreSQL restart drops every session and every advisory
lock at once, the live workers' too. Live workers must not look dead: their steps are not
run again elsewhere, and their jobs complete under their first claim.

The server here is a throwaway one of the test's own (``PrivatePostgres``); the shared
server on 5432 is never restarted.
"""

from __future__ import annotations

import time

import pytest

from jobs import api
from jobs.core.states import State
from tests.acceptance.conftest import (
    PRIVATE_PG_RABBITMQ,
    PrivatePostgres,
    Stack,
    assert_recorded_steps_ran_once,
    wait_until,
)

pytestmark = pytest.mark.acceptance


@pytest.mark.parametrize("stack", [PRIVATE_PG_RABBITMQ], indirect=True)
def test_a_postgres_restart_mid_step_reruns_no_live_step(
    stack: Stack, private_pg: PrivatePostgres
) -> None:
    """Four jobs mid-step on two prefork workers, a sweeper passing twice a second, then a
    fast restart of PostgreSQL. On the landed main the sweeper found the live workers' locks
    gone and re-queued their jobs, so their steps ran a second time elsewhere."""
    stack.configure(JOBS_LEASE_SECONDS=30, JOBS_SWEEP_INTERVAL_SECONDS=0.5)
    workers = [
        stack.worker("A", pool="prefork", concurrency=2, wait=False),
        stack.worker("B", pool="prefork", concurrency=2, wait=False),
    ]
    for worker in workers:
        worker.wait_ready()
    sweeper = stack.sweeper()
    ids = [stack.submit("check_order", {"order_id": n, "check_seconds": 10.0}) for n in range(4)]
    for job_id in ids:
        stack.wait_effect(job_id, "check_payment:start", timeout=60)
    wait_until(lambda: "sweeper: every" in sweeper.output(), 30, "the sweeper to be running")

    restarted = time.monotonic()
    private_pg.restart()
    api.reset()  # this test process's own pooled connections died with the server
    print(f"\n[pg restart] took {time.monotonic() - restarted:.2f}s with 4 jobs mid-step")

    for job_id in ids:
        job = stack.wait_state(job_id, timeout=120)
        assert job.state is State.COMPLETED, job
    for job_id in ids:
        claims = stack.claims(job_id)
        assert len(claims) == 1, [(c.from_state, c.owner, c.reason) for c in claims]
        assert stack.effect_count(job_id, "check_payment:start") == 1
        assert_recorded_steps_ran_once(stack, job_id)
    assert all(worker.alive() for worker in workers)
    log = sweeper.output()
    assert "server restarted" in log, log[-4000:]  # the sweeper saw the restart and waited
    retaken = sum(worker.output().count("taken again") for worker in workers)
    print(f"[pg restart] liveness locks taken again: {retaken}")
    assert retaken >= 4, [worker.output()[-3000:] for worker in workers]
