"""OpenTelemetry traces in-process (jobs._core.tracing, with the SDK's in-memory exporter):
a submit inside a request's span records its context in the job, and every run of the job
(first, retried, resumed after a sleep, taken back by the sweeper) continues that trace with
a span per run and a child span per step. Without the feature nothing is recorded."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import Engine, text

import jobs
from jobs import testing
from jobs._core import tracing
from jobs._core.context import JobContext
from jobs._store import JobStore
from jobs._sweeper.sweeper import sweep_once
from jobs._worker.run_results import Outcome
from jobs.application import default_app
from tests.spans import SpanRecord, finished, hex_ids, memory_exporter

CALLS: Counter[str] = Counter()
CRASH = {"now": False}
REQUEST = trace.get_tracer("tests.request")


@pytest.fixture(autouse=True)
def exporter() -> Iterator[InMemorySpanExporter]:
    CALLS.clear()
    CRASH["now"] = False
    found = memory_exporter()
    yield found
    CRASH["now"] = False


def counted(name: str, value: Any) -> Any:
    CALLS[name] += 1
    return value


@jobs.job("trace_order", max_attempts=3)
def trace_order(ctx: JobContext, order_id: int, fail_times: int = 0) -> dict[str, Any]:
    order = ctx.step("lookup", counted, "lookup", {"id": order_id})
    CALLS["attempt"] += 1
    if CALLS["attempt"] <= fail_times:
        raise ValueError(f"the payment service is down (attempt {CALLS['attempt']})")
    paid = ctx.step("pay", counted, "pay", True)
    return {"order": order["id"], "paid": paid}


@jobs.job("trace_nap")
def trace_nap(ctx: JobContext) -> str:
    ctx.step("before", counted, "before", 1)
    ctx.sleep("nap", 60)
    return str(ctx.step("after", counted, "after", "done"))


@jobs.job("trace_crashy")
def trace_crashy(ctx: JobContext) -> int:
    one = int(ctx.step("one", counted, "one", 1))
    if CRASH["now"]:
        raise SystemExit("the worker was killed")  # not an Exception: nothing is recorded
    return one + int(ctx.step("two", counted, "two", 2))


def refuse(why: str) -> None:
    raise ValueError(why)


@jobs.job("trace_step_fails", max_attempts=1)
def trace_step_fails(ctx: JobContext) -> None:
    ctx.step("charge", refuse, "card declined")


def submitted_in_request(kind: str, inputs: dict[str, Any]) -> tuple[str, str, str]:
    """Submit inside a request-like span; (job id, its trace id, its span id)."""
    with REQUEST.start_as_current_span("POST /orders") as request:
        job_id = jobs.submit(kind, inputs)
    trace_id, span_id = hex_ids(request)
    return job_id, trace_id, span_id


def named(spans: list[SpanRecord], prefix: str) -> list[SpanRecord]:
    return [span for span in spans if span.name.startswith(prefix)]


def test_a_submit_records_its_trace_and_the_run_continues_it(
    exporter: InMemorySpanExporter,
) -> None:
    job_id, trace_id, request_id = submitted_in_request("trace_order", {"order_id": 7})
    stored = jobs.get(job_id).trace_context
    assert stored is not None
    assert stored["traceparent"].split("-")[1:3] == [trace_id, request_id]
    [result] = testing.drain()
    assert result.outcome is Outcome.COMPLETED

    spans = finished(exporter)
    [run] = named(spans, "jobs.run")
    assert run.name == "jobs.run trace_order"
    assert (run.trace_id, run.parent_id) == (trace_id, request_id)
    assert run.attributes["jobs.job.id"] == job_id
    assert run.attributes["jobs.job.kind"] == "trace_order"
    assert run.attributes["jobs.attempt"] == 1
    assert run.attributes["jobs.fence"] == 1
    assert str(run.attributes["jobs.owner"]).startswith("inline@")
    assert run.attributes["jobs.outcome"] == "completed"
    assert run.status == "UNSET"
    steps = named(spans, "jobs.step")
    assert [step.attributes["jobs.step.name"] for step in steps] == ["lookup", "pay"]
    assert {(step.trace_id, step.parent_id) for step in steps} == {(trace_id, run.span_id)}
    assert [step.attributes["jobs.step.replayed"] for step in steps] == [False, False]


def test_a_retry_fails_its_span_and_the_next_attempt_replays_in_the_same_trace(
    exporter: InMemorySpanExporter,
) -> None:
    job_id, trace_id, request_id = submitted_in_request(
        "trace_order", {"order_id": 8, "fail_times": 1}
    )
    [first] = testing.drain()
    assert first.outcome is Outcome.RETRYING
    testing.wake(job_id)
    [second] = testing.drain()
    assert second.outcome is Outcome.COMPLETED

    spans = finished(exporter)
    runs = named(spans, "jobs.run")
    assert [run.attributes["jobs.attempt"] for run in runs] == [1, 2]
    assert {(run.trace_id, run.parent_id) for run in runs} == {(trace_id, request_id)}
    failed, completed = runs
    assert failed.status == "ERROR"
    assert "the payment service is down (attempt 1)" in (failed.status_description or "")
    assert failed.attributes["jobs.outcome"] == "retrying"
    assert "jobs.retry" in failed.events
    assert completed.status == "UNSET"
    steps = [
        (step.parent_id, step.attributes["jobs.step.name"], step.attributes["jobs.step.replayed"])
        for step in named(spans, "jobs.step")
    ]
    assert steps == [
        (failed.span_id, "lookup", False),
        (completed.span_id, "lookup", True),
        (completed.span_id, "pay", False),
    ]


def test_an_exhausted_job_ends_with_an_error_status(exporter: InMemorySpanExporter) -> None:
    job_id, trace_id, _ = submitted_in_request("trace_order", {"order_id": 9, "fail_times": 5})
    for _attempt in range(3):
        testing.wake(job_id)
        testing.drain()
    assert jobs.get(job_id).state is jobs.State.FAILED
    last = named(finished(exporter), "jobs.run")[-1]
    assert last.trace_id == trace_id
    assert last.attributes["jobs.outcome"] == "failed"
    assert last.status == "ERROR"
    assert "ValueError: the payment service is down (attempt 3)" in str(last.status_description)


def test_a_step_that_raises_records_the_exception_on_its_span(
    exporter: InMemorySpanExporter,
) -> None:
    submitted_in_request("trace_step_fails", {})
    [result] = testing.drain()
    assert result.outcome is Outcome.FAILED
    spans = finished(exporter)
    [step] = named(spans, "jobs.step")
    [run] = named(spans, "jobs.run")
    assert step.parent_id == run.span_id
    assert (step.status, step.events) == ("ERROR", ["exception"])
    assert (run.status, run.status_description) == ("ERROR", "ValueError: card declined")


def test_a_job_submitted_outside_a_span_runs_under_the_current_one(
    exporter: InMemorySpanExporter,
) -> None:
    """No submit context: the run is a child of whatever is current (Celery's task span)."""
    job_id = jobs.submit("trace_order", {"order_id": 14})
    with REQUEST.start_as_current_span("run/jobs.trace_order") as celery_task:
        testing.run(job_id)
    [run] = named(finished(exporter), "jobs.run")
    assert (run.trace_id, run.parent_id) == hex_ids(celery_task)
    assert run.links == []


def test_a_sleep_is_an_event_and_the_resumed_run_replays_the_timer(
    exporter: InMemorySpanExporter,
) -> None:
    job_id, trace_id, request_id = submitted_in_request("trace_nap", {})
    assert [result.outcome for result in testing.drain()] == [Outcome.SLEEPING]
    testing.wake(job_id)
    assert [result.outcome for result in testing.drain()] == [Outcome.COMPLETED]

    spans = finished(exporter)
    asleep, awake = named(spans, "jobs.run")
    assert "jobs.sleep" in asleep.events
    assert asleep.attributes["jobs.outcome"] == "sleeping"
    assert {asleep.parent_id, awake.parent_id} == {request_id}
    assert {asleep.trace_id, awake.trace_id} == {trace_id}
    replayed = [
        (step.attributes["jobs.step.name"], step.attributes["jobs.step.replayed"])
        for step in named(spans, "jobs.step")
        if step.parent_id == awake.span_id
    ]
    assert replayed == [("before", True), ("nap", True), ("after", False)]


def test_the_sweepers_recovery_is_a_span_in_the_jobs_trace(
    exporter: InMemorySpanExporter,
) -> None:
    app = default_app()
    app.reset_settings()
    app.set_settings(dataclasses.replace(app.settings, lease_seconds=0.2))
    job_id, trace_id, request_id = submitted_in_request("trace_crashy", {})
    CRASH["now"] = True
    with pytest.raises(SystemExit):
        testing.make_runner(heartbeat=False).run(job_id)
    CRASH["now"] = False
    time.sleep(0.25)
    runtime = app.runtime
    report = sweep_once(runtime.store, runtime.settings, lambda batch: True)
    assert job_id in (*report.expired, *report.dead_owner)
    [result] = testing.drain()
    assert result.outcome is Outcome.COMPLETED

    spans = finished(exporter)
    [recovery] = named(spans, "jobs.recover")
    assert recovery.trace_id == trace_id
    assert recovery.parent_id == request_id
    assert recovery.attributes["jobs.job.id"] == job_id
    assert recovery.attributes["jobs.state"] == "QUEUED"
    assert recovery.attributes["jobs.recovery"] in ("expired_lease", "dead_owner")
    # The crashed run's span never ended (like a killed worker's); its first step did.
    crashed, rerun = named(spans, "jobs.run")
    assert crashed.attributes["jobs.attempt"] == 1
    assert rerun.attributes["jobs.attempt"] == 2
    assert {span.trace_id for span in spans if span.name.startswith("jobs.")} == {trace_id}


def test_a_celery_task_span_of_the_same_trace_is_the_runs_parent(
    exporter: InMemorySpanExporter,
) -> None:
    """opentelemetry-instrumentation-celery's task span, current while the task runs and a
    child of the publish (in the submit's trace): the run nests under it, no second parent."""
    with REQUEST.start_as_current_span("POST /orders") as request:
        job_id = jobs.submit("trace_order", {"order_id": 10})
        with REQUEST.start_as_current_span("run/jobs.run") as celery_task:
            testing.run(job_id)
    [run] = named(finished(exporter), "jobs.run")
    assert (run.trace_id, run.parent_id) == hex_ids(celery_task)
    assert run.trace_id == hex_ids(request)[0]
    assert run.links == []


def test_a_span_of_another_trace_is_a_link_and_the_run_stays_in_the_submits_trace(
    exporter: InMemorySpanExporter,
) -> None:
    """A doorbell rung by the sweeper carries no context: Celery's task span starts a trace
    of its own; the run stays in the submit's trace and links to it."""
    job_id, trace_id, request_id = submitted_in_request("trace_order", {"order_id": 11})
    with REQUEST.start_as_current_span("run/jobs.run") as celery_task:
        testing.run(job_id)
    [run] = named(finished(exporter), "jobs.run")
    assert (run.trace_id, run.parent_id) == (trace_id, request_id)
    assert run.links == [hex_ids(celery_task)[1]]


def test_a_submit_outside_any_span_records_nothing_and_its_run_starts_a_trace(
    exporter: InMemorySpanExporter,
) -> None:
    job_id = jobs.submit("trace_order", {"order_id": 12})
    assert jobs.get(job_id).trace_context is None
    testing.drain()
    [run] = named(finished(exporter), "jobs.run")
    assert run.parent_id is None


def test_an_unreadable_stored_context_starts_a_new_trace(
    exporter: InMemorySpanExporter,
) -> None:
    """A carrier that is not a W3C context (written by hand, or by another propagator) does
    not fail the run: the run starts a trace of its own."""
    job_id = jobs.submit("trace_order", {"order_id": 15})
    with default_app().runtime.store.engine.begin() as conn:
        conn.execute(
            text("UPDATE jobs SET trace_context = :junk WHERE id = :id"),
            {"junk": '{"traceparent": "not-a-traceparent", "tracestate": 12}', "id": job_id},
        )
    assert jobs.get(job_id).trace_context == {"traceparent": "not-a-traceparent", "tracestate": 12}
    [result] = testing.drain()
    assert result.outcome is Outcome.COMPLETED
    [run] = named(finished(exporter), "jobs.run")
    assert run.parent_id is None
    assert tracing.context_of({"traceparent": 12}) is None


def test_off_records_nothing(
    exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracing, "ENABLED", False)
    job_id, _, _ = submitted_in_request("trace_order", {"order_id": 13})
    assert jobs.get(job_id).trace_context is None
    testing.drain()
    assert [span.name for span in finished(exporter)] == ["POST /orders"]


@pytest.mark.parametrize("database", ["postgresql"], indirect=True)
def test_a_batch_on_postgresql_stores_the_context_as_json(store: JobStore, engine: Engine) -> None:
    """The batch insert (one array per column, unnested) keeps the context JSON, and a
    submit without one leaves the column NULL (not JSON null)."""
    with REQUEST.start_as_current_span("POST /batch") as request:
        rows = [
            store.submissions.new_job_values(
                "trace_order",
                {"order_id": index},
                job_id=f"batch-{index}",
                max_attempts=1,
                delay_seconds=0,
                code_version=None,
            )
            for index in range(3)
        ]
        store.submissions.create_many("trace_order", rows)
    store.submissions.create("trace_order", {"order_id": 99}, job_id="plain", max_attempts=1)
    with engine.connect() as conn:
        found: dict[str, str | None] = dict(
            conn.execute(
                text("SELECT id, trace_context->>'traceparent' FROM jobs ORDER BY id")
            ).all()
        )
        nulls = conn.execute(text("SELECT count(*) FROM jobs WHERE trace_context IS NULL"))
        assert nulls.scalar_one() == 1
    trace_id = hex_ids(request)[0]
    assert found.pop("plain") is None
    assert {job_id: str(value).split("-")[1] for job_id, value in found.items()} == {
        f"batch-{index}": trace_id for index in range(3)
    }
    assert store.reads.get("batch-0").trace_context == rows[0]["trace_context"]
