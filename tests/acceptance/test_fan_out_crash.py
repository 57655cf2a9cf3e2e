"""Workflows survive workers killed at their worst moments (issue 17, "Proved, not assumed").

Three solo workers and a sweeper on PostgreSQL and RabbitMQ. A ``fan_out`` parent spawns
three children one by one (a pause step after each); a ``listener`` waits for five
``tick`` events. Workers are SIGKILLed:

1. during the spawns: the parent's worker, after two children are spawned;
2. during the children: the worker of a child inside its work step, the parent parked;
3. during the completion of the last child: every worker whose child has recorded its
   work and is about to write its finish (the write that wakes the parent);
4. the listener's worker, between two events;

and an event is sent right after each kill, while the victim is dead. Then the invariants
of ``tests/acceptance/workflow_checks.py``: the parent resumed exactly once after its last
child, no child was created twice, no event was lost or consumed twice, and no recorded
step ran again.
"""

from __future__ import annotations

import signal

import pytest

import jobs
from jobs._core.states import TERMINAL, State
from tests.acceptance.conftest import (
    PG_RABBITMQ,
    WORKFLOW_KINDS,
    Proc,
    Stack,
    assert_recorded_steps_ran_once,
    wait_until,
)
from tests.acceptance.workflow_checks import (
    WORKFLOW_RECORDS,
    expected_children,
    fan_out_problems,
    listener_problems,
)

pytestmark = pytest.mark.acceptance


class Killer:
    """Kills the worker that owns a job and starts a replacement in its place."""

    def __init__(self, stack: Stack, workers: list[Proc]) -> None:
        self.stack = stack
        self.workers = workers
        self.killed: list[tuple[str, str]] = []

    def owner_of(self, job_id: str) -> Proc | None:
        owner = self.stack.job(job_id).owner
        return next((w for w in self.workers if w.alive() and w.owns(owner)), None)

    def kill(self, victim: Proc, why: str) -> None:
        victim.kill(signal.SIGKILL)
        victim.popen.wait(10)
        self.workers.remove(victim)
        self.killed.append((victim.name, why))
        self.workers.append(self.stack.worker(f"R{len(self.killed)}", wait=False))


def effects_since_claim(stack: Stack, job_id: str) -> list[str]:
    """The effects of ``job_id`` logged by its current owner's process."""
    owner = stack.job(job_id).owner
    if owner is None:
        return []
    pid = int(owner.rsplit(":", 1)[1])
    return [effect for effect, by in stack.effects(job_id) if by == pid]


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_fan_out_and_events_survive_workers_killed_at_every_stage(stack: Stack) -> None:
    stack.configure(JOBS_IMPORTS=WORKFLOW_KINDS)
    workers = [stack.worker(name, wait=False) for name in "ABC"]
    stack.sweeper()
    for worker in workers:
        worker.wait_ready()
    killer = Killer(stack, workers)
    inputs = {"children": 3, "seconds": 1.5, "spawn_pause": 0.8, "finish_pause": 1.5}
    parent = stack.submit("fan_out", inputs)
    listener = stack.submit("listener", {"events": 5, "pause": 1.5})
    children = expected_children(parent, inputs)
    sent: list[int] = []

    def send() -> None:
        sent.append(len(sent))
        jobs.send_event(listener, "tick", sent[-1])

    # 1. During the spawns: two children inserted and recorded, the third not yet.
    stack.wait_effect(parent, "pause-1")
    assert "spawn:c2" not in {step.name for step in stack.steps(parent)}
    spawner = wait_until(lambda: killer.owner_of(parent), 10, "the parent's owner")
    killer.kill(spawner, "during the spawns")
    send()

    # 2. During the children: the parent parked, a child inside its work step.
    def child_at_work() -> Proc | None:
        if stack.job(parent).state is not State.WAITING:
            return None
        for child in children:
            job = stack.job(child)
            working = effects_since_claim(stack, child)
            if job.state is State.RUNNING and working[-1:] == ["work:start"]:
                return killer.owner_of(child)
        return None

    killer.kill(wait_until(child_at_work, 60, "a child at work"), "during a child")
    send()

    # 3. During the completion of the last child: every unfinished child has recorded its
    # work and is between that record and its finishing write; kill all their workers.
    def finishing() -> list[Proc] | None:
        jobs_now = [stack.job(child) for child in children]
        unfinished = [job for job in jobs_now if job.state not in TERMINAL]
        if not unfinished:
            raise AssertionError("every child finished before the kill: lengthen finish_pause")
        owners = []
        for job in unfinished:
            recorded = {step.name for step in stack.steps(job.id)}
            mine = effects_since_claim(stack, job.id)
            owner = killer.owner_of(job.id)
            if job.state is not State.RUNNING or "work" not in recorded or owner is None:
                return None
            if mine[-1:] != ["finishing"]:
                return None
            if all(owner is not known for known in owners):
                owners.append(owner)
        return owners

    for victim in wait_until(finishing, 60, "the last children between record and finish"):
        killer.kill(victim, "during the completion of the last child")
    send()

    # 4. The listener's worker between two events: it consumed one and is in the pause
    # after it; the next event is sent while the worker is dead.
    send()

    def listening() -> Proc | None:
        mine = effects_since_claim(stack, listener)
        return killer.owner_of(listener) if mine[-1:] == [f"pause-{len(sent) - 1}"] else None

    victim = wait_until(listening, 30, "the listener in the pause after an event", interval=0.02)
    killer.kill(victim, "the listener between events")
    send()

    done = stack.wait_state(parent, timeout=90)
    assert done.state is State.COMPLETED, done.last_error
    assert done.result == {"children": 3, "sum": 0 + 1 + 4}
    heard = stack.wait_state(listener, timeout=60)
    assert heard.state is State.COMPLETED, heard.last_error
    print(f"\n[fan-out crash] kills: {killer.killed}")

    problems = fan_out_problems(stack, parent, inputs)
    problems += listener_problems(stack, listener, sent)
    assert not problems, problems
    assert stack.effect_count(parent, "resumed") == 1, stack.effects(parent)
    for job_id in [parent, listener, *children]:
        assert_recorded_steps_ran_once(stack, job_id, skip=WORKFLOW_RECORDS)
    # The kills really hit what they were meant to: the parent and every child that was
    # finishing ran again under a new claim.
    assert len(stack.claims(parent)) >= 3, stack.history(parent)  # takeover, then the wake
    assert sum(len(stack.claims(child)) - 1 for child in children) >= 2
