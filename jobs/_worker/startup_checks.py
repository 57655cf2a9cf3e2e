"""What a worker checks before it says "ready": anything that would fail every job it
claims. Each is one line naming the fix, and the worker exits (status 1) instead of
taking deliveries it can only fail.

- Its owner name (``<node name>:<pid>``, stamped on every claim) must fit the ``owner``
  column (``varchar(200)`` on PostgreSQL): a longer Celery node name failed every claim.
- The job tables must be at the revision this code needs: a schema behind it failed
  every delivery; a newer one (written by a newer release) is named as such.
- The role must be allowed to write them (PostgreSQL): a read-only role failed every claim.

A database that cannot be reached is not a refusal: pool processes retry it on first use.
"""

from __future__ import annotations

import logging

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from jobs._config.settings import Settings
from jobs._core.errors import SettingsError
from jobs._store.db import make_engine
from jobs._store.schema import current_revision, is_newer, skew
from jobs._store.tables import ID_LENGTH, metadata

log = logging.getLogger("jobs")

# Linux PIDs are below 2**22 (4,194,304): at most 7 digits after the node name's colon.
PID_DIGITS = 7
MAX_NODE_NAME = ID_LENGTH - 1 - PID_DIGITS


def node_name_problem(node_name: str) -> str | None:
    """Why claims signed ``<node_name>:<pid>`` cannot be stored, or None."""
    if len(node_name) <= MAX_NODE_NAME:
        return None
    return (
        f"the worker's node name is {len(node_name)} characters ({node_name[:40]!r}…): "
        f"the owner it signs claims with must fit {ID_LENGTH} characters, so name the node "
        f"in at most {MAX_NODE_NAME} (-n/--hostname)"
    )


def schema_problem(engine: Engine) -> str | None:
    """Why the job tables cannot serve this code (behind, or newer), or None; None too
    on SQLite below the code's revision (it upgrades itself on first use)."""
    current = current_revision(engine)
    if engine.dialect.name == "sqlite" and not is_newer(current):
        return None
    return skew(engine, current)


# Per table and privilege: has_table_privilege with a list is true if any one is held.
_MISSING_PRIVILEGES_SQL = text(
    "SELECT tab || ': ' || priv FROM unnest(CAST(:tables AS text[])) AS tab, "
    "unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) AS priv "
    "WHERE NOT has_table_privilege(tab, priv)"
)


def write_problem(engine: Engine) -> str | None:
    """Why this role cannot write the job tables (PostgreSQL: a read-only role, a standby),
    or None."""
    if engine.dialect.name != "postgresql":
        return None
    # The jobs table first: the one line names at most four, and it is the one that matters.
    tables = sorted(
        (table.name for table in metadata.sorted_tables), key=lambda name: name != "jobs"
    )
    with engine.connect() as conn:
        if conn.execute(text("SHOW transaction_read_only")).scalar() == "on":
            return "the database accepts no writes here (a standby, or read-only by default)"
        missing = conn.execute(_MISSING_PRIVILEGES_SQL, {"tables": tables}).scalars().all()
    if not missing:
        return None
    return (
        f"the role in JOBS_DATABASE_URL may not write the job tables (missing "
        f"{', '.join(missing[:4])}{', …' if len(missing) > 4 else ''}): grant it SELECT, "
        "INSERT, UPDATE and DELETE on them"
    )


def problems(settings: Settings, node_name: str | None, pooled: bool = False) -> list[str]:
    """Every reason this worker would fail every job: :func:`node_name_problem`, then
    :func:`schema_problem` and :func:`write_problem` (none when the database cannot be
    reached now; ``pooled``: it is reached through a pooler, as the runtime decides)."""
    found = [] if node_name is None else [node_name_problem(node_name)]
    engine = make_engine(settings.database_url, pooled=pooled, poolclass=NullPool)
    try:
        found.append(schema_problem(engine))
        if found[-1] is None:
            found.append(write_problem(engine))
    except DBAPIError as err:
        log.warning("schema not checked at start-up (database unreachable now): %s", err.orig)
    finally:
        engine.dispose()
    return [problem for problem in found if problem is not None]


def refuse_what_fails_every_job(
    settings: Settings, node_name: str | None, pooled: bool = False
) -> None:
    """Log each of :func:`problems` on one line and exit with status 1 (Celery swallows
    an exception from a signal handler, not SystemExit)."""
    try:
        found = problems(settings, node_name, pooled)
    except SettingsError as err:
        found = [str(err)]
    for problem in found:
        log.critical("%s; the worker will not start", problem)
    if found:
        raise SystemExit(1)
