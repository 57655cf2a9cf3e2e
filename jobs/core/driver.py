"""The hot path's statements run on the driver's cursor, compiled once.

A claim or an owner's move is one statement PostgreSQL executes in about 50 µs of client
CPU when sent straight through psycopg, and in about 200 µs through SQLAlchemy's
``Connection.execute``: each execution builds an execution context, processes every bound
value, asks the driver for the result's description and builds result metadata from it.
On a worker that runs two such statements per job, that overhead was a larger share of a
job's CPU than PostgreSQL's own work on the statement.

:class:`DriverStatement` keeps the statement's SQLAlchemy definition (built in
:mod:`jobs.core.store`, the only package that writes job SQL) and compiles it once for the
engine's dialect: the SQL text, the values of its constant parameters (already processed),
a processor per value that changes per call, and the result's column names and
processors. :meth:`DriverStatement.first` runs it on the DBAPI connection behind a
pooled SQLAlchemy :class:`~sqlalchemy.engine.Connection`, so the pool, autocommit mode and
invalidation stay SQLAlchemy's; driver errors come back as SQLAlchemy's exceptions
(``IntegrityError``, and ``DBAPIError`` with ``connection_invalidated`` for a lost
connection, which :func:`jobs.core.db.retry_on_disconnect` retries).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.selectable import ReturnsRows

CURSOR_KEY = "jobs_driver_cursor"
"""Where a pooled connection keeps its reusable cursor (in the pool record's ``info``,
which lives as long as the DBAPI connection itself)."""

Processor = Callable[[Any], Any]


def runs_on_driver(dialect: Dialect) -> bool:
    """Whether statements on this dialect can take the driver path: PostgreSQL through
    psycopg (3), whose named ``%(name)s`` parameters the compiled SQL uses."""
    return dialect.name == "postgresql" and dialect.driver == "psycopg"


class DriverStatement:
    """One reusable statement that returns rows (a CTE writing rows, or an INSERT …
    RETURNING), compiled once; see the module's docstring for why. ``changing`` names the
    bound parameters each call supplies; every other parameter keeps the value it was
    built with."""

    def __init__(self, statement: Executable, dialect: Dialect, changing: Sequence[str]) -> None:
        if not isinstance(statement, ReturnsRows):
            raise TypeError("a driver statement returns its rows (a SELECT, or RETURNING)")
        compiled = statement.compile(dialect=dialect)
        self.sql = str(compiled)
        if "POSTCOMPILE" in self.sql:
            raise ValueError("a driver statement cannot have expanding (IN) parameters")
        binds = compiled.binds
        unknown = [name for name in changing if name not in binds]
        if unknown:
            raise ValueError(f"no bound parameter named {', '.join(unknown)}")
        processors: dict[str, Processor | None] = {
            name: bind.type.dialect_impl(dialect).bind_processor(dialect)
            for name, bind in binds.items()
        }
        self._changing = {name: processors[name] for name in changing}
        self._constants = {
            name: value if (process := processors[name]) is None else process(value)
            for name, value in compiled.construct_params(dict.fromkeys(changing)).items()
            if name not in self._changing
        }
        columns = list(statement.exported_columns)
        self._row = collections.namedtuple("DriverRow", [column.key for column in columns])  # type: ignore[misc]
        self._results: list[tuple[int, Processor]] = [
            (index, process)
            for index, column in enumerate(columns)
            if (process := column.type.dialect_impl(dialect).result_processor(dialect, None))
            is not None
        ]

    def _params(self, values: Mapping[str, Any]) -> dict[str, Any]:
        params = dict(self._constants)
        for name, process in self._changing.items():
            value = values[name]
            params[name] = value if process is None else process(value)
        return params

    def first(self, conn: Connection, values: Mapping[str, Any]) -> Any:
        """Run on ``conn``'s DBAPI connection (in whatever transaction mode ``conn`` is);
        the first row (with attribute access, like SQLAlchemy's) or ``None``."""
        params = self._params(values)
        record = conn.connection
        dbapi_connection = record.driver_connection
        cursor = record.info.get(CURSOR_KEY)
        if cursor is None or cursor.closed or cursor.connection is not dbapi_connection:
            cursor = record.info[CURSOR_KEY] = dbapi_connection.cursor()  # type: ignore[union-attr]
        dialect = conn.dialect
        try:
            cursor.execute(self.sql, params)
            found = cursor.fetchone()
        except dialect.loaded_dbapi.Error as err:
            lost = dialect.is_disconnect(err, dbapi_connection, cursor)
            if lost:
                conn.invalidate(err)
            raise DBAPIError.instance(
                self.sql,
                params,
                err,
                dialect.loaded_dbapi.Error,
                connection_invalidated=lost,
                dialect=dialect,
            ) from err
        if found is None:
            return None
        if self._results:
            found = list(found)
            for index, process in self._results:
                found[index] = process(found[index])
        return self._row(*found)


__all__ = ["CURSOR_KEY", "DriverStatement", "runs_on_driver"]
