"""libpq host lists in a database URL (issue 20): both forms accepted, checked and shown
masked; a server reached through one is never taken for a pooler, so liveness stays on and
the connections keep their time-outs."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from jobs._config.database_urls import (
    database_hosts,
    describe_hosts,
    mask_url,
    normalize_database_url,
)
from jobs._config.settings import from_env
from jobs._core.errors import SettingsError
from jobs._core.registry import Registry
from jobs._store.db import make_engine
from jobs._worker import liveness
from jobs._worker.process import ProcessRuntime


def test_the_uri_host_list_is_written_in_libpq_query_form() -> None:
    """``u@h1:5441,h2:5442`` no URL parser reads (it was refused with "Port could not be
    cast to integer"); libpq's query form carries the same list."""
    url = normalize_database_url(
        "postgresql://jobs:s3cret@h1:5441,h2:5442/jobs?target_session_attrs=read-write"
    )
    assert url == (
        "postgresql+psycopg://jobs:s3cret@/jobs?host=h1,h2&port=5441,5442"
        "&target_session_attrs=read-write"
    )
    assert database_hosts(url) == [("h1", 5441), ("h2", 5442)]
    settings = from_env({"JOBS_DATABASE_URL": "postgresql://jobs:s3cret@h1:5441,h2:5442/jobs"})
    assert settings.database_url.endswith("/jobs?host=h1,h2&port=5441,5442")
    assert "s3cret" not in mask_url(settings.database_url)
    assert describe_hosts(settings.database_url) == "h1:5441, h2:5442"


@pytest.mark.parametrize(
    ("url", "hosts"),
    [
        ("postgresql://u@/jobs?host=h1,h2&port=5441,5442", [("h1", 5441), ("h2", 5442)]),
        ("postgresql://u@/jobs?host=h1,h2&port=5441", [("h1", 5441), ("h2", 5441)]),
        ("postgresql://u@/jobs?host=h1:5441&host=h2:5442", [("h1", 5441), ("h2", 5442)]),
        ("postgresql://u@h1,h2/jobs", [("h1", None), ("h2", None)]),
        ("postgresql://u@[::1]:5441,h2:5442/jobs", [("::1", 5441), ("h2", 5442)]),
        ("postgresql://u:pw@db.example:6543/jobs", [("db.example", 6543)]),
    ],
)
def test_every_form_names_its_servers(url: str, hosts: list[tuple[str, int | None]]) -> None:
    assert database_hosts(url) == hosts
    from_env({"JOBS_DATABASE_URL": url})  # accepted


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("postgresql://u:s3cret@h1:5441,h2:x/jobs", "port 'x' is not a number"),
        ("postgresql://u:s3cret@/jobs?host=h1,h2,h3&port=1,2", "3 hosts but 2 ports"),
        ("postgresql://u:s3cret@/jobs?host=h1&port=70000", "from 1 to 65535"),
    ],
)
def test_a_bad_host_list_is_one_clear_line_without_the_password(url: str, why: str) -> None:
    with pytest.raises(SettingsError, match=why) as raised:
        from_env({"JOBS_DATABASE_URL": url})
    assert "s3cret" not in str(raised.value)
    assert "\n" not in str(raised.value)


def host_list_url(pg_url: str) -> str:
    """``pg_url`` as a libpq host list whose first server refuses connections (port 1)."""
    port = make_url(pg_url).port or 5432
    database = make_url(pg_url).database
    return normalize_database_url(
        f"postgresql://postgres@127.0.0.1:1,127.0.0.1:{port}/{database}"
        "?target_session_attrs=read-write"
    )


@pytest.mark.postgres
def test_a_host_list_is_not_taken_for_a_pooler(pg_url: str) -> None:
    """The server's port is the list's second: before, that looked like a proxy, and
    liveness was switched off ("looks like a pooler") and prepared statements with it."""
    url = host_list_url(pg_url)
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            assert liveness.through_proxy(conn, url) is None
            assert conn.connection.dbapi_connection.prepare_threshold is not None  # type: ignore[union-attr]
            assert conn.execute(text("SHOW statement_timeout")).scalar() == "2min"
    finally:
        engine.dispose()
    lock = liveness.LivenessLock(url)
    try:
        key = lock.ensure()
        probe = make_engine(pg_url)
        try:
            assert key in liveness.held_keys(probe)
        finally:
            probe.dispose()
    finally:
        lock.release()


@pytest.mark.postgres
def test_the_same_url_for_liveness_keeps_the_time_outs(pg_url: str) -> None:
    """JOBS_LIVENESS_DATABASE_URL set to the database's own servers is no pooler: the
    engine keeps its statement, lock and idle-in-transaction time-outs (they were dropped)."""
    url = host_list_url(pg_url)
    settings = from_env({"JOBS_DATABASE_URL": url, "JOBS_LIVENESS_DATABASE_URL": url})
    runtime = ProcessRuntime(settings, Registry(imports=()), lambda settings, on_lost: None)
    try:
        assert runtime.pooled is False
        engine: Engine = runtime.engine
        with engine.connect() as conn:
            assert conn.execute(text("SHOW lock_timeout")).scalar() == "30s"
            assert conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar() == "15s"
    finally:
        runtime.close()
    other = from_env(
        {"JOBS_DATABASE_URL": "postgresql://u@pooler:6432/jobs", "JOBS_LIVENESS_DATABASE_URL": url}
    )
    assert (
        ProcessRuntime(other, Registry(imports=()), lambda settings, on_lost: None).pooled is True
    )
