"""Test-only job module for workers that export their spans (tests/acceptance/test_traces.py):
the check_order kinds, and, when ``TRACED_SPANS_FILE`` names a file, OpenTelemetry's SDK
writing each finished span to it as one JSON line (tests/spans.py reads them back), and
with ``TRACED_WITH_CELERY_INSTRUMENTATION`` Celery's own instrumentation too. Set in
``JOBS_IMPORTS``, so every process of the stack (workers, sweeper) imports it."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import jobs.examples.check_order  # noqa: F401  # the kinds
from tests.spans import SpanRecord

SPANS_FILE = "TRACED_SPANS_FILE"
# Set (to anything): opentelemetry-instrumentation-celery instruments the worker too.
WITH_CELERY = "TRACED_WITH_CELERY_INSTRUMENTATION"


class JsonLinesExporter(SpanExporter):
    """Appends each span to ``path`` as one JSON line, at once (a SIGKILL loses only the
    spans that had not ended)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(SpanRecord.of(span).as_json() + "\n" for span in spans)
        with self.lock, self.path.open("a") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS


if os.environ.get(SPANS_FILE):
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(JsonLinesExporter(Path(os.environ[SPANS_FILE])))
    )
    trace.set_tracer_provider(provider)
    if os.environ.get(WITH_CELERY):
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument()
