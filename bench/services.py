"""The services a backend needs: a throwaway PostgreSQL database, broker queues, clocks."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

from celery import Celery
from kombu.connection import Connection
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from jobs._config.database_urls import normalize_database_url


@contextlib.contextmanager
def pg_database(admin_url: str) -> Iterator[str]:
    """A fresh database ``bench_<random>`` on the server of ``admin_url``, dropped (with
    any connection still open to it) when the block ends, however it ends."""
    admin_url = normalize_database_url(admin_url)
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    name = f"bench_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        finally:
            from jobs.application import default_app  # noqa: PLC0415

            default_app().reset()
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def check_pg(admin_url: str) -> str | None:
    """None if the server answers, else why not."""
    engine = create_engine(
        normalize_database_url(admin_url), poolclass=NullPool, connect_args={"connect_timeout": 3}
    )
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as err:  # any failure to reach it
        return f"PostgreSQL unreachable at {admin_url}: {type(err).__name__}: {err}"
    finally:
        engine.dispose()
    return None


def check_amqp(url: str) -> str | None:
    try:
        with Connection(url, connect_timeout=3) as conn:  # type: ignore[no-untyped-call]
            conn.ensure_connection(max_retries=1, timeout=3)
    except Exception as err:
        return f"RabbitMQ unreachable at {url}: {type(err).__name__}: {err}"
    return None


def delete_queues(app: Celery, queues: list[str]) -> None:
    """Drop the bench's queues from RabbitMQ (Celery declares them durable)."""
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for queue in queues:
            with contextlib.suppress(Exception):
                channel.queue_delete(queue)


_NOW = text("SELECT extract(epoch FROM clock_timestamp())")


def clock_offset(engine: Engine) -> float:
    """Seconds the database clock runs ahead of this host's ``time.time()`` (0 for SQLite,
    whose ``now`` is the writing process's own clock). Taken from the fastest of a few
    round trips, so job times read from the database compare with local times."""
    if engine.dialect.name != "postgresql":
        return 0.0
    best: tuple[float, float] | None = None
    with engine.connect() as conn:
        for _ in range(7):
            before = time.time()
            db = float(conn.execute(_NOW).scalar_one())
            after = time.time()
            if best is None or after - before < best[0]:
                best = (after - before, db - (before + after) / 2)
    assert best is not None
    return best[1]
