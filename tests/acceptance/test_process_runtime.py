"""One runtime object per process, rebuilt after the fork, with a real prefork worker: each
pool child claims with its own engine and its own liveness lock, and the worker's main
process (which only consumes and hands messages to the pool) preloads the code its children
run but never connects to the database."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
from sqlalchemy import text

from jobs._core.states import State
from tests.acceptance.conftest import PG_RABBITMQ, Stack, owner_pid, wait_until


def loads(pid: int, library: str) -> bool:
    """Whether the process has mapped a file of ``library`` (its compiled extensions)."""
    return f"/{library}/" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_each_pool_child_claims_with_its_own_engine_and_liveness_lock(stack: Stack) -> None:
    worker = stack.worker("A", pool="prefork", concurrency=2)
    first = stack.submit("check_order", {"order_id": 1, "check_seconds": 4.0})
    second = stack.submit("check_order", {"order_id": 2, "check_seconds": 4.0})
    wait_until(
        lambda: all(stack.job(j).state is State.RUNNING for j in (first, second)),
        30,
        "both jobs running at once",
    )
    running = [stack.job(j) for j in (first, second)]
    children = set(worker.pool_children())
    pids = {owner_pid(job.owner) for job in running}
    assert pids == children, (pids, children)  # one job in each pool child
    with stack.store.engine.connect() as conn:
        keys = set(
            conn.execute(
                text("SELECT liveness_key FROM jobs WHERE id IN (:a, :b)"),
                {"a": first, "b": second},
            ).scalars()
        )
        holders = dict(
            conn.execute(
                text(
                    "SELECT (classid::bigint << 32) | objid::bigint, pid FROM pg_locks "
                    "WHERE locktype = 'advisory' AND granted"
                )
            ).all()
        )
    assert len(keys) == 2, keys
    assert None not in keys
    assert keys <= set(holders), (keys, holders)
    assert len({holders[key] for key in keys}) == 2  # two sessions: one per child
    assert loads(worker.pid, "sqlalchemy")  # preloaded before the fork, shared by the pool
    # jobctl worker runs Celery's worker command without Celery's command line, whose plugin
    # commands (Flower with Tornado) every process would otherwise carry.
    assert not loads(worker.pid, "tornado")
    assert not [
        c
        for c in psutil.Process(worker.pid).net_connections("tcp")
        if c.raddr and c.raddr.port == 5432
    ]  # ...but the main process holds no database connection
    for job_id in (first, second):
        assert stack.wait_state(job_id, timeout=30).state is State.COMPLETED
