"""Start-up refuses, in one line, what would fail every job; and what it must keep: a
URL's own session options."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from jobs._config.settings import from_env
from jobs._store import JobStore
from jobs._store.db import make_engine
from jobs._store.schema import alembic_config, known_revisions, upgrade
from jobs._store.tables import SCHEMA_REVISION
from tests.conftest import (
    AMQP_URL,
    error_line,
    jobctl_in_child,
    private_pg_database,
    refused,
    start_worker,
)


@pytest.mark.postgres
def test_two_tenants_search_paths_stay_apart() -> None:
    """A URL's own ``options=-csearch_path=…`` was replaced by the session time-outs, so two
    tenants shared one jobs table (and each sweeper worked on the other's jobs)."""
    with private_pg_database("jobs_tenants") as base_url:
        admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text("CREATE SCHEMA tenant_a; CREATE SCHEMA tenant_b"))
        engines = []
        for tenant in ("tenant_a", "tenant_b"):
            url = (
                make_url(base_url)
                .update_query_dict({"options": f"-csearch_path={tenant}"})
                .render_as_string(hide_password=False)
            )
            engine = make_engine(from_env({"JOBS_DATABASE_URL": url}).database_url)
            engines.append(engine)
            upgrade(engine)
            JobStore(engine).submissions.create("k", {}, job_id=f"job-of-{tenant}", max_attempts=1)
            with engine.connect() as conn:
                assert conn.execute(text("SHOW search_path")).scalar() == tenant
                assert conn.execute(text("SHOW statement_timeout")).scalar() == "2min"
        with admin.connect() as conn:
            for tenant in ("tenant_a", "tenant_b"):
                ids = conn.execute(text(f"SELECT id FROM {tenant}.jobs")).scalars().all()
                assert ids == [f"job-of-{tenant}"]
            assert conn.execute(text("SELECT to_regclass('public.jobs')")).scalar() is None
        for engine in engines:
            engine.dispose()
        admin.dispose()


def _worker_env(tmp_path: Path, database_url: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBS_")}
    env["JOBS_DATA_DIR"] = str(tmp_path / "data")
    if database_url is not None:
        env["JOBS_DATABASE_URL"] = database_url
        env["JOBS_BROKER_URL"] = AMQP_URL  # a server database needs a real broker
    return env


def test_a_node_name_too_long_to_store_isrefused_at_start(tmp_path: Path) -> None:
    """A node name of ~195 characters or more: the worker said "ready" and every claim then
    failed on PostgreSQL's varchar(200) owner column."""
    name = "w" * 190 + "@host"
    status, output = start_worker(_worker_env(tmp_path), "-n", name)
    refused(status, output, "node name is 195 characters", "at most 192")
    status, output = start_worker(_worker_env(tmp_path), "-n", "w" * 187 + "@host")
    assert status is None, output  # 192 characters: <name>:<7-digit pid> fits in 200


def _schema_at(url: str, revision: str, oldest_code: str | None = None) -> None:
    """The job tables at ``revision``; a revision this code does not know is a newer
    release's, which serves code from ``oldest_code`` on (default: from itself on, as
    after a migration that drops what older code used)."""
    engine = make_engine(url)
    upgrade(engine, revision if revision in known_revisions() else "head")
    if revision not in known_revisions():  # a newer release's schema
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})
            conn.execute(
                text("UPDATE job_schema_floor SET oldest_code = :r"),
                {"r": oldest_code or revision},
            )
    engine.dispose()


@pytest.mark.postgres
def test_a_worker_on_a_schema_behind_the_code_stops_naming_both_revisions(
    tmp_path: Path,
) -> None:
    """It said "ready" and failed every delivery with a traceback (the README said it stops)."""
    with private_pg_database("jobs_behind") as url:
        _schema_at(url, "0005")
        status, output = start_worker(_worker_env(tmp_path, url))
    refused(status, output, "at 0005", f"needs {SCHEMA_REVISION}", "run `jobctl db upgrade`")


@pytest.mark.postgres
def test_a_schema_newer_than_the_code_is_named_and_never_upgraded(tmp_path: Path) -> None:
    """An Alembic traceback on every command, or "run `jobctl db upgrade`", which then
    tracebacked."""
    with private_pg_database("jobs_newer") as url:
        _schema_at(url, "0099")
        env = _worker_env(tmp_path, url)
        status, output = start_worker(env)
        refused(status, output, "at 0099", "newer than this code", "upgrade durable-jobs")
        for command in (["db", "upgrade"], ["list"]):
            line = error_line(jobctl_in_child(env, *command))
            assert "is at 0099, newer than this code" in line, line
        current = jobctl_in_child(env, "db", "current")
        assert "newer than this code" in current.stdout, current.stdout + current.stderr


@pytest.mark.postgres
def test_a_newer_schema_that_serves_this_code_lets_it_run_during_a_rolling_upgrade(
    tmp_path: Path,
) -> None:
    """A newer release whose migrations only added says so (``job_schema_floor``): this
    release's workers start, its commands run, and its ``db upgrade`` (every pod may run it
    at start) does nothing instead of failing."""
    with private_pg_database("jobs_rolling") as url:
        _schema_at(url, "0099", oldest_code=SCHEMA_REVISION)
        env = _worker_env(tmp_path, url)
        status, output = start_worker(env)
        assert status is None, output  # it said "ready"
        upgraded = jobctl_in_child(env, "db", "upgrade")
        assert upgraded.returncode == 0, upgraded.stderr
        assert "newer than this code's" in upgraded.stdout, upgraded.stdout
        assert "nothing to do" in upgraded.stdout, upgraded.stdout
        listed = jobctl_in_child(env, "list")
        assert (listed.returncode, listed.stdout) == (0, "no jobs\n"), listed.stderr
        current = jobctl_in_child(env, "db", "current")
        assert "and serving it" in current.stdout, current.stdout + current.stderr


def test_an_embedded_schema_newer_than_the_code_is_one_line(tmp_path: Path) -> None:
    """SQLite upgrades itself on first use: a newer release's schema must not send it into
    Alembic (a traceback on every command)."""
    url = f"sqlite:///{tmp_path}/jobs.db"
    _schema_at(url, "0099")
    line = error_line(jobctl_in_child(_worker_env(tmp_path, url), "list"))
    assert "is at 0099, newer than this code" in line, line


def test_known_revisions_are_alembics() -> None:
    """The revisions read from the migration files' names are Alembic's own, oldest first."""
    from alembic.script import ScriptDirectory  # noqa: PLC0415

    engine = make_engine("sqlite://")
    script = ScriptDirectory.from_config(alembic_config(engine))
    assert known_revisions() == [rev.revision for rev in reversed(list(script.walk_revisions()))]
    assert known_revisions()[-1] == SCHEMA_REVISION
