"""A worker SIGKILLed inside an atomic step (issue 26): the application's row is written but
not committed; the job, resumed on another real ``celery worker``, leaves exactly one row.
The control, the same write in a plain step committed on its own, leaves two.

``record_payment`` (jobs/examples/check_order.py) looks an order up, then writes a row into
the application's ``app_payments`` table (in the jobs' database) and lingers in the step:
``effects.log`` says when the row is written (``payment:inserted``) and, for the plain
step, committed (``payment:committed``)."""

from __future__ import annotations

import signal

import pytest
from sqlalchemy import text

from jobs._core.states import State
from tests.acceptance.conftest import BOTH, Proc, Stack, wait_until

pytestmark = pytest.mark.acceptance


def payment_rows(stack: Stack, job_id: str) -> int:
    with stack.store.statements.read() as conn:  # on SQLite: no write lock to wait for
        return int(
            conn.execute(
                text("SELECT count(*) FROM app_payments WHERE job_id = :job_id"),
                {"job_id": job_id},
            ).scalar_one()
        )


def killed_inside_the_step(stack: Stack, transactional: bool) -> tuple[str, list[str]]:
    """Two workers and a sweeper; the worker inside ``record`` is SIGKILLed once its row is
    written (atomic: not committed; plain: committed, the step's record not yet written);
    the survivor finishes the job. The job's ID and the effects of its steps."""
    with stack.store.engine.begin() as conn:
        conn.execute(
            text(
                "CREATE TABLE IF NOT EXISTS app_payments "
                "(id INTEGER PRIMARY KEY, job_id VARCHAR(64) NOT NULL, cents INTEGER NOT NULL)"
                if stack.store.engine.dialect.name == "sqlite"
                else "CREATE TABLE IF NOT EXISTS app_payments "
                "(id SERIAL PRIMARY KEY, job_id VARCHAR(64) NOT NULL, cents INTEGER NOT NULL)"
            )
        )
    workers = [stack.worker("A", wait=False), stack.worker("B", wait=False)]
    stack.sweeper()
    for worker in workers:
        worker.wait_ready()
    # SQLite: the atomic step holds the database's write lock, so the heartbeat's renewal
    # waits for its commit; the step must end within the lease (3 s here).
    pause = 1.0 if stack.store.engine.dialect.name == "sqlite" else 3.0
    job_id = stack.submit(
        "record_payment", {"order_id": 7, "pause_seconds": pause, "transactional": transactional}
    )
    written = "payment:inserted" if transactional else "payment:committed"

    def inside_the_step() -> Proc | None:
        job = stack.job(job_id)
        if job.state is State.RUNNING and stack.effect_count(job_id, written) >= 1:
            return next((w for w in workers if w.owns(job.owner)), None)
        return None

    victim = wait_until(inside_the_step, 60, f"a worker inside the step of {job_id}")
    if transactional:
        assert payment_rows(stack, job_id) == 0  # written, not committed
    victim.kill(signal.SIGKILL)
    victim.popen.wait(10)

    job = stack.wait_state(job_id, timeout=90)
    assert job.state is State.COMPLETED, job
    survivor = next(w for w in workers if w is not victim)
    assert survivor.owns(job.owner), job.owner
    assert job.result == {"cents": 4200}
    return job_id, [effect for effect, _pid in stack.effects(job_id)]


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_an_atomic_steps_row_is_written_once_after_a_sigkill_inside_it(stack: Stack) -> None:
    job_id, effects = killed_inside_the_step(stack, transactional=True)
    assert effects.count("payment:inserted") == 2, effects  # the step's function ran twice
    assert effects.count("lookup_order") == 1, effects  # the recorded step did not
    assert payment_rows(stack, job_id) == 1  # but its row is there once
    assert [step.name for step in stack.steps(job_id)] == ["lookup_order", "record"]


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_the_control_a_plain_steps_row_is_written_twice(stack: Stack) -> None:
    job_id, effects = killed_inside_the_step(stack, transactional=False)
    assert effects.count("payment:committed") == 2, effects
    assert payment_rows(stack, job_id) == 2  # the plain step's write, repeated
