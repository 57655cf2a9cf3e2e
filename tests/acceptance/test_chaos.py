"""A seeded chaos run (issue 8): many multi-step jobs on PostgreSQL and RabbitMQ (throwaway
servers of the test's own, both restarted as faults) with three prefork workers and two
sweepers while faults are injected; then the checker reads the ledger and the side-effect
log (see ``tests/acceptance/chaos.py``).

Workflows are in the mix (issue 17): about one job in four is a ``fan_out`` parent (four
children, spawned one by one or in one bulk insert), and two ``listener`` jobs get a
``tick`` event after every fault. Their invariants are checked too
(``tests/acceptance/workflow_checks.py``): every parent resumed exactly once after its
last child, no child was created twice, no event was lost or consumed twice.

The test-suite runs a short one. ``make chaos`` runs a long one (``CHAOS_JOBS``,
``CHAOS_SECONDS``; ``CHAOS_SEED`` replays a seed; the seed is always printed;
``CHAOS_FAULTS=outage_at_step_end,kill_child`` limits the faults to those kinds).
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import pytest
from sqlalchemy.exc import DBAPIError

import jobs
from jobs.application import default_app
from tests.acceptance.chaos import CHILD_SECONDS, KIND, SPAWN_PAUSE, STEP_SECONDS, Chaos, check
from tests.acceptance.conftest import (
    PRIVATE_PG_PRIVATE_RABBITMQ,
    WORKFLOW_KINDS,
    PrivatePostgres,
    Stack,
    wait_until,
)
from tests.acceptance.workflow_checks import (
    expected_children,
    fan_out_problems,
    listener_problems,
)

LISTENERS = 2
EVENTS_EACH = 6

pytestmark = pytest.mark.acceptance


@pytest.mark.parametrize("stack", [PRIVATE_PG_PRIVATE_RABBITMQ], indirect=True)
def test_chaos(stack: Stack, private_pg: PrivatePostgres) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1, 10**6))
    jobs_count = int(os.environ.get("CHAOS_JOBS", "16"))
    seconds = float(os.environ.get("CHAOS_SECONDS", "20"))
    print(f"\n[chaos] seed {seed} (replay: CHAOS_SEED={seed} make chaos)")
    stack.configure(JOBS_IMPORTS=WORKFLOW_KINDS)
    only = tuple(kind for kind in os.environ.get("CHAOS_FAULTS", "").split(",") if kind)
    chaos = Chaos(stack, private_pg, seed, rabbit=stack.cluster, kinds=only)
    chaos.start()
    wait_until(
        lambda: all("sweeper: every" in p.output() for p in stack.procs if p.name == "sweeper"),
        30,
        "the sweepers to run",
    )
    schedule = random.Random(seed)
    submitted: list[str] = []
    fan_outs: dict[str, dict[str, Any]] = {}
    for number in range(jobs_count):
        kind, inputs = KIND, {"steps": 4, "seconds": STEP_SECONDS}
        if schedule.random() < 0.25:  # a fan-out parent
            kind = "fan_out"
            inputs = {"children": 4, "seconds": CHILD_SECONDS, "spawn_pause": SPAWN_PAUSE}
            inputs["bulk"] = schedule.random() < 0.5
        job_id = f"chaos-{seed}-{number}"
        if schedule.random() < 0.15:  # a lost doorbell: only the sweeper can send it
            with default_app().runtime.doorbell_off():
                submitted.append(stack.submit(kind, inputs, job_id=job_id))
        else:
            submitted.append(stack.submit(kind, inputs, job_id=job_id))
        if kind == "fan_out":
            fan_outs[job_id] = inputs
    listeners = {
        stack.submit("listener", {"events": EVENTS_EACH, "pause": 0.3}): []
        for _ in range(LISTENERS)
    }
    sent: list[int] = []

    def send_one() -> None:
        open_ = [job_id for job_id, got in listeners.items() if len(got) < EVENTS_EACH]
        if open_:
            job_id = open_[schedule.randrange(len(open_))]
            sent.append(len(sent))
            listeners[job_id].append(sent[-1])
            wait_until(lambda: try_send(job_id, sent[-1]), 30, "an event to be sent")

    def try_send(job_id: str, payload: int) -> bool:
        try:  # the database may be restarting (a fault): the send is all or nothing
            jobs.send_event(job_id, "tick", payload)
        except DBAPIError:
            jobs.reset()
            return False
        return True

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(schedule.uniform(0.5, 2.0))
        fault = chaos.inject(submitted)
        print(f"[chaos] {fault.kind} {fault.detail} (jobs hit: {len(fault.jobs)})")
        send_one()
    while len(sent) < LISTENERS * EVENTS_EACH:
        send_one()
    children = [
        child for parent, inputs in fan_outs.items() for child in expected_children(parent, inputs)
    ]
    everything = [*submitted, *listeners]

    def all_finished() -> bool:
        jobs_now = [*everything, *(c.id for p in fan_outs for c in stack.store.reads.children(p))]
        return all(stack.job(job_id).state.value in ("COMPLETED", "FAILED") for job_id in jobs_now)

    wait_until(all_finished, 180, "every job to finish after the faults", interval=1)
    created = [c.id for p in fan_outs for c in stack.store.reads.children(p)]
    report = check(stack, [*everything, *created], chaos.faults)
    for line in report.lines(seed):
        print(f"[chaos] {line}")
    for name in ("lost", "failed", "illegal", "stale_writes", "recorded_reruns"):
        for item in getattr(report, name)[:5]:
            print(f"[chaos] {name}: {item}")
    used_up = {line.split(":", 1)[0] for line in report.failed}
    workflow: list[str] = []
    for parent, inputs in fan_outs.items():
        family = {parent, *expected_children(parent, inputs)}
        workflow += fan_out_problems(stack, parent, inputs, strict=not family & used_up)
    for job_id, payloads in listeners.items():
        if job_id not in used_up:
            workflow += listener_problems(stack, job_id, payloads)
    print(
        f"[chaos] workflows: {len(fan_outs)} fan-out parents, {len(created)} children "
        f"(of {len(children)}), {len(sent)} events to {len(listeners)} listeners; "
        f"problems {len(workflow)}"
    )
    for item in workflow[:10]:
        print(f"[chaos] workflow: {item}")
    assert report.ok, report
    assert not workflow, workflow
    assert all(worker.alive() for worker in chaos.pool)
