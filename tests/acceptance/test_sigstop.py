"""Scenario 4: a worker frozen (SIGSTOP) past its lease wakes up fenced out.

A stopped process keeps its sockets, so on PostgreSQL its liveness lock is still held:
only the lease running out on the database clock tells the sweeper to take the job
back. When the old worker is continued it finishes the step function it was in, and
every write it then tries is refused by the fence.
"""

from __future__ import annotations

import re
import signal

import pytest

from jobs._core.states import State
from tests.acceptance.conftest import (
    BOTH,
    Stack,
    assert_recorded_steps_ran_once,
    wait_until,
)
from tests.acceptance.test_crash import victim_in_second_step

pytestmark = pytest.mark.acceptance


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_sigstop_past_lease_then_sigcont_is_fenced_out(stack: Stack) -> None:
    workers = [stack.worker("A", wait=False), stack.worker("B", wait=False)]
    stack.sweeper()
    for worker in workers:
        worker.wait_ready()
    job_id = stack.submit("check_order", {"order_id": 42, "check_seconds": 4.0})
    victim = victim_in_second_step(stack, job_id, workers)
    survivor = next(w for w in workers if w is not victim)
    stale = stack.job(job_id)
    assert stale.lease_until is not None
    stopped_at = victim.kill(signal.SIGSTOP)

    def taken_over() -> bool:
        return survivor.owns(stack.job(job_id).owner)

    wait_until(taken_over, 20, "the survivor to take the job over")
    takeover = stack.claims(job_id)[-1]
    print(
        f"\n[{stack.backend}] lease {stack.env['JOBS_LEASE_SECONDS']}s: taken over "
        f"{takeover.at.timestamp() - stopped_at:.2f}s after SIGSTOP "
        f"(lease ran out {stale.lease_until.timestamp() - stopped_at:.2f}s after it)"
    )
    # The stale worker is still frozen: it is woken while the new owner is mid-step.
    before = stack.job(job_id)
    assert before.state is State.RUNNING
    assert victim.alive()
    steps_before = stack.steps(job_id)
    victim.kill(signal.SIGCONT)

    # The woken worker's first write (its overdue renewal, or the step record if the
    # handler thread got there first) is fenced on its old claim and matches no row: the
    # refusal it logs is the database's, naming the fence the row carries now, a fact the
    # woken process could only learn from the row.
    refused = re.compile(
        rf"refused by the database: job '{job_id}': lease lost by '{re.escape(stale.owner or '')}' "
        rf"\(fence {stale.fence}\): now (RUNNING|COMPLETED) under fence {takeover.fence}"
    )
    wait_until(
        lambda: refused.search(victim.output()), 20, "the database to refuse the woken worker"
    )
    # ...and the refused write changed nothing: the row is still the survivor's claim,
    # and the woken worker recorded no step.
    after_refusal = stack.job(job_id)
    assert (after_refusal.owner, after_refusal.fence) == (before.owner, before.fence)
    assert survivor.owns(after_refusal.owner)
    assert [(s.name, s.fence, s.owner) for s in stack.steps(job_id)][: len(steps_before)] == [
        (s.name, s.fence, s.owner) for s in steps_before
    ]
    wait_until(
        lambda: f"job {job_id}: lease_lost" in victim.output(),
        20,
        "the woken worker to give the run up",
    )
    job = stack.wait_state(job_id, timeout=30)
    assert job.state is State.COMPLETED, job
    assert survivor.owns(job.owner)
    assert victim.alive(), "a fenced-out worker stops the job, not itself"

    # The takeover was lease expiry (the frozen process still held its liveness lock).
    history = stack.history(job_id)
    requeue = next(t for t in history if t.to_state is State.QUEUED and t.from_state)
    assert requeue.reason == "lease expired", requeue
    assert requeue.at >= stale.lease_until
    assert takeover.fence is not None
    assert takeover.fence > stale.fence

    # Nothing the woken worker tried to write was accepted.
    after = history[history.index(takeover) :]
    assert not [t for t in after if victim.owns(t.owner)], after
    steps = {step.name: step for step in stack.steps(job_id)}
    assert [n for n, s in steps.items() if s.fence == stale.fence] == ["lookup_order"]
    assert steps["check_payment"].fence == takeover.fence
    assert survivor.owns(steps["check_payment"].owner)
    assert [t.to_state for t in history] == [
        State.QUEUED,
        State.RUNNING,
        State.QUEUED,
        State.RUNNING,
        State.COMPLETED,
    ]

    # Its step function did finish after SIGCONT (twice "done"), but only the survivor's
    # output was recorded; the recorded lookup never ran again.
    assert stack.effect_count(job_id, "lookup_order") == 1
    assert stack.effect_count(job_id, "check_payment:start") == 2
    wait_until(
        lambda: stack.effect_count(job_id, "check_payment:done") == 2,
        10,
        "both check_payment runs to finish",
    )
    assert_recorded_steps_ran_once(stack, job_id)
    stack.wait_queue_empty()
