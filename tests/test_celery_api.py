"""The Celery-shaped API (jobs/tasks.py, jobs/results.py) on the embedded default (SQLite,
no doorbell): ``@jobs.job`` kinds with ``.delay``/``.apply_async``/``.s``, and their result
handles with Celery's state names."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from celery import exceptions as celery_exceptions

import jobs
from jobs import testing
from jobs._core.context import JobContext
from jobs._core.errors import InvalidInput
from jobs._core.states import State
from jobs.application import default_app
from jobs.results import JobFailure, JobResult

ROOT = Path(__file__).resolve().parent.parent
FAILS = {"left": 0}


@jobs.job("capi_check_order", max_attempts=2)
def capi_check_order(ctx: JobContext, order_id: int, note: str = "") -> dict[str, Any]:
    if FAILS["left"] > 0:
        FAILS["left"] -= 1
        raise ValueError(f"order service down for {order_id}")
    return {"order": order_id, "note": note}


@jobs.job("capi_approval")
def capi_approval(ctx: JobContext) -> str:
    ctx.wait_for_approval("big refund")
    return "refunded"


@jobs.job("capi_fan", max_attempts=1)
def capi_fan(ctx: JobContext, ids: list[int]) -> list[Any]:
    first = ctx.spawn(capi_check_order.s(order_id=ids[0], note="spawned"), key="first")
    mapped = ctx.map([capi_check_order.s(order_id=n) for n in ids])
    by_task = ctx.map(capi_check_order, [{"order_id": n} for n in ids], key="by_task")
    return [ctx.wait_for([first], key="first")[0], mapped, by_task]


@jobs.job
def capi_bare(ctx: JobContext, text: str) -> str:
    return text.upper()


@jobs.job(max_attempts=4)
def capi_unnamed(ctx: JobContext) -> str:
    return "done"


@pytest.fixture(autouse=True)
def no_failures() -> None:
    FAILS["left"] = 0


def test_the_decorated_kind_still_calls_like_the_function() -> None:
    assert capi_check_order(None, 7, note="x") == {"order": 7, "note": "x"}  # type: ignore[arg-type]
    assert capi_check_order.__name__ == "capi_check_order"
    assert capi_check_order.name == "capi_check_order"
    assert jobs.REGISTRY.get("capi_check_order").handler is capi_check_order


def test_a_bare_or_unnamed_decorator_names_the_kind_after_the_function() -> None:
    assert capi_bare.name == "capi_bare"
    assert capi_unnamed.name == "capi_unnamed"
    assert jobs.REGISTRY.get("capi_unnamed").max_attempts == 4
    assert capi_bare(None, "hi") == "HI"  # type: ignore[arg-type]
    result = capi_bare.delay(text="hi")
    testing.drain()
    assert result.get(timeout=5) == "HI"


def test_delay_submits_and_the_handle_follows_the_job() -> None:
    result = capi_check_order.delay(order_id=42)
    assert isinstance(result, JobResult)
    assert jobs.get(result.id).inputs == {"order_id": 42}
    assert result.state == "PENDING"
    assert result.job_state is State.QUEUED
    assert not result.ready()
    assert result.result is None
    testing.drain()
    assert result.state == "SUCCESS"
    assert result.ready()
    assert result.successful()
    assert not result.failed()
    assert result.get(timeout=5) == {"order": 42, "note": ""}
    assert result.result == {"order": 42, "note": ""}
    assert capi_check_order.AsyncResult(result.id) == result


def test_positional_inputs_are_named_by_the_signature() -> None:
    result = capi_check_order.delay(5, "by position")
    assert jobs.get(result.id).inputs == {"order_id": 5, "note": "by position"}


def test_apply_async_takes_celery_options() -> None:
    eta = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    later = capi_check_order.apply_async(kwargs={"order_id": 1}, eta=eta, priority=7, queue="q2")
    job = jobs.get(later.id)
    assert (job.priority, job.queue) == (7, "q2")
    assert job.run_after >= eta - dt.timedelta(seconds=5)
    counted = capi_check_order.apply_async(args=(2,), countdown=600, task_id="order-2")
    assert counted.id == "order-2"
    assert jobs.get("order-2").run_after > dt.datetime.now(dt.UTC) + dt.timedelta(seconds=500)
    # The same ID again is idempotent, as jobs.submit is.
    assert capi_check_order.apply_async(args=(2,), job_id="order-2").id == "order-2"
    assert testing.drain() == []  # none is due


def test_apply_async_joins_the_callers_transaction() -> None:
    rung: list[str] = []
    jobs.set_doorbell(rung.append)
    assert jobs.list_jobs() == []  # the job tables made, before the caller's write lock
    engine = default_app().runtime.engine
    with engine.connect() as conn:
        transaction = conn.begin()
        dropped = capi_check_order.apply_async(kwargs={"order_id": 1}, connection=conn)
        transaction.rollback()
    with pytest.raises(jobs.UnknownJob):
        jobs.get(dropped.id)
    with engine.begin() as conn:
        kept = capi_check_order.apply_async(kwargs={"order_id": 2}, connection=conn)
        assert rung == []  # not before the commit
    assert rung == [kept.id]
    assert kept.state == "PENDING"


def test_options_without_meaning_for_a_job_are_refused_by_name() -> None:
    with pytest.raises(InvalidInput, match="expires, link not supported"):
        capi_check_order.apply_async(kwargs={"order_id": 1}, expires=10, link=None)
    with pytest.raises(InvalidInput, match="inputs do not match"):
        capi_check_order.apply_async(kwargs={"order": 1})
    assert jobs.list_jobs() == []


def test_failure_retry_and_get_propagate() -> None:
    FAILS["left"] = 5
    result = capi_check_order.delay(order_id=9)
    testing.drain()
    assert result.state == "RETRY"  # the first attempt failed; it waits for its backoff
    assert result.job_state is State.QUEUED
    testing.wake(result.id)
    testing.drain()
    assert result.state == "FAILURE"
    assert result.failed()
    assert result.ready()
    with pytest.raises(JobFailure, match="order service down for 9"):
        result.get(timeout=5)
    returned = result.get(timeout=5, propagate=False)
    assert isinstance(returned, JobFailure)
    assert returned.job_id == result.id
    assert isinstance(result.result, JobFailure)


def test_get_times_out_with_celerys_error_and_sees_a_finish_from_elsewhere() -> None:
    result = capi_check_order.delay(order_id=3)
    with pytest.raises(celery_exceptions.TimeoutError):
        result.get(timeout=0.3, interval=0.05)
    runner = threading.Timer(0.3, testing.drain)
    runner.start()
    try:
        assert result.get(timeout=60, interval=0.05) == {"order": 3, "note": ""}
    finally:
        runner.join()


def test_waiting_approval_reads_as_started_and_revoke_cancels() -> None:
    result = capi_approval.delay()
    testing.drain()
    assert result.job_state is State.WAITING_APPROVAL
    assert result.state == "STARTED"
    assert not result.ready()
    result.revoke()
    assert result.state == "REVOKED"
    assert result.ready()
    assert not result.successful()
    with pytest.raises(celery_exceptions.TaskRevokedError):
        result.get(timeout=5)
    result.revoke()  # an ended job is left as it is, as Celery leaves a finished task


def test_signatures_spawn_and_map_children() -> None:
    parent = capi_fan.delay(ids=[1, 2])
    for _ in range(10):
        testing.drain()
    assert parent.get(timeout=5) == [
        {"order": 1, "note": "spawned"},
        [{"order": 1, "note": ""}, {"order": 2, "note": ""}],
        [{"order": 1, "note": ""}, {"order": 2, "note": ""}],
    ]


def test_mypy_checks_delay_against_the_functions_signature(tmp_path: Path) -> None:
    """The types follow the decorated function: a wrong keyword or a wrong type fails mypy."""
    checked = tmp_path / "uses_a_kind.py"
    checked.write_text(
        textwrap.dedent(
            """
            import jobs
            from jobs.results import JobResult

            @jobs.job("typed_check_order")
            def check_order(ctx: jobs.JobContext, order_id: int) -> dict[str, int]:
                return {"order": order_id}

            @jobs.job
            def bare(ctx: jobs.JobContext, text: str) -> str:
                return text

            good: JobResult[dict[str, int]] = check_order.delay(order_id=42)
            check_order.s(order_id=42)
            also: JobResult[str] = bare.delay(text="x")
            check_order.delay(order_idd=42)
            check_order.delay(order_id="42")
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(checked)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 2, done.stdout
    assert 'Unexpected keyword argument "order_idd"' in errors[0]
    assert 'incompatible type "str"; expected "int"' in errors[1]
