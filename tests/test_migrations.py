"""The Alembic migrations build exactly the tables the models describe, on both backends,
and go down and up again; a PostgreSQL database that was never migrated is refused."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import CheckConstraint, Engine, create_engine, inspect, text
from sqlalchemy.engine import make_url

from jobs._core.errors import SettingsError
from jobs._store import JobStore
from jobs._store.db import make_engine
from jobs._store.schema import current_revision, ensure_schema, head_revision, upgrade
from jobs._store.tables import metadata

TABLES = {
    "jobs",
    "job_steps",
    "job_transitions",
    "job_kind_limits",
    "job_schedules",
    "job_counters",
    "job_events",
    "job_pauses",
}


def differences(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, metadata))


def downgrade(engine: Engine, revision: str = "base") -> None:
    from alembic import command  # noqa: PLC0415

    from jobs._store.schema import alembic_config  # noqa: PLC0415

    config = alembic_config(engine)
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, revision)


def job_tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names()) & TABLES


def check_round_trip(engine: Engine) -> None:
    upgrade(engine)
    assert current_revision(engine) == head_revision(engine)
    assert job_tables(engine) == TABLES
    assert differences(engine) == []
    downgrade(engine)
    assert current_revision(engine) is None
    assert job_tables(engine) == set()
    upgrade(engine)
    assert current_revision(engine) == head_revision(engine)
    assert differences(engine) == []
    store = JobStore(engine)  # and the schema works
    store.submissions.create("kind", {"x": 1}, job_id="j1", max_attempts=1)
    claim = store.ownership.claim("j1", "A", 30)
    assert claim is not None
    store.ownership.record_step(claim, "s", [1])
    store.ownership.complete(claim, "ok")
    assert len(store.reads.history("j1")) == 3


@pytest.fixture
def throwaway_pg(pg_url: str) -> Iterator[str]:
    """A second, empty PostgreSQL database (never migrated), dropped afterwards."""
    name = f"jobs_throwaway_{uuid.uuid4().hex[:10]}"
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(pg_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_sqlite_migrations_match_the_models(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/m.db")
    try:
        check_round_trip(engine)
    finally:
        engine.dispose()


def test_a_fresh_database_differs_from_the_models(tmp_path: Path) -> None:
    """The comparison is not vacuous: an empty database is reported as missing tables."""
    engine = make_engine(f"sqlite:///{tmp_path}/empty.db")
    try:
        added = {diff[1].name for diff in differences(engine) if diff[0] == "add_table"}
        assert added == TABLES
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_postgres_session_database_matches_the_models(pg_engine: Engine) -> None:
    upgrade(pg_engine)  # already at head: a no-op
    assert current_revision(pg_engine) == head_revision(pg_engine)
    assert differences(pg_engine) == []
    # compare_metadata does not look at CHECK constraints: their names must match too.
    inspector = inspect(pg_engine)
    for table in metadata.sorted_tables:
        expected = {c.name for c in table.constraints if isinstance(c, CheckConstraint)}
        actual = {c["name"] for c in inspector.get_check_constraints(table.name)}
        assert actual == expected
    columns = {c["name"]: c for c in inspector.get_columns("jobs")}
    for name in ("lease_until", "run_after", "created_at", "updated_at", "finished_at"):
        assert columns[name]["type"].timezone is True  # timestamptz


@pytest.mark.postgres
def test_postgres_downgrade_and_upgrade_again(throwaway_pg: str) -> None:
    engine = make_engine(throwaway_pg)
    try:
        check_round_trip(engine)
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_ensure_schema_refuses_an_unmigrated_postgres(throwaway_pg: str) -> None:
    engine = make_engine(throwaway_pg)
    try:
        with pytest.raises(SettingsError) as info:
            ensure_schema(engine)
        message = str(info.value)
        assert "`jobctl db upgrade`" in message
        assert "is at nothing" in message
        assert head_revision(engine) in message
        assert job_tables(engine) == set()  # it did not migrate on its own
        upgrade(engine)
        ensure_schema(engine)  # at head: accepted
    finally:
        engine.dispose()


def test_ensure_schema_migrates_an_embedded_sqlite(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/embedded.db")
    try:
        assert current_revision(engine) is None
        ensure_schema(engine)
        assert current_revision(engine) == head_revision(engine)
        assert differences(engine) == []
        ensure_schema(engine)  # a no-op the second time
    finally:
        engine.dispose()
