"""Shared fixtures: an isolated embedded setup per test, and a private PostgreSQL database
per test session (so concurrent runs on one server never see each other's jobs).

Service tests skip only when the service is unreachable outside CI, and say why; with
CI=true they fail instead.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

import jobs
from jobs import api
from jobs.core.registry import REGISTRY
from jobs.core.settings import normalize_database_url, reset_settings

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
PG_ADMIN_URL = normalize_database_url(
    os.environ.get("JOBS_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
)
AMQP_URL = os.environ.get("JOBS_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def service_unavailable(name: str, err: Exception) -> None:
    message = f"{name} unreachable: {err}"
    if IN_CI:
        pytest.fail(f"{message} (CI=true: service tests must run)")
    pytest.skip(message)


def _unmute_jobs_loggers() -> None:
    """An in-process Celery worker (celery.contrib.pytest) sets up logging for its app and
    leaves the root logger at ERROR and ours muted for the tests that follow; undo that so
    caplog sees our warnings."""
    logging.root.setLevel(logging.WARNING)
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if (name == "jobs" or name.startswith("jobs.")) and isinstance(logger, logging.Logger):
            logger.disabled = False
            logger.propagate = True
            logger.setLevel(logging.NOTSET)


@pytest.fixture(autouse=True)
def isolated_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each test gets its own data folder and SQLite database and no doorbell."""
    for key in list(os.environ):
        if key.startswith("JOBS_") and not key.startswith("JOBS_TEST_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("JOBS_DATA_DIR", str(tmp_path / "jobs-data"))
    reset_settings()
    api.reset()
    api.set_dispatcher(None)
    _unmute_jobs_loggers()
    yield tmp_path
    reset_settings()
    api.reset()
    REGISTRY.reset_imports()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, dropped at the end."""
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"jobs_test_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as err:  # any failure to reach the server
        admin.dispose()
        service_unavailable("PostgreSQL", err)
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        from jobs.core.db import dispose_all  # noqa: PLC0415

        dispose_all()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


__all__ = ["AMQP_URL", "IN_CI", "jobs", "service_unavailable"]


# -- shared by the store contract, the claim races and the migration checks ------------------


def truncate_job_tables(engine: Engine) -> None:
    """Empty the job tables of the session's PostgreSQL database between tests."""
    with engine.begin() as conn:
        conn.execute(text(
            "TRUNCATE jobs, job_steps, job_transitions, job_kind_limits RESTART IDENTITY CASCADE"
        ))


@pytest.fixture(scope="session")
def pg_engine(pg_url: str) -> Iterator[Engine]:
    """An engine on the session's PostgreSQL database, migrated to head."""
    from jobs.core.db import make_engine  # noqa: PLC0415
    from jobs.schema import upgrade  # noqa: PLC0415

    engine = make_engine(pg_url)
    upgrade(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def clean_pg_engine(pg_engine: Engine) -> Engine:
    """The session's PostgreSQL engine, at head, with empty job tables."""
    from jobs.schema import upgrade  # noqa: PLC0415

    upgrade(pg_engine)  # a no-op at head; repairs the schema if a test took it down
    truncate_job_tables(pg_engine)
    return pg_engine
