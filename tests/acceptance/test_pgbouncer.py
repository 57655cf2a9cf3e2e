"""Behind PgBouncer in transaction mode (issue 8), with a PgBouncer of the test's own.

On the landed main nothing could connect through PgBouncer's default configuration
(``unsupported startup parameter: options``); with ``ignore_startup_parameters = options``
the workers' session advisory locks stayed on whichever server connection took them, the
sweeper judged every live worker gone on every pass, and jobs were re-queued forever.

Two set-ups, both documented in deploy/README.md: ``JOBS_LIVENESS_DATABASE_URL`` straight to
PostgreSQL (PgBouncer's defaults are then enough), and no such URL, where the worker sees it
is behind a proxy, says so at start-up and recovers dead workers' jobs by lease expiry.
"""

from __future__ import annotations

import pytest

from jobs._core.states import State
from jobs._store.db import make_engine
from jobs._store.schema import upgrade
from tests.acceptance.conftest import (
    PG_RABBITMQ,
    PgBouncer,
    Stack,
    assert_recorded_steps_ran_once,
)
from tests.conftest import private_pg_database

pytestmark = pytest.mark.acceptance


def test_pgbouncer_defaults_without_a_liveness_url_connect_and_say_what_to_do(
    pgbouncer: PgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    """PgBouncer's default configuration refuses the ``options`` start-up parameter: the
    engine connects without it (lease-expiry recovery, as documented) and says once what
    to do, naming JOBS_LIVENESS_DATABASE_URL; it used to fail every connection."""
    refuses_options = "options" not in (pgbouncer.root / "pgbouncer.ini").read_text()
    with private_pg_database("jobs_bouncer") as direct:
        engine = make_engine(pgbouncer.url_for(direct))
        try:
            upgrade(engine)
            for _ in range(3):
                with engine.connect() as conn:
                    assert conn.exec_driver_sql("SELECT 1").scalar() == 1
        finally:
            engine.dispose()
    said = [r.getMessage() for r in caplog.records if "LIVENESS_DATABASE_URL" in r.getMessage()]
    assert len(said) == (1 if refuses_options else 0), said


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_workers_behind_pgbouncer_finish_jobs_without_requeues(
    stack: Stack, pgbouncer: PgBouncer
) -> None:
    direct = stack.env["JOBS_DATABASE_URL"]
    refuses_options = "options" not in (pgbouncer.root / "pgbouncer.ini").read_text()
    settings: dict[str, str | float] = {
        "JOBS_DATABASE_URL": pgbouncer.url_for(direct),
        "JOBS_LEASE_SECONDS": 30,
        "JOBS_SWEEP_INTERVAL_SECONDS": 0.5,
    }
    if refuses_options:
        settings["JOBS_LIVENESS_DATABASE_URL"] = direct
    stack.configure(**settings)

    workers = [
        stack.worker("A", pool="prefork", concurrency=2, wait=False),
        stack.worker("B", pool="prefork", concurrency=2, wait=False),
    ]
    for worker in workers:
        worker.wait_ready()
    stack.sweeper()
    ids = [stack.submit("check_order", {"order_id": n, "check_seconds": 6.0}) for n in range(4)]

    for job_id in ids:
        job = stack.wait_state(job_id, timeout=90)
        assert job.state is State.COMPLETED, job
    for job_id in ids:
        assert len(stack.claims(job_id)) == 1, stack.history(job_id)
        assert stack.effect_count(job_id, "check_payment:start") == 1
        assert_recorded_steps_ran_once(stack, job_id)

    log = workers[0].output()
    said = [line for line in log.splitlines() if "liveness:" in line]
    print(f"\n[{'default' if refuses_options else 'ignoring options'}] {said}")
    if refuses_options:
        assert any("advisory locks on" in line and "LIVENESS_DATABASE_URL" in line for line in said)
    else:
        assert any("liveness: OFF" in line and "looks like a pooler" in line for line in said)


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_held_completions_pipelined_with_claims_behind_pgbouncer(
    stack: Stack, pgbouncer: PgBouncer
) -> None:
    """Issue 19: short jobs back to back, so each pool process's claim carries the previous
    job's held completion in one pipeline (two transactions, a Sync between them) through
    PgBouncer in transaction mode: every job completes once, none is claimed twice."""
    direct = stack.env["JOBS_DATABASE_URL"]
    refuses_options = "options" not in (pgbouncer.root / "pgbouncer.ini").read_text()
    settings: dict[str, str | float] = {
        "JOBS_DATABASE_URL": pgbouncer.url_for(direct),
        "JOBS_HOLD_COMPLETION_SECONDS": 5,  # every completion waits for the next claim
    }
    if refuses_options:
        settings["JOBS_LIVENESS_DATABASE_URL"] = direct
    stack.configure(**settings)
    worker = stack.worker("A", pool="prefork", concurrency=1)
    ids = [stack.submit("check_order", {"order_id": n, "check_seconds": 0.0}) for n in range(6)]
    for job_id in ids[:-1]:
        job = stack.wait_state(job_id, timeout=60)
        assert job.state is State.COMPLETED, job
    for job_id in ids[:-1]:
        assert len(stack.claims(job_id)) == 1, stack.history(job_id)
        assert stack.effect_count(job_id, "check_payment:done") == 1
        assert_recorded_steps_ran_once(stack, job_id)
    assert "held for the next flight" not in worker.output()
