"""The plain-Celery side: ``celery -A bench.plain_app worker``.

Its configuration arrives in ``$BENCH_PLAIN_CONFIG`` as JSON, produced by the bench from
``jobs.celery_app.celery_config`` for the same broker, so both sides run with identical
settings (acks_late, prefetch 1, reject_on_worker_lost, JSON, events, confirm_publish)
without this module importing the durable runtime (whose worker signals it would inherit).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from celery import Celery

from bench import marks
from bench.agent_shape import MODEL_SECONDS, TOOL_SECONDS

CONFIG_ENV = "BENCH_PLAIN_CONFIG"
# A result backend for the chord of the fan-out scenario (bench.fanout); unset elsewhere.
RESULT_BACKEND_ENV = "BENCH_RESULT_BACKEND"
NOOP = "bench.noop"
AGENT = "bench.agent"
HOLD = "bench.hold"
CHORD_MEMBER = "bench.chord_member"
CHORD_DONE = "bench.chord_done"

QUEUES_KEY = "bench_task_queues"


def as_json(config: dict[str, Any]) -> dict[str, Any]:
    """The configuration as JSON: the declared queues (kombu objects) as their name and
    arguments, rebuilt by :func:`from_json` on the worker's side."""
    plain = dict(config)
    queues = plain.pop("task_queues", None) or []
    plain[QUEUES_KEY] = [
        {"name": queue.name, "arguments": queue.queue_arguments} for queue in queues
    ]
    return plain


def from_json(config: dict[str, Any]) -> dict[str, Any]:
    from kombu import Queue  # noqa: PLC0415

    rebuilt = dict(config)
    queues = rebuilt.pop(QUEUES_KEY, [])
    if queues:
        rebuilt["task_queues"] = [
            Queue(
                q["name"],
                exchange=q["name"],
                routing_key=q["name"],
                queue_arguments=q["arguments"],
                durable=True,
            )
            for q in queues
        ]
    return rebuilt


app = Celery("bench_plain", set_as_current=False)
app.conf.update(from_json(json.loads(os.environ.get(CONFIG_ENV) or "{}")))
if os.environ.get(RESULT_BACKEND_ENV):
    app.conf.update(result_backend=os.environ[RESULT_BACKEND_ENV], result_expires=600)


@app.task(name=NOOP, bind=True, ignore_result=True)  # type: ignore[untyped-decorator]
def noop(self: Any, tag: str) -> None:
    """The trivial task: its only work is the completion mark."""
    marks.record("done", tag, getattr(self.request, "hostname", None) or "-")


@app.task(name=AGENT, bind=True, ignore_result=True)  # type: ignore[untyped-decorator]
def agent(self: Any, tag: str) -> None:
    """The agent-shaped job's sleeps (bench.pools) in one task, then the completion mark."""
    time.sleep(MODEL_SECONDS)
    time.sleep(TOOL_SECONDS)
    marks.record("done", tag, getattr(self.request, "hostname", None) or "-")


@app.task(name=HOLD, bind=True, ignore_result=True)  # type: ignore[untyped-decorator]
def hold(self: Any, tag: str, release: str, limit: float = 120.0) -> None:
    """Mark the start, then wait until the bench creates ``release`` (recovery runs)."""
    host = getattr(self.request, "hostname", None) or "-"
    marks.record("start", tag, host)
    deadline = time.monotonic() + limit
    while not Path(release).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    marks.record("done", tag, host)


@app.task(name=CHORD_MEMBER)  # type: ignore[untyped-decorator]
def chord_member() -> None:
    """A chord's no-op member: its (empty) result is stored in the result backend."""


@app.task(name=CHORD_DONE, bind=True)  # type: ignore[untyped-decorator]
def chord_done(self: Any, results: list[Any], tag: str) -> int:
    """A chord's callback: marks the chord's end once every member's result is in."""
    marks.record("done", tag, getattr(self.request, "hostname", None) or "-")
    return len(results)
