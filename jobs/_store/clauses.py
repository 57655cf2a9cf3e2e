"""The SQL pieces every part of :mod:`jobs._store` builds its statements from: the
dialect's INSERT, whether a state move is one statement (a data-modifying CTE), bound
parameters that keep their names in a CTE, and ``IN`` lists written out as equalities
(a statement built once per set of values takes no expanding parameter)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Executable,
    bindparam,
    exists,
    false,
    literal,
    or_,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite

from jobs._core.states import State
from jobs._store.tables import JobsTable, StepsTable, TableColumns

# Every job snapshot the store returns, plus whether recorded steps exist (a claim reads
# them only when they do: a first run cannot have any).
HAS_STEPS = exists(select(StepsTable.job_id).where(StepsTable.job_id == JobsTable.id)).label(
    "has_steps"
)


def insert_for(conn: Connection, table: TableColumns) -> Any:
    """The dialect's INSERT, which has ON CONFLICT (settings admit only these two)."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def uses_ctes(conn: Connection) -> bool:
    """PostgreSQL runs a transition and its history row as one statement (a data-modifying
    CTE); SQLite has none, and runs them as two statements in one transaction."""
    return conn.dialect.name == "postgresql"


Expression = Callable[[], ColumnElement[Any]]
"""Makes a value's SQL expression afresh at each place a statement uses it."""

# Named apart from the columns: SQLAlchemy reserves a column's own name for its SET value.
_PARAM_TYPES: dict[str, Any] = {
    "p_job_id": JobsTable.id.type,
    "p_owner": JobsTable.owner.type,
    "p_fence": JobsTable.fence.type,
}


def param(name: str) -> ColumnElement[Any]:
    """A new bound parameter object for ``name`` at each use: SQLAlchemy gives one object
    used in several places of a CTE an anonymous name of its own, which a dict of values
    no longer reaches."""
    return bindparam(name, type_=_PARAM_TYPES[name])


def state_in(allowed: Sequence[State]) -> ColumnElement[bool]:
    """``state IN (...)`` written out as equalities: an expanding ``IN`` parameter makes
    SQLAlchemy re-render the statement's text at every execution."""
    return or_(*(JobsTable.state == state.value for state in allowed))


def kind_in(kinds: Sequence[str]) -> ColumnElement[bool]:
    """``kind IN (...)`` written out as equalities with the kinds as constants, for a
    statement built once per set of kinds: the driver path takes no expanding parameter."""
    return or_(false(), *(JobsTable.kind == literal(kind, JobsTable.kind.type) for kind in kinds))


Shape = tuple[tuple[str, bool], ...]
"""A reusable owner's move's columns, each with whether its value is SQL (inline)."""


#: The columns of a history row a state move writes (an operator's approval adds
#: ``approved_by``), in the order its ``INSERT … SELECT`` selects them.
HISTORY_COLUMNS = ("job_id", "from_state", "to_state", "at", "owner", "fence", "reason")


@dataclasses.dataclass(frozen=True)
class ReusableStatement:
    """One run of a reusable statement (:meth:`jobs._store.statements.Statements.reusable`):
    its cache ``key``, how to ``build`` it (once per store) and the ``values`` to run it
    with; what a write sent alone, held for the next flight (:mod:`jobs._store.deferred`)
    or sent in a shared one (:mod:`jobs._store.flights`) takes."""

    key: tuple[Any, ...]
    build: Callable[[], Executable]
    values: dict[str, Any]


__all__ = [
    "HAS_STEPS",
    "HISTORY_COLUMNS",
    "Expression",
    "ReusableStatement",
    "Shape",
    "insert_for",
    "kind_in",
    "param",
    "state_in",
    "uses_ctes",
]
