"""A worker cut off from PostgreSQL and RabbitMQ keeps no job hostage (issue 10).

Worker P reaches both services through TCP proxies the test can cut
(tests/acceptance/tcp_proxy.py); worker B and the sweeper reach them directly. P is cut
off in the middle of a job: its lease runs out on the database clock, the sweeper
re-queues the job and B finishes it. When the partition heals, what P sent meanwhile
arrives; its fenced writes are refused, it writes nothing more for that job, and it
carries on with new work.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from jobs._core.states import State
from tests.acceptance.conftest import (
    PG_RABBITMQ,
    Stack,
    assert_recorded_steps_ran_once,
    owner_pid,
    wait_until,
)
from tests.acceptance.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]


def _target(url: str) -> tuple[str, int]:
    from sqlalchemy.engine import make_url  # noqa: PLC0415

    if url.startswith("amqp"):
        hostport = url.split("@", 1)[1].split("/", 1)[0]
        host, _, port = hostport.partition(":")
        return host, int(port or 5672)
    parsed = make_url(url)
    return parsed.host or "127.0.0.1", parsed.port or 5432


@pytest.fixture
def proxies(stack: Stack) -> Iterator[tuple[TcpProxy, TcpProxy]]:
    database = TcpProxy(_target(stack.database_url)).start()
    broker = TcpProxy(_target(stack.env["JOBS_BROKER_URL"])).start()
    try:
        yield database, broker
    finally:
        database.close()
        broker.close()


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_partitioned_worker_keeps_no_job_hostage_and_is_fenced_after_healing(
    stack: Stack, proxies: tuple[TcpProxy, TcpProxy]
) -> None:
    database, broker = proxies
    lease = float(stack.env["JOBS_LEASE_SECONDS"])  # 3 s in the acceptance stack
    cut_off = stack.worker(
        "P",
        env={
            "JOBS_DATABASE_URL": database.url_for(stack.database_url),
            "JOBS_BROKER_URL": broker.url_for(stack.env["JOBS_BROKER_URL"]),
        },
    )
    job_id = stack.submit("sleep_steps", {"steps": 6, "seconds": 1.0})
    wait_until(lambda: len(stack.steps(job_id)) >= 1, 30, "P to record a step")
    assert cut_off.owns(stack.job(job_id).owner)
    fence_before = stack.job(job_id).fence

    database.cut()
    broker.cut()
    cut_at = time.monotonic()
    other = stack.worker("B")
    stack.sweeper()
    job = stack.wait_state(job_id, timeout=lease + 30)
    took = time.monotonic() - cut_at
    assert job.state is State.COMPLETED, job
    assert other.owns(job.owner), job.owner
    assert job.fence > fence_before
    recorded_by_p = {s.name for s in stack.steps(job_id) if cut_off.owns(s.owner)}
    print(f"\n[partition] job finished by B {took:.1f}s after P was cut off (lease {lease}s)")

    # Heal: what P sent during the partition arrives now and is refused by the fence.
    other.terminate()  # from now on only P can take new work
    database.heal()
    broker.heal()
    lost = wait_until(
        lambda: [ln for ln in cut_off.output().splitlines() if f"job {job_id}: lease_lost" in ln],
        60,
        "P to learn it lost the lease",
    )
    print(f"[partition] after healing, P: {lost[0]}")
    after = stack.job(job_id)
    assert after.state is State.COMPLETED, after
    assert after.owner == job.owner, after
    assert {s.name for s in stack.steps(job_id) if cut_off.owns(s.owner)} == recorded_by_p
    assert_recorded_steps_ran_once(stack, job_id)

    new_jobs = [stack.submit("sleep_steps", {"steps": 1, "seconds": 0.1}) for _ in range(3)]
    for new_id in new_jobs:
        done = stack.wait_state(new_id, timeout=60)
        assert done.state is State.COMPLETED, done
        assert owner_pid(done.owner) in (cut_off.pid, *cut_off.pool_children()), done.owner
        assert cut_off.owns(done.owner)
    assert cut_off.alive()
