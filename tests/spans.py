"""OpenTelemetry's SDK for the tracing tests: one in-memory exporter for this process (a
tracer provider can be set once per process), and spans read back from the JSON-lines file
a worker subprocess writes (tests/acceptance/traced_kinds.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_EXPORTER = InMemorySpanExporter()


def memory_exporter() -> InMemorySpanExporter:
    """This process's exporter, cleared; the global tracer provider is set on first use."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    return _EXPORTER


@dataclass(frozen=True)
class SpanRecord:
    """A finished span, as read from either exporter: ids in hex."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    attributes: dict[str, Any]
    events: list[str] = field(default_factory=list)
    status: str = "UNSET"
    status_description: str | None = None
    links: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, span: ReadableSpan) -> SpanRecord:
        """From the SDK's span."""
        context = span.get_span_context()
        assert context is not None
        return cls(
            span.name,
            format(context.trace_id, "032x"),
            format(context.span_id, "016x"),
            None if span.parent is None else format(span.parent.span_id, "016x"),
            dict(span.attributes or {}),
            [event.name for event in span.events],
            span.status.status_code.name,
            span.status.description,
            [format(link.context.span_id, "016x") for link in span.links],
        )

    def as_json(self) -> str:
        """One line of the worker's file."""
        return json.dumps(self.__dict__)


def finished(exporter: InMemorySpanExporter) -> list[SpanRecord]:
    """The exporter's spans, oldest end first."""
    return [SpanRecord.of(span) for span in exporter.get_finished_spans()]


def read_lines(path: Path) -> list[SpanRecord]:
    """The spans a worker wrote to ``path`` (none when it wrote nothing yet)."""
    if not path.exists():
        return []
    return [SpanRecord(**json.loads(line)) for line in path.read_text().splitlines() if line]


def hex_ids(span: trace.Span) -> tuple[str, str]:
    """(trace id, span id) of a live span, in hex."""
    context = span.get_span_context()
    return format(context.trace_id, "032x"), format(context.span_id, "016x")
