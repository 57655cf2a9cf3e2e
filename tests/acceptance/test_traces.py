"""One trace from a request to every step of its job, through a SIGKILL of the real
``celery worker`` that ran it and the takeover by another (PostgreSQL + RabbitMQ).

The test process submits inside a request-like span (the SDK's in-memory exporter); the
workers and the sweeper import tests/acceptance/traced_kinds.py, which writes their spans
to a JSON-lines file. The killed worker's run span never ends (it is lost with the
process), but the step it finished was exported; the survivor's run continues the same
trace, as a child of the request's span, replaying that step."""

from __future__ import annotations

import pytest
from opentelemetry import trace

from jobs._core.states import State
from tests.acceptance.conftest import KINDS, PG_RABBITMQ, Stack, wait_until
from tests.acceptance.test_crash import victim_in_second_step
from tests.spans import SpanRecord, hex_ids, memory_exporter, read_lines

pytestmark = pytest.mark.acceptance

TRACED_KINDS = "tests.acceptance.traced_kinds"


@pytest.mark.parametrize("pool", ["solo", "prefork"])
@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_one_trace_links_the_request_to_every_step_across_a_sigkill(
    stack: Stack, pool: str
) -> None:
    memory_exporter()  # this process's provider: the submit's span is a real one
    spans_file = stack.root / f"spans-{pool}.jsonl"
    stack.configure(JOBS_IMPORTS=f"{KINDS},{TRACED_KINDS}")
    env = {"TRACED_SPANS_FILE": str(spans_file)}
    workers = [
        stack.worker("A", pool=pool, env=env, wait=False),
        stack.worker("B", pool=pool, env=env, wait=False),
    ]
    stack.sweeper(env)
    for worker in workers:
        worker.wait_ready()
    with trace.get_tracer("tests.request").start_as_current_span("POST /orders") as request:
        job_id = stack.submit("check_order", {"order_id": 42, "check_seconds": 3.0})
    trace_id, request_id = hex_ids(request)

    victim = victim_in_second_step(stack, job_id, workers)
    survivor = next(worker for worker in workers if worker is not victim)
    victim.kill()
    victim.popen.wait(10)
    job = stack.wait_state(job_id, timeout=60)
    assert job.state is State.COMPLETED, job
    assert survivor.owns(job.owner)

    def exported() -> list[SpanRecord] | None:
        spans = read_lines(spans_file)
        ran = [s for s in spans if s.name.startswith("jobs.run")]
        return spans if any(r.attributes.get("jobs.outcome") == "completed" for r in ran) else None

    spans = wait_until(exported, 10, "the survivor's run span to be exported")
    ours = [span for span in spans if span.attributes.get("jobs.job.id", job_id) == job_id]
    assert {span.trace_id for span in ours} == {trace_id}, ours

    runs = [span for span in ours if span.name == "jobs.run check_order"]
    # The victim's run span died with it; the survivor's is the request's child.
    [run] = runs
    assert run.parent_id == request_id
    assert survivor.owns(str(run.attributes["jobs.owner"]))
    assert run.attributes["jobs.fence"] == job.fence
    assert run.attributes["jobs.attempt"] == job.attempts
    assert run.attributes["jobs.outcome"] == "completed"

    steps = [
        (span.attributes["jobs.step.name"], span.attributes["jobs.step.replayed"], span.parent_id)
        for span in ours
        if span.name.startswith("jobs.step")
    ]
    [(_, _, victims_run)] = [step for step in steps if step[2] != run.span_id]
    assert victims_run not in {span.span_id for span in ours}  # never ended, never exported
    assert steps == [
        ("lookup_order", False, victims_run),  # by the victim, before the kill
        ("lookup_order", True, run.span_id),  # replayed by the survivor
        ("check_payment", False, run.span_id),  # run again: it had no record
    ]
    recoveries = [span for span in ours if span.name.startswith("jobs.recover")]
    requeued = [
        t
        for t in stack.history(job_id)
        if (t.from_state, t.to_state)
        == (
            State.RUNNING,
            State.QUEUED,
        )
    ]
    # The sweeper's re-queue of the dead owner's job (when it, not the survivor's own
    # claim from RUNNING, took the job back) is a span in the same trace.
    assert len(recoveries) == len(requeued), (recoveries, requeued)
    for recovery in recoveries:
        assert recovery.parent_id == request_id
        assert recovery.attributes["jobs.recovery"] == "dead_owner"


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_beside_celerys_instrumentation_the_run_links_its_task_span(stack: Stack) -> None:
    """With opentelemetry-instrumentation-celery in the worker, Celery's task span (a trace
    of its own: a doorbell carries no trace headers) is current while the job runs; the
    run span keeps the submit's span as its only parent and links to Celery's."""
    pytest.importorskip("opentelemetry.instrumentation.celery")
    memory_exporter()
    spans_file = stack.root / "spans-celery.jsonl"
    stack.configure(JOBS_IMPORTS=f"{KINDS},{TRACED_KINDS}")
    env = {"TRACED_SPANS_FILE": str(spans_file), "TRACED_WITH_CELERY_INSTRUMENTATION": "1"}
    stack.worker("A", env=env)
    with trace.get_tracer("tests.request").start_as_current_span("POST /orders") as request:
        job_id = stack.submit("check_order", {"order_id": 43, "check_seconds": 0.1})
    trace_id, request_id = hex_ids(request)
    assert stack.wait_state(job_id, timeout=60).state is State.COMPLETED

    def exported() -> list[SpanRecord] | None:
        spans = read_lines(spans_file)
        names = {span.name for span in spans}
        return spans if {"jobs.run check_order", "run/jobs.check_order"} <= names else None

    spans = wait_until(exported, 10, "the run's and Celery's task spans to be exported")
    [run] = [span for span in spans if span.name == "jobs.run check_order"]
    [celery_task] = [span for span in spans if span.name == "run/jobs.check_order"]
    assert (run.trace_id, run.parent_id) == (trace_id, request_id)
    assert celery_task.trace_id != trace_id
    assert run.links == [celery_task.span_id]
    steps = [span for span in spans if span.name.startswith("jobs.step")]
    assert {(span.trace_id, span.parent_id) for span in steps} == {(trace_id, run.span_id)}
