"""OpenTelemetry traces, when ``opentelemetry-api`` is installed (the ``tracing`` extra).

A submit records the current trace context (W3C ``traceparent``/``tracestate``, through
the propagator API) in the job's ``trace_context`` column; each run of the job continues
that trace: a ``jobs.run`` span per delivery, whose parent is the submit's span, with a
child span per step (``jobs.step.replayed`` says whether its output came from the record),
events for its waits, and its outcome. The sweeper's recoveries are short spans in the same
trace. See docs/guides/tracing.md.

Without the package (or with ``OTEL_SDK_DISABLED=true``) :data:`ENABLED` is False and
every caller checks it before calling anything here: the hot path pays one global read.
With the API but no SDK configured the spans are OpenTelemetry's no-op spans and
nothing is recorded (an invalid context injects nothing).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

try:  # guarded once: the hot path reads ENABLED, never retries the import
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, Status, StatusCode
except ImportError:  # pragma: no cover - the package is optional
    AVAILABLE = False
else:
    AVAILABLE = True

#: Whether jobs record and continue traces in this process: the API is importable and
#: ``OTEL_SDK_DISABLED`` is not ``true``. Tests may set it False to see the untraced path.
ENABLED: bool = AVAILABLE and os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() != "true"

#: The instrumentation scope of every span jobs makes.
TRACER_NAME = "jobs"

#: The keys of a stored trace context (what the W3C propagator writes).
CARRIER_KEYS = ("traceparent", "tracestate")


_TRACER: Any = None


def _tracer() -> Any:
    # Made once: before an SDK provider is set, trace.get_tracer returns a proxy that
    # turns into the provider's tracer once one is (a worker's setup after this import).
    global _TRACER  # noqa: PLW0603
    if _TRACER is None:
        _TRACER = trace.get_tracer(TRACER_NAME)
    return _TRACER


def carrier() -> dict[str, str] | None:
    """The current trace context as a JSON-ready ``{"traceparent": …, "tracestate": …}``,
    or None when there is none to record (no active, sampled-or-not valid span)."""
    if not ENABLED:
        return None
    found: dict[str, str] = {}
    propagate.inject(found)
    kept = {key: value for key, value in found.items() if key in CARRIER_KEYS}
    return kept or None


def context_of(stored: Mapping[str, Any] | None) -> Context | None:
    """The parent context a stored carrier names, or None (none stored, or unreadable:
    a malformed carrier starts a new trace rather than failing the run)."""
    if not ENABLED or not stored or not isinstance(stored, Mapping):
        return None
    text = {key: value for key, value in stored.items() if isinstance(value, str)}
    extracted = propagate.extract(text)
    if not trace.get_current_span(extracted).get_span_context().is_valid:
        return None
    return extracted


def _parent_and_links(stored: Mapping[str, Any] | None) -> tuple[Context | None, list[Any]]:
    """The run span's parent and links: the submit's context is the parent, unless a
    span is already current in the same trace (Celery's task span, from
    ``opentelemetry-instrumentation-celery``, when the doorbell carried the submit's
    context): then that span is the parent. A current span of another trace (a doorbell
    rung by the sweeper, whose publish had no context) becomes a link, so the run stays
    in the submit's trace."""
    submitted = context_of(stored)
    current = trace.get_current_span().get_span_context()
    if submitted is None:
        return None, []  # the current context, whatever it is
    submit_span = trace.get_current_span(submitted).get_span_context()
    if current.is_valid and current.trace_id == submit_span.trace_id:
        return None, []
    links = [Link(current, {"jobs.link": "delivery"})] if current.is_valid else []
    return submitted, links


@contextmanager
def run_span(
    stored: Mapping[str, Any] | None,
    *,
    job_id: str,
    kind: str,
    attempt: int,
    owner: str,
    fence: int,
) -> Iterator[Span]:
    """The ``jobs.run`` span of one claimed delivery, current while the handler runs."""
    parent, links = _parent_and_links(stored)
    attributes = {
        "jobs.job.id": job_id,
        "jobs.job.kind": kind,
        "jobs.attempt": attempt,
        "jobs.owner": owner,
        "jobs.fence": fence,
    }
    with _tracer().start_as_current_span(
        f"jobs.run {kind}",
        context=parent,
        links=links,
        attributes=attributes,
        kind=trace.SpanKind.CONSUMER,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


@contextmanager
def step_span(name: str) -> Iterator[Span]:
    """A ``jobs.step`` span around a step's function (``jobs.step.replayed`` False); an
    exception from the function is recorded on it with status ERROR, and raised."""
    with _tracer().start_as_current_span(
        f"jobs.step {name}", attributes={"jobs.step.name": name, "jobs.step.replayed": False}
    ) as span:
        yield span


def replayed_step(name: str) -> None:
    """A zero-length ``jobs.step`` span for a step whose recorded output was returned."""
    span = _tracer().start_span(
        f"jobs.step {name}", attributes={"jobs.step.name": name, "jobs.step.replayed": True}
    )
    span.end()


def event(name: str, **attributes: Any) -> None:
    """An event on the current span (a wait, a sleep, a retry); None values left out."""
    trace.get_current_span().add_event(
        name, {key: value for key, value in attributes.items() if value is not None}
    )


def outcome(span: Span, outcome_name: str, error: str | None) -> None:
    """Set the run's outcome on its span: ``jobs.outcome``, and status ERROR with the
    error for a failed or retried attempt."""
    span.set_attribute("jobs.outcome", outcome_name)
    if error is not None:
        span.set_attribute("jobs.error", error)
        span.set_status(Status(StatusCode.ERROR, error))


def recovery(stored: Mapping[str, Any] | None, what: str, **attributes: Any) -> None:
    """A short ``jobs.recover`` span in the job's trace for a sweeper recovery (an
    expired lease or a dead owner's job taken back): its attributes say which job and how."""
    span = _tracer().start_span(
        f"jobs.recover {what}",
        context=context_of(stored),
        attributes={
            "jobs.recovery": what,
            **{key: value for key, value in attributes.items() if value is not None},
        },
    )
    span.end()
