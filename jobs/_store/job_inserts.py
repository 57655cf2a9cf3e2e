"""The INSERTs of new jobs with their "submitted" history rows, which every submission
shares (one job or many, deduplicated or not): on PostgreSQL one statement (a
data-modifying CTE), on SQLite the jobs and their history in two, in the caller's
transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Executable, insert, literal, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql import ColumnElement

from jobs._core.states import State
from jobs._store.clauses import insert_for
from jobs._store.reader import JOB_COLUMNS
from jobs._store.tables import JobsTable, TransitionsTable


def inserted_with_history(columns: list[str], source: Any) -> Executable:
    """PostgreSQL: INSERT the jobs ``source`` selects (an ID already present inserts
    nothing) and a "submitted" history row for each one inserted, as one statement that
    returns the inserted jobs."""
    created = (
        postgresql.insert(JobsTable)
        .from_select(columns, source)
        .on_conflict_do_nothing()
        .returning(*JOB_COLUMNS)
        .cte("created")
    )
    history = (
        insert(TransitionsTable)
        .from_select(
            ["job_id", "to_state", "at", "reason"],
            select(
                created.c.id,
                literal(State.QUEUED.value, TransitionsTable.to_state.type),
                created.c.created_at,
                literal("submitted", TransitionsTable.reason.type),
            ),
        )
        .cte("history")
    )
    return select(*created.c).add_cte(history)


def insert_rows(conn: Connection, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """SQLite: the rows and their history in the caller's transaction, by ID of the rows
    inserted (an ID already present inserts nothing)."""
    # One statement compiled for one row, sent as multi-row INSERTs by the driver
    # (SQLAlchemy's "insertmanyvalues"): a VALUES list of N rows compiled afresh costs
    # more than the database spends writing them.
    clock_values = {name for name, value in rows[0].items() if isinstance(value, ColumnElement)}
    inserted = {
        row.id: row
        for row in conn.execute(
            insert_for(conn, JobsTable)
            .values({name: rows[0][name] for name in clock_values})
            .on_conflict_do_nothing()
            .returning(*JOB_COLUMNS),
            [{k: v for k, v in row.items() if k not in clock_values} for row in rows],
        )
    }
    if inserted:
        conn.execute(
            insert(TransitionsTable),
            [
                {
                    "job_id": row["id"],
                    "from_state": None,
                    "to_state": State.QUEUED.value,
                    "at": inserted[row["id"]].created_at,
                    "reason": "submitted",
                }
                for row in rows
                if row["id"] in inserted
            ],
        )
    return inserted


__all__ = ["insert_rows", "inserted_with_history"]
