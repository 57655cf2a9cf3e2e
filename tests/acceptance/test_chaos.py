"""A seeded chaos run (issue 8): many multi-step jobs on PostgreSQL and RabbitMQ (throwaway
servers of the test's own, both restarted as faults) with three prefork workers and two
sweepers while faults are injected; then the checker reads the ledger and the side-effect
log (see ``tests/acceptance/chaos.py``).

The test-suite runs a short one. ``make chaos`` runs a long one (``CHAOS_JOBS``,
``CHAOS_SECONDS``; ``CHAOS_SEED`` replays a seed; the seed is always printed).
"""

from __future__ import annotations

import os
import random
import time

import pytest

from jobs.application import default_app
from tests.acceptance.chaos import KIND, Chaos, check
from tests.acceptance.conftest import (
    PRIVATE_PG_PRIVATE_RABBITMQ,
    PrivatePostgres,
    Stack,
    wait_until,
)

pytestmark = pytest.mark.acceptance


@pytest.mark.parametrize("stack", [PRIVATE_PG_PRIVATE_RABBITMQ], indirect=True)
def test_chaos(stack: Stack, private_pg: PrivatePostgres) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1, 10**6))
    jobs_count = int(os.environ.get("CHAOS_JOBS", "16"))
    seconds = float(os.environ.get("CHAOS_SECONDS", "20"))
    print(f"\n[chaos] seed {seed} (replay: CHAOS_SEED={seed} make chaos)")
    chaos = Chaos(stack, private_pg, seed, rabbit=stack.cluster)
    chaos.start()
    wait_until(
        lambda: all("sweeper: every" in p.output() for p in stack.procs if p.name == "sweeper"),
        30,
        "the sweepers to run",
    )
    schedule = random.Random(seed)
    submitted: list[str] = []
    for number in range(jobs_count):
        inputs = {"steps": 4, "seconds": 0.4}
        if schedule.random() < 0.15:  # a lost doorbell: only the sweeper can send it
            with default_app().runtime.doorbell_off():
                submitted.append(stack.submit(KIND, inputs, job_id=f"chaos-{seed}-{number}"))
        else:
            submitted.append(stack.submit(KIND, inputs, job_id=f"chaos-{seed}-{number}"))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(schedule.uniform(0.5, 2.0))
        fault = chaos.inject(submitted)
        print(f"[chaos] {fault.kind} {fault.detail} (jobs hit: {len(fault.jobs)})")

    def all_finished() -> bool:
        return all(stack.job(job_id).state.value in ("COMPLETED", "FAILED") for job_id in submitted)

    wait_until(all_finished, 180, "every job to finish after the faults", interval=1)
    report = check(stack, submitted, chaos.faults)
    for line in report.lines(seed):
        print(f"[chaos] {line}")
    for name in ("lost", "failed", "illegal", "stale_writes", "recorded_reruns"):
        for item in getattr(report, name)[:5]:
            print(f"[chaos] {name}: {item}")
    assert report.ok, report
    assert all(worker.alive() for worker in chaos.pool)
