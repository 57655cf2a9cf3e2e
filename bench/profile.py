"""Where a durable job's time and round trips go, measured in-process on PostgreSQL.

The same :class:`jobs._worker.runner.Runner` a worker uses runs ``n`` jobs of a kind in this
process, with the store's calls timed and libpq's protocol trace on every connection of
its engine: the round trips are the flights (the server answering after the client sent;
``BEGIN`` and ``COMMIT`` count as their own; a claim sent in one pipeline with the
previous job's held completion counts once). Completions are held as a worker holds
them. Celery's own share comes from the plain side's drain in the same run (a no-op
task's cost per worker process).
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import event

import jobs
from jobs._core.heartbeat import LeaseHeartbeat
from jobs._store import JobStore
from jobs._store.db import make_engine
from jobs._store.deferred import hold_completions
from jobs._store.ownership import Ownership
from jobs._worker.liveness import LivenessLock
from jobs._worker.run_results import Outcome
from jobs._worker.runner import Runner
from jobs.application import default_app

TIMED = ("claim", "steps", "record_steps", "complete")


class TimedOwnership(Ownership):
    """The owner's writes of a run (``store.ownership``), adding up their wall time."""

    def __init__(self, store: JobStore, spent: defaultdict[str, float]) -> None:
        super().__init__(store.statements, store.workflows, store.max_payload_bytes)
        self.spent = spent

    def _timed(self, name: str, call: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return call()
        finally:
            self.spent[name] += time.perf_counter() - started

    def claim_on(self, *args: Any, **kwargs: Any) -> Any:  # what the runner calls
        return self._timed("claim", lambda: super(TimedOwnership, self).claim_on(*args, **kwargs))

    def record_steps(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(
            "record_steps", lambda: super(TimedOwnership, self).record_steps(*args, **kwargs)
        )

    def complete(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(
            "complete", lambda: super(TimedOwnership, self).complete(*args, **kwargs)
        )


class TimedStore(JobStore):
    """A store whose owner's writes add up the wall time of the calls a run makes (the
    store's parts are its own: the runner calls ``store.ownership``)."""

    def __init__(self, engine: Any, max_payload_bytes: int) -> None:
        super().__init__(engine, max_payload_bytes=max_payload_bytes)
        self.spent: defaultdict[str, float] = defaultdict(float)
        self.ownership = TimedOwnership(self, self.spent)


def _traced_engine(url: str, folder: Path) -> Any:
    engine = make_engine(url)

    @event.listens_for(engine, "connect")
    def _trace(dbapi_connection: Any, _record: Any) -> None:
        from psycopg import pq  # noqa: PLC0415

        handle = open(folder / f"{uuid.uuid4().hex}.trace", "w")  # noqa: SIM115 - lives with the connection
        dbapi_connection.pgconn.trace(handle.fileno())
        dbapi_connection.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        _trace.handles.append(handle)  # type: ignore[attr-defined]

    _trace.handles = []  # type: ignore[attr-defined]
    return engine


def _round_trips(folder: Path) -> int:
    """Flights on every traced connection: each time the server answers after the client
    sent, the client waited once (a pipeline of two statements, each with its Sync and its
    ``ReadyForQuery``, is one)."""
    count = 0
    for trace in folder.glob("*.trace"):
        with trace.open(errors="replace") as lines:
            previous = ""
            for line in lines:
                direction = line[:1]
                if direction == "B" and previous == "F":
                    count += 1
                if direction in ("B", "F"):
                    previous = direction
    return count


def profile_jobs(database_url: str, kind: str, n: int) -> dict[str, float]:
    """Run ``n`` jobs of ``kind`` in-process on PostgreSQL; per job: round trips, and the
    milliseconds spent in each store call and in the rest of the runner (Python)."""
    with tempfile.TemporaryDirectory(prefix="bench-trace-") as folder_name:
        folder = Path(folder_name)
        engine = _traced_engine(database_url, folder)
        store = TimedStore(engine, max_payload_bytes=default_app().settings.max_input_bytes)
        settings = default_app().settings
        heartbeat = LeaseHeartbeat(store, settings.lease_seconds)
        liveness = LivenessLock(database_url)
        runner = Runner.from_settings(
            store,
            f"bench-profile:{os.getpid()}",
            settings,
            heartbeat=heartbeat,
            liveness_key=liveness.ensure(),
        )
        hold_completions(
            store.statements, settings.hold_completion_seconds
        )  # as a pool process does
        tag = f"prof{uuid.uuid4().hex[:10]}"
        with default_app().runtime.doorbell_off():
            ids = jobs.submit_many(
                kind, [{}] * (n + 5), job_ids=[f"{tag}-{i}" for i in range(n + 5)]
            )
        for job_id in ids[:5]:  # warm: the pool's connections, statement caches
            runner.run(job_id)
        store.spent.clear()
        before = _round_trips(folder)
        started = time.perf_counter()
        for job_id in ids[5:]:
            if runner.run(job_id).outcome is not Outcome.COMPLETED:
                raise RuntimeError(f"profiled job {job_id} did not complete")
        total = time.perf_counter() - started
        store.flush_held()
        round_trips = _round_trips(folder) - before
        heartbeat.stop()
        liveness.release()
        engine.dispose()
    result = {"round trips": round_trips / n, "total ms": total / n * 1e3}
    for name in TIMED:
        result[f"{name} ms"] = store.spent[name] / n * 1e3
    result["runner python ms"] = result["total ms"] - sum(result[f"{name} ms"] for name in TIMED)
    return result
