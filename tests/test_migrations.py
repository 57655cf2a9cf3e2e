"""The Alembic migrations build exactly the tables the models describe, on both backends,
and go down and up again; a PostgreSQL database that was never migrated is refused."""

from __future__ import annotations

import ast
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
from jobs._store.schema import (
    MIGRATIONS,
    current_revision,
    ensure_schema,
    head_revision,
    known_revisions,
    upgrade,
)
from jobs._store.schema_floor import oldest_code
from jobs._store.tables import SCHEMA_REVISION, metadata

MIGRATION_VERSIONS = MIGRATIONS / "versions"

TABLES = {
    "jobs",
    "job_steps",
    "job_transitions",
    "job_kind_limits",
    "job_schedules",
    "job_counters",
    "job_events",
    "job_pauses",
    "job_schema_floor",
    "job_rate_starts",
    "job_key_turns",
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


# -- expand, then contract: what each migration says about the code it still serves ---------

#: The first migration that says which code it serves (``OLDEST_CODE``).
FIRST_WITH_A_FLOOR = "0011"

#: Operations that take away or change what older code reads or writes: a migration that
#: makes one (a contract) serves code from its parent on, no older.
CONTRACTING = {
    "drop_column",
    "drop_table",
    "drop_constraint",
    "alter_column",
    "rename_table",
    "execute",  # raw SQL may change anything: declare it a contract
}


def migration_files() -> dict[str, ast.Module]:
    """Each migration's syntax tree, by revision."""
    trees = {}
    for path in sorted(MIGRATION_VERSIONS.glob("*_*.py")):
        tree = ast.parse(path.read_text())
        trees[module_constant(tree, "revision")] = tree
    return trees


def module_constant(tree: ast.Module, name: str) -> str:
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == name:
            assert isinstance(node, ast.Assign | ast.AnnAssign)
            assert node.value is not None
            value = ast.literal_eval(node.value)
            return "" if value is None else str(value)
    return ""


def contracting_calls(tree: ast.Module) -> list[str]:
    """The contracting operations ``upgrade()`` makes, and any column it adds as NOT NULL
    with no server default (older code's inserts would fail on it)."""
    [upgrade_function] = [
        node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "upgrade"
    ]
    found = []
    for node in ast.walk(upgrade_function):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if node.func.attr in CONTRACTING:
            found.append(node.func.attr)
        if node.func.attr == "add_column":
            column = node.args[-1] if node.args else None
            keywords = (
                {keyword.arg: keyword.value for keyword in column.keywords}
                if isinstance(column, ast.Call)
                else {}
            )
            nullable = keywords.get("nullable")
            if (
                isinstance(nullable, ast.Constant)
                and nullable.value is False
                and "server_default" not in keywords
            ):
                found.append("add_column NOT NULL without a server default")
    return found


def test_each_migration_since_the_floor_says_the_oldest_code_it_serves() -> None:
    """From 0011 on, each migration declares ``OLDEST_CODE``, writes it
    (``record_oldest_code``), never lowers it, and raises it at least to its parent when it
    contracts; so a newer release's schema tells older code the truth about running on it
    (docs/operations/upgrading.md, "Rolling upgrades")."""
    trees = migration_files()
    order = known_revisions()
    floor = ""
    for revision in order[order.index(FIRST_WITH_A_FLOOR) :]:
        tree = trees[revision]
        oldest = module_constant(tree, "OLDEST_CODE")
        assert oldest in order, f"{revision}: OLDEST_CODE {oldest!r} is no known revision"
        assert "record_oldest_code" in ast.unparse(tree), f"{revision} does not record it"
        if floor:
            assert order.index(oldest) >= order.index(floor), f"{revision} lowers the floor"
        contracts = contracting_calls(tree)
        parent = module_constant(tree, "down_revision")
        if contracts:
            assert order.index(oldest) >= order.index(parent), (
                f"{revision} contracts ({', '.join(contracts)}) but says it serves code "
                f"from {oldest}: raise OLDEST_CODE to {parent} at least"
            )
        floor = oldest


def test_the_contract_check_catches_a_drop_and_a_not_null_column() -> None:
    tree = ast.parse(
        "def upgrade():\n"
        "    op.drop_column('jobs', 'progress')\n"
        "    with op.batch_alter_table('jobs') as batch:\n"
        "        batch.add_column(sa.Column('x', sa.Integer(), nullable=False))\n"
        "        batch.add_column(sa.Column('y', sa.Integer(), nullable=True))\n"
        "        batch.add_column(\n"
        "            sa.Column('z', sa.Integer(), nullable=False, server_default='0')\n"
        "        )\n"
    )
    assert contracting_calls(tree) == [
        "drop_column",
        "add_column NOT NULL without a server default",
    ]


def test_the_schema_records_the_oldest_code_it_serves(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/floor.db")
    upgrade(engine)
    assert oldest_code(engine) == module_constant(migration_files()[SCHEMA_REVISION], "OLDEST_CODE")
    engine.dispose()
    below = make_engine(f"sqlite:///{tmp_path}/below.db")
    upgrade(below, "0010")
    assert oldest_code(below) is None  # before the floor existed: no row, no table
    below.dispose()
