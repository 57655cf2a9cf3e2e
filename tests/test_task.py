"""The Celery task's body, called in-process: what a delivery does for each state of the job.
(The same task under real workers and brokers is covered in tests/acceptance.)"""

from __future__ import annotations

import logging
from typing import Any

import pytest

import jobs
from jobs._worker import delivery
from jobs.application import default_app
from jobs.celery_app import app

run_job = app.tasks["jobs.run"]


@jobs.job("task_probe", max_attempts=2)
def task_probe(ctx: jobs.JobContext, n: int) -> dict[str, Any]:
    return {"n": ctx.step("double", lambda: n * 2)}


@jobs.job("task_fair_probe", concurrency_key="tenant", fair=True)
def task_fair_probe(ctx: jobs.JobContext, tenant: str) -> str:
    return ctx.step("echo", lambda: tenant)


def deliver(*args: Any, **kwargs: Any) -> str:
    result: str = run_job(*args, **kwargs)
    return result


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {}),
        ((1,), {}),
        (("a", "b"), {}),
        (("x",), {"junk": 1}),
        (("",), {}),
        (("x" * 201,), {}),
    ],
)
def test_garbage_is_dropped(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    assert deliver(*args, **kwargs) == "garbage"


def test_unknown_job_is_dropped() -> None:
    assert deliver("no-such-job") == "no-such-job: dropped (unknown job)"


def test_delivery_runs_the_job_and_a_duplicate_is_dropped() -> None:
    job_id = jobs.submit("task_probe", {"n": 21})
    assert deliver(job_id) == f"{job_id}: completed"
    assert jobs.get(job_id).result == {"n": 42}
    assert deliver(job_id) == f"{job_id}: dropped (already COMPLETED)"
    assert [s.name for s in jobs.steps(job_id)] == ["double"]


def test_a_fair_swap_names_the_job_it_ran_and_the_doorbell_it_came_by() -> None:
    """A delivery of a fair kind that claims another key's job instead of its doorbell's
    says so: the job it ran first, then whose doorbell it came by."""

    def deliver_fair(job_id: str) -> str:  # its task named after the kind: a hint
        return delivery.deliver(
            default_app().runtime, job_id, None, lambda: False, kind="task_fair_probe"
        )[1]

    served = jobs.submit("task_fair_probe", {"tenant": "a"})
    assert deliver_fair(served) == f"{served}: completed"
    doorbell = jobs.submit("task_fair_probe", {"tenant": "a"})
    other = jobs.submit("task_fair_probe", {"tenant": "b"})  # its key never served: picked
    assert deliver_fair(doorbell) == f"{other}: completed (for the doorbell of {doorbell})"
    assert jobs.get(other).result == "b"
    assert jobs.get(doorbell).state is jobs.State.QUEUED


def test_a_job_not_due_yet_is_left_alone() -> None:
    job_id = jobs.submit("task_probe", {"n": 1}, delay=3600)
    assert deliver(job_id).startswith(f"{job_id}: dropped (QUEUED but not due until")
    assert jobs.get(job_id).state is jobs.State.QUEUED


def test_a_job_without_a_free_slot_waits() -> None:
    jobs.set_limits("task_probe", max_running=0)
    job_id = jobs.submit("task_probe", {"n": 1})
    assert "waiting for a slot" in deliver(job_id)
    assert jobs.get(job_id).state is jobs.State.QUEUED
    jobs.set_limits("task_probe", max_running=1)
    assert deliver(job_id) == f"{job_id}: completed"


@pytest.mark.parametrize(
    ("pool", "broker", "warned"),
    [
        ("solo", "amqp://guest:guest@127.0.0.1:5672//", True),
        ("threads", "amqp://guest:guest@127.0.0.1:5672//", False),
        ("prefork", "amqp://guest:guest@127.0.0.1:5672//", False),
        ("solo", "filesystem://", False),
    ],
)
def test_a_worker_on_the_solo_pool_is_warned_at_start_up(
    pool: str,
    broker: str,
    warned: bool,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Celery's solo pool with late acknowledgement stalls between deliveries on RabbitMQ:
    the worker says so, and what to run instead."""
    from types import SimpleNamespace  # noqa: PLC0415

    from celery.concurrency import get_implementation  # noqa: PLC0415

    from jobs._worker.signals import SOLO_POOL_WARNING, warn_about_the_pool  # noqa: PLC0415
    from jobs.application import default_app  # noqa: PLC0415

    monkeypatch.setenv("JOBS_BROKER_URL", broker)
    default_app().reset_settings()
    with caplog.at_level("WARNING", logger="jobs.worker"):
        warn_about_the_pool(
            SimpleNamespace(pool_cls=get_implementation(pool)), default_app().settings
        )
    assert (SOLO_POOL_WARNING in caplog.text) is warned


def test_a_doorbell_requeued_through_an_outage_is_logged_on_one_line_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Celery logs every Reject with its traceback (a worker logged six in a failover): the
    requeue of a delivery that could not reach the database is one line, and any other
    Reject keeps its traceback. Traced by Celery's own tracer, as a worker traces a task."""
    from celery import Celery  # noqa: PLC0415
    from celery.exceptions import Reject  # noqa: PLC0415

    from jobs._worker.installed import (  # noqa: PLC0415
        RequeuedThroughOutage,
        quiet_requeue_tracebacks,
    )

    celery = Celery("requeue_probe", broker="memory://", set_as_current=False)

    @celery.task(name="requeued")
    def requeued() -> None:
        raise RequeuedThroughOutage("j1: database unreachable; doorbell requeued", requeue=True)

    @celery.task(name="rejected")
    def rejected() -> None:
        raise Reject("other", requeue=False)

    quiet_requeue_tracebacks()
    quiet_requeue_tracebacks()  # once per process, however often installed
    trace_log = logging.getLogger("celery.app.trace")
    assert sum(type(each).__name__ == "_NoRequeueTraceback" for each in trace_log.filters) == 1
    with caplog.at_level(logging.WARNING, logger="celery.app.trace"):
        requeued.apply()
        rejected.apply()
    lines = {record.getMessage(): record for record in caplog.records}
    (requeue_line,) = [line for line in lines if "doorbell requeued" in line]
    assert lines[requeue_line].exc_info is None
    (other_line,) = [line for line in lines if "reject requeue=False: other" in line]
    assert lines[other_line].exc_info is not None  # only the requeue loses its traceback
