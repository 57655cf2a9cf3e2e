"""``python -m bench.sizing``: the figures deploy/SIZING.md quotes.

1. Connections: one ``jobctl worker`` (prefork, ``-c`` processes) and one ``jobctl sweeper``
   against a throwaway PostgreSQL database and a private queue on RabbitMQ run a batch of
   one-step jobs; the open TCP connections of each process to PostgreSQL and RabbitMQ are
   sampled every 50 ms, and the most seen at once is reported per process. Then the same
   worker drains ``--drain-jobs`` jobs queued at once: jobs/s, and jobs per CPU-second of
   the PostgreSQL backends serving the run's database (the ceiling per PostgreSQL core).
2. The sweeper's cost per pass: ``sweep_once`` (dead owners, expired leases, due
   doorbells) on a database holding N QUEUED jobs (sent, not due to ring again) and R
   RUNNING ones under live leases, median of 7 passes, for growing N and R.

Environment: ``JOBS_TEST_POSTGRES_URL`` / ``JOBS_TEST_AMQP_URL`` as for the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from bench.kinds import STEP
from bench.services import pg_database

PG_URL = os.environ.get("JOBS_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
AMQP_URL = os.environ.get("JOBS_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
REPO = Path(__file__).resolve().parent.parent


def _ports(url: str, default: int) -> int:
    hostport = url.split("@", 1)[-1].split("/", 1)[0]
    return int(hostport.rpartition(":")[2] or default) if ":" in hostport else default


def _count(pid: int, ports: dict[int, str]) -> dict[tuple[str, str], int]:
    """(role, service) -> open connections of ``pid`` and its children."""
    seen: Counter[tuple[str, str]] = Counter()
    try:
        root = psutil.Process(pid)
        family = [(root, "main"), *((child, "pool child") for child in root.children())]
    except psutil.NoSuchProcess:
        return {}
    for proc, role in family:
        try:
            conns = proc.net_connections(kind="tcp")
        except psutil.Error:
            continue
        per_service: Counter[str] = Counter(
            ports[c.raddr.port] for c in conns if c.raddr and c.raddr.port in ports
        )
        for service, n in per_service.items():
            key = (role, service)
            seen[key] = max(seen[key], n)
    return dict(seen)


def _backend_cpu_seconds(database: str) -> float:
    """CPU seconds used so far by the PostgreSQL backends serving ``database`` (their
    command line names it), so other databases on a shared server do not count."""
    total = 0.0
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if cmdline.startswith("postgres:") and f" {database} " in cmdline:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
    return total


def drain(api: Any, database_url: str, count: int, concurrency: int) -> None:
    """``count`` one-step jobs queued in one ``submit_many``; the running worker drains
    them. Reports jobs/s and jobs per PostgreSQL CPU-second of this database's backends
    (backends that end during the run are missed: an under-estimate of CPU, so the
    per-core figure is an upper bound)."""
    from sqlalchemy.engine import make_url  # noqa: PLC0415

    database = make_url(database_url).database or ""
    from jobs.application import default_app  # noqa: PLC0415

    store = default_app().runtime.store
    cpu_before = _backend_cpu_seconds(database)
    started = time.monotonic()
    ids = api.submit_many(STEP, [{} for _ in range(count)])
    deadline = started + 300
    while time.monotonic() < deadline:
        last_done = all(store.reads.get(job_id).state.value == "COMPLETED" for job_id in ids[-10:])
        if last_done and all(store.reads.get(job_id).state.value == "COMPLETED" for job_id in ids):
            break
        time.sleep(0.1)
    seconds = time.monotonic() - started
    cpu = _backend_cpu_seconds(database) - cpu_before
    print(
        f"drain: {count} one-step jobs, -c {concurrency}: {count / seconds:.0f} jobs/s; "
        f"PostgreSQL backends used {cpu / seconds:.2f} cores "
        f"= {count / cpu:.0f} jobs per PostgreSQL CPU-second"
    )


def connections(concurrency: int, jobs_count: int, drain_jobs: int) -> None:
    ports = {_ports(PG_URL, 5432): "PostgreSQL", _ports(AMQP_URL, 5672): "RabbitMQ"}
    with pg_database(PG_URL) as database_url, tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBS_")}
        env.update(
            JOBS_DATABASE_URL=database_url,
            JOBS_BROKER_URL=AMQP_URL,
            JOBS_QUEUE=f"sizing-{uuid.uuid4().hex[:8]}",
            JOBS_IMPORTS="bench.kinds",
            JOBS_DATA_DIR=tmp,
            PYTHONPATH=str(REPO),
        )
        subprocess.run(
            [sys.executable, "-m", "jobs", "db", "upgrade"], env=env, check=True, cwd=REPO
        )
        logs = Path(tmp)
        procs = {
            "worker": subprocess.Popen(
                [sys.executable, "-m", "jobs", "worker", "-P", "prefork", "-c", str(concurrency),
                 "--hostname", f"sizing-{uuid.uuid4().hex[:6]}@%h"],
                env=env, cwd=REPO, stdout=(logs / "worker.log").open("wb"),
                stderr=subprocess.STDOUT, start_new_session=True,
            ),
            "sweeper": subprocess.Popen(
                [sys.executable, "-m", "jobs", "sweeper"],
                env=env, cwd=REPO, stdout=(logs / "sweeper.log").open("wb"),
                stderr=subprocess.STDOUT, start_new_session=True,
            ),
        }  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while " ready." not in (logs / "worker.log").read_text(errors="replace"):
                if time.monotonic() > deadline:
                    raise SystemExit("worker not ready:\n" + (logs / "worker.log").read_text())
                time.sleep(0.1)
            os.environ.update({k: v for k, v in env.items() if k.startswith("JOBS_")})
            import jobs  # noqa: PLC0415
            from jobs.application import default_app  # noqa: PLC0415

            default_app().reset_settings()
            jobs.reset()
            ids = [jobs.submit(STEP, {}) for _ in range(jobs_count)]

            store = default_app().runtime.store
            most: dict[str, Counter[tuple[str, str]]] = {name: Counter() for name in procs}
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                for name, popen in procs.items():
                    for key, n in _count(popen.pid, ports).items():
                        most[name][key] = max(most[name][key], n)
                if all(store.reads.get(job_id).state.value == "COMPLETED" for job_id in ids[-5:]):
                    break
                time.sleep(0.05)
            print(f"connections, most open at once ({jobs_count} one-step jobs, -c {concurrency}):")
            for name, seen in most.items():
                for (role, service), n in sorted(seen.items()):
                    print(f"  {name:8} {role:10} {service:10} {n}")
            drain(jobs, database_url, drain_jobs, concurrency)
        finally:
            for popen in procs.values():
                with_group(popen)


def with_group(popen: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, SIGKILL it if it is still there after 20 s."""
    try:
        os.killpg(popen.pid, signal.SIGTERM)
        popen.wait(20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(10)


def sweeper_cost(sizes: list[tuple[int, int]]) -> None:
    from jobs._config.settings import from_env  # noqa: PLC0415
    from jobs._store import JobStore  # noqa: PLC0415
    from jobs._store.db import make_engine  # noqa: PLC0415
    from jobs._store.schema import upgrade  # noqa: PLC0415
    from jobs._sweeper.sweeper import sweep_once  # noqa: PLC0415

    print("sweeper pass (median of 7, no publishes due): QUEUED, RUNNING -> ms")
    for queued, running in sizes:
        with pg_database(PG_URL) as database_url:
            engine = make_engine(database_url)
            upgrade(engine)
            store = JobStore(engine)
            for n in range(queued + running):
                store.submissions.create(STEP, {}, job_id=f"s-{n}", max_attempts=3)
            for n in range(running):
                store.ownership.claim(f"s-{n}", f"owner-{n % 20}:1", 600)
            settings = from_env(
                {
                    "JOBS_DATABASE_URL": database_url,
                    "JOBS_DATA_DIR": tempfile.gettempdir(),
                    "JOBS_RING_AGAIN_AFTER_SECONDS": "3600",  # creating them takes a while
                }
            )
            times = []
            for _ in range(7):
                started = time.perf_counter()
                report = sweep_once(store, settings, lambda _batch: True)
                times.append((time.perf_counter() - started) * 1000)
                assert not report, report
            engine.dispose()
            print(f"  {queued:>7} {running:>7} -> {statistics.median(times):8.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sizing", description=__doc__)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--drain-jobs", type=int, default=3000)
    parser.add_argument("--skip-connections", action="store_true")
    parser.add_argument("--skip-sweeper", action="store_true")
    args = parser.parse_args(argv)
    if not args.skip_connections:
        connections(args.concurrency, args.jobs, args.drain_jobs)
    if not args.skip_sweeper:
        sweeper_cost([(1000, 0), (1000, 200), (10000, 0), (10000, 2000)])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
