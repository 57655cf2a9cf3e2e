"""A worker killed mid-step: the step runs again elsewhere under the same idempotency key
(issue 26). Two real ``celery worker`` processes; the one inside ``charge`` is SIGKILLed,
the other finishes the job. ``effects.log`` holds one ``charge:start:<key>`` line per real
run of the step's function, so the key each run sent is visible."""

from __future__ import annotations

import re
import signal

import pytest

from jobs._core.context import idempotency_key_of
from jobs._core.states import State
from tests.acceptance.conftest import BOTH, Proc, Stack, wait_until

pytestmark = pytest.mark.acceptance

KEY = re.compile(r"^jk-[a-z2-7]{32}$")


def charge_keys(stack: Stack, job_id: str, what: str) -> list[str]:
    prefix = f"charge:{what}:"
    return [
        effect.removeprefix(prefix)
        for effect, _pid in stack.effects(job_id)
        if effect.startswith(prefix)
    ]


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_a_step_rerun_after_sigkill_sends_the_same_key(stack: Stack) -> None:
    workers = [stack.worker("A", wait=False), stack.worker("B", wait=False)]
    stack.sweeper()
    for worker in workers:
        worker.wait_ready()
    job_id = stack.submit("charge_order", {"order_id": 7, "charge_seconds": 3.0})
    other_id = stack.submit("charge_order", {"order_id": 7, "charge_seconds": 0.0})

    def inside_charge() -> Proc | None:
        job = stack.job(job_id)
        if job.state is State.RUNNING and charge_keys(stack, job_id, "start"):
            return next((w for w in workers if w.owns(job.owner)), None)
        return None

    victim = wait_until(inside_charge, 60, f"a worker to be inside charge of {job_id}")
    victim.kill(signal.SIGKILL)
    victim.popen.wait(10)

    job = stack.wait_state(job_id, timeout=60)
    assert job.state is State.COMPLETED, job
    survivor = next(w for w in workers if w is not victim)
    assert survivor.owns(job.owner), job.owner
    started = charge_keys(stack, job_id, "start")
    # Two real runs of the charge (the victim's, cut short, and the survivor's), one key.
    assert len(started) == 2, stack.effects(job_id)
    assert len(set(started)) == 1, started
    key = started[0]
    assert KEY.match(key), key
    assert key == idempotency_key_of(job_id, "step:charge")
    assert charge_keys(stack, job_id, "done") == [key]
    assert job.result == {"charged_cents": 4200, "idempotency_key": key}

    other = stack.wait_state(other_id, timeout=60)
    assert other.state is State.COMPLETED, other
    assert other.result["idempotency_key"] != key  # another job, another key
