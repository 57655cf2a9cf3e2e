"""A PostgreSQL failover (issue 20): a primary with a synchronous streaming standby, both
servers of the test's own (``private_pg``, ``private_standby``); the primary is killed with
steps in flight and the standby promoted 3 s later, under workers and a sweeper that were
given libpq's host list. The shared server on 5432 is never touched.
"""

from __future__ import annotations

import time

import psycopg
import pytest

import jobs
from jobs._core.states import State
from tests.acceptance.conftest import (
    PRIVATE_PG_RABBITMQ,
    PrivatePostgres,
    Stack,
    assert_recorded_steps_ran_once,
    wait_until,
)
from tests.acceptance.test_database_outages import outage_report

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

FAILOVER_JOBS = 40
PROMOTE_AFTER_SECONDS = 3.0


def host_list_url(database_url: str, primary: PrivatePostgres, standby: PrivatePostgres) -> str:
    """``database_url``'s database on both servers, in libpq's URI host-list form, asking
    for the writable one."""
    database = database_url.rsplit("/", 1)[1].split("?", 1)[0]
    return (
        f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/{database}"
        "?target_session_attrs=read-write"
    )


def advisory_locks(server: PrivatePostgres) -> int:
    """How many advisory locks sessions hold on ``server`` (the workers' liveness locks)."""
    with psycopg.connect(server.dsn, connect_timeout=2) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize("stack", [PRIVATE_PG_RABBITMQ], indirect=True)
def test_a_promote_with_synchronous_replication_loses_nothing_and_reruns_no_step(
    stack: Stack, private_pg: PrivatePostgres, private_standby: PrivatePostgres
) -> None:
    """40 three-step jobs on two prefork workers (-c 2) and a sweeper, all on the host list;
    the primary is killed (``pg_ctl stop -m immediate``) with 4 steps in flight and the
    standby promoted 3 s later. Nothing acknowledged is lost, no recorded step runs again,
    liveness stays on (a host list is not a pooler), and every job completes within 15 s
    of the promote."""
    url = host_list_url(stack.database_url, private_pg, private_standby)
    stack.configure(JOBS_DATABASE_URL=url, JOBS_LEASE_SECONDS=30, JOBS_SWEEP_INTERVAL_SECONDS=0.5)
    workers = [
        stack.worker("A", pool="prefork", concurrency=2, wait=False),
        stack.worker("B", pool="prefork", concurrency=2, wait=False),
    ]
    for worker in workers:
        worker.wait_ready()
    sweeper = stack.sweeper()
    ids = [stack.submit("sleep_steps", {"steps": 3, "seconds": 0.25}) for _ in range(FAILOVER_JOBS)]
    wait_until(
        lambda: sum(stack.job(job_id).state is State.RUNNING for job_id in ids) >= 4,
        30,
        "four jobs in flight",
    )
    wait_until(lambda: "sweeper: every" in sweeper.output(), 30, "the sweeper to be running")

    private_pg.stop()  # immediate: the primary is gone, as in a crash
    killed = time.monotonic()
    time.sleep(PROMOTE_AFTER_SECONDS)
    private_standby.promote()
    promoted = time.monotonic()
    assert not private_standby.in_recovery()
    jobs.reset()  # this test process's own pooled connections died with the primary

    def finished() -> bool:
        return all(stack.job(job_id).state is State.COMPLETED for job_id in ids)

    wait_until(finished, 120, "every job to complete on the promoted standby", interval=0.1)
    delay = time.monotonic() - promoted
    print(
        f"\n[failover] primary killed, standby promoted {promoted - killed:.1f} s later: the "
        f"last of {FAILOVER_JOBS} jobs completed {delay:.1f} s after the promote; "
        f"{outage_report(stack, workers)}"
    )

    # 0 lost: every acknowledged submit is on the promoted standby, and completed there.
    assert len(ids) == FAILOVER_JOBS
    reruns = {}
    for job_id in ids:
        assert len(stack.claims(job_id)) == 1, [(c.owner, c.reason) for c in stack.claims(job_id)]
        counts = assert_recorded_steps_ran_once(stack, job_id)
        reruns.update({(job_id, step): n for step, n in counts.items() if n != 1})
    assert not reruns, f"steps that ran more than once: {reruns}"
    logs = "".join(proc.output() for proc in [*workers, sweeper])
    assert "liveness: OFF" not in logs, logs[-4000:]
    # Each of the four pool processes holds its liveness lock on the new primary (taken
    # again by its keeper, or at its next claim).
    wait_until(
        lambda: advisory_locks(private_standby) >= 4, 10, "four liveness locks on the new primary"
    )
    assert "server restarted" in sweeper.output(), sweeper.output()[-4000:]
    assert all(proc.alive() for proc in [*workers, sweeper])
    report = outage_report(stack, workers)
    assert report["raised unexpected"] == 0, report
    assert report["tracebacks"] == 0, report
    assert delay < 15, f"the jobs took {delay:.1f} s after the promote"
