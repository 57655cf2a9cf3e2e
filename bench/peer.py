"""The peer in the bench: procrastinate (3.x), a Python and PostgreSQL job queue users pick
instead of durable jobs, drained back to back with ours on the same database server.

Same shape as the durable drain (:mod:`bench.drain`): ``n`` one-step no-op jobs are
deferred in bulk while no worker runs, then ``concurrency`` fresh ``procrastinate worker``
processes (one job at a time each, as a prefork child runs one) empty the queue, and the
rate is timed from the 20th completion to the last by the database's own timestamps (the
``succeeded`` rows of ``procrastinate_events``). procrastinate keeps its tables in a
database of its own on the same server (:func:`peer_database`).

This module is also the workers' app (``procrastinate --app=bench.peer.app worker``): its
connection string comes from ``BENCH_PEER_DSN``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from jobs._config.database_urls import normalize_database_url

if TYPE_CHECKING:
    from bench.procs import Child
    from bench.scenarios import BackendRun

DSN_ENV = "BENCH_PEER_DSN"
NOOP = "bench_peer_noop"
DEFER_BATCH = 1000


def _make_app(dsn: str) -> Any:
    import procrastinate  # noqa: PLC0415 - a dev extra, loaded only when the peer runs

    peer = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @peer.task(name=NOOP)
    def noop() -> None:
        """One step that does nothing, as the durable side's 1-step kind records one."""

    return peer


app = _make_app(os.environ[DSN_ENV]) if DSN_ENV in os.environ else None
"""The workers' app (``BENCH_PEER_DSN`` set); ``None`` in the bench's own process."""


@contextlib.contextmanager
def peer_database(admin_url: str) -> Iterator[str]:
    """A fresh database ``bench_peer_<random>`` with procrastinate's schema, as a libpq
    connection string, dropped when the block ends."""
    admin = create_engine(
        normalize_database_url(admin_url), isolation_level="AUTOCOMMIT", poolclass=NullPool
    )
    name = f"bench_peer_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            url = make_url(admin_url).set(database=name, drivername="postgresql")
            dsn = url.render_as_string(hide_password=False)
            peer = _make_app(dsn)
            with peer.open():
                peer.schema_manager.apply_schema()
            yield dsn
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def _finished_at(dsn: str) -> list[float]:
    """When each job finished, as seconds since the epoch on the database's clock."""
    engine = create_engine(normalize_database_url(dsn), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return [
                float(at)
                for at in conn.execute(
                    text(
                        "SELECT extract(epoch FROM at) FROM procrastinate_events "
                        "WHERE type = 'succeeded'"
                    )
                ).scalars()
            ]
    finally:
        engine.dispose()


def _ended(dsn: str) -> tuple[int, int]:
    """(succeeded, ended otherwise) jobs."""
    engine = create_engine(normalize_database_url(dsn), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT status::text, count(*) FROM procrastinate_jobs GROUP BY status")
            ).all()
    finally:
        engine.dispose()
    counts = {status: int(count) for status, count in rows}
    bad = sum(counts.get(status, 0) for status in ("failed", "cancelled", "aborted"))
    return counts.get("succeeded", 0), bad


def drain(run: BackendRun, n: int) -> dict[str, float]:
    """Defer ``n`` no-op jobs into a fresh procrastinate database, then time
    ``run.opts.concurrency`` fresh worker processes emptying it; ``{"rate": jobs/s}``."""
    from bench.drain import steady_rate  # noqa: PLC0415
    from bench.scenarios import _base_env, _wait  # noqa: PLC0415

    with peer_database(run.opts.pg_url) as dsn:
        peer = _make_app(dsn)
        with peer.open():
            task = peer.tasks[NOOP]
            for start in range(0, n, DEFER_BATCH):
                task.batch_defer(*[{} for _ in range(min(DEFER_BATCH, n - start))])
        env = {**_base_env(), DSN_ENV: dsn}
        workers: list[Child] = []
        try:
            for index in range(run.opts.concurrency):
                workers.append(
                    run.procs.start(
                        f"bench-{run.run_id}-peer{uuid.uuid4().hex[:6]}-{index}",
                        [
                            sys.executable,
                            "-m",
                            "procrastinate",
                            "--app=bench.peer.app",
                            "worker",
                            "--concurrency=1",
                        ],
                        env,
                    )
                )

            def drained() -> bool:
                done, bad = _ended(dsn)
                if bad:
                    raise RuntimeError(f"{bad} procrastinate jobs ended without succeeding")
                for worker in workers:
                    if not worker.alive():
                        raise RuntimeError(f"{worker.name} exited:\n{worker.log_tail()}")
                return done >= n

            _wait(drained, 60 + n * 0.2, f"{n} procrastinate jobs to drain", interval=0.2)
            return {"rate": steady_rate(_finished_at(dsn))}
        finally:
            run.procs.stop_many(workers)


__all__ = ["DSN_ENV", "app", "drain", "peer_database"]
