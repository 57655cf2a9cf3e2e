"""What tracing costs a worker: three-step jobs drained in-process by one runner (the
worker's code path without the broker), with tracing off, with the API but no SDK (every
span a no-op), and with the SDK exporting to memory (docs/guides/tracing.md, "Cost").

    python -m bench.tracing_cost --database-url postgresql+psycopg://…/scratch --jobs 2000

The database must be an empty scratch one: the job tables are created in it. Modes take
turns over several rounds, so a drifting machine skews them alike; the median per job is
printed, wall-clock and CPU. The SDK can be installed once per process, so the no-SDK mode
runs first.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable

from opentelemetry import trace

import bench.kinds  # bench_three
from jobs._core import tracing
from jobs._store import JobStore
from jobs._store.db import make_engine
from jobs._store.schema import upgrade
from jobs._worker.run_results import Outcome
from jobs._worker.runner import Runner
from jobs.application import default_app

REQUEST = trace.get_tracer("bench.request")


def submit(store: JobStore, count: int) -> list[str]:
    """``count`` QUEUED three-step jobs, submitted inside a request span."""
    with REQUEST.start_as_current_span("POST /bench"):
        rows = bench.kinds.queued(store, bench.kinds.THREE, count)
    return [str(row["id"]) for row in rows]


def drain_ms(store: JobStore, count: int) -> tuple[float, float]:
    """(Wall-clock, this process's CPU) milliseconds per job to run ``count`` fresh jobs
    to COMPLETED. The CPU figure leaves out waiting on the database (and other processes
    on a shared machine): it is what spans add to the worker's Python."""
    runner = Runner.from_settings(
        store, f"bench-tracing:{uuid.uuid4().hex[:6]}", default_app().settings
    )
    ids = submit(store, count)
    started, cpu = time.perf_counter(), time.process_time()
    for job_id in ids:
        if runner.run(job_id).outcome is not Outcome.COMPLETED:
            raise RuntimeError(f"job {job_id} did not complete")
    wall = (time.perf_counter() - started) / count * 1e3
    return wall, (time.process_time() - cpu) / count * 1e3


def main() -> None:
    """Print the median ms per job of each mode."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--jobs", type=int, default=500, help="jobs per mode per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    engine = make_engine(args.database_url)
    upgrade(engine)
    store = JobStore(engine)
    drain_ms(store, 50)  # warm: connections, statement caches
    timings: dict[str, list[tuple[float, float]]] = {
        "off": [],
        "api only": [],
        "sdk, in memory": [],
    }

    def mode(name: str, enabled: bool) -> Callable[[], None]:
        def run() -> None:
            tracing.ENABLED = enabled
            timings[name].append(drain_ms(store, args.jobs))

        return run

    for _round in range(args.rounds):
        mode("off", False)()
        mode("api only", True)()
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: PLC0415
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: PLC0415
        InMemorySpanExporter,
    )

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    for _round in range(args.rounds):
        mode("sdk, in memory", True)()
        exporter.clear()
        mode("off", False)()
    base_wall = statistics.median(wall for wall, _cpu in timings["off"])
    base_cpu = statistics.median(cpu for _wall, cpu in timings["off"])
    print(f"{'mode':16} {'wall ms/job':>12} {'vs off':>8} {'CPU ms/job':>11} {'vs off':>8}")
    for name, found in timings.items():
        wall = statistics.median(wall for wall, _cpu in found)
        cpu = statistics.median(cpu for _wall, cpu in found)
        print(
            f"{name:16} {wall:12.3f} {wall - base_wall:+8.3f} {cpu:11.3f} {cpu - base_cpu:+8.3f}"
            f"  ({len(found)} rounds)"
        )
    engine.dispose()


if __name__ == "__main__":
    main()
