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
        self._row_type = collections.namedtuple("DriverRow", [column.key for column in columns])  # type: ignore[misc]
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

    def _row(self, found: Any) -> Any:
        if found is None:
            return None
        if self._results:
            found = list(found)
            for index, process in self._results:
                found[index] = process(found[index])
        return self._row_type(*found)

    def _error(self, conn: Connection, err: Any, params: Mapping[str, Any]) -> Exception:
        """A driver error as SQLAlchemy's, the connection invalidated if it was lost."""
        dialect = conn.dialect
        dbapi_connection = conn.connection.driver_connection
        lost = dialect.is_disconnect(err, dbapi_connection, None)
        if lost:
            conn.invalidate(err)
        error: Exception = DBAPIError.instance(
            self.sql,
            params,
            err,
            dialect.loaded_dbapi.Error,
            connection_invalidated=lost,
            dialect=dialect,
        )
        return error

    def first_after(
        self,
        conn: Connection,
        values: Mapping[str, Any],
        earlier: DriverStatement,
        earlier_values: Mapping[str, Any],
    ) -> tuple[Any, Any]:
        """Run ``earlier`` and then this statement in one flight (psycopg's pipeline mode:
        both sent before either result is read), each its own autocommit transaction: a
        Sync between them commits ``earlier`` before this one begins, and an error in one
        does not stop the other. Returns (this statement's first row or ``None``,
        ``earlier``'s first row, ``None``, or the :class:`DBAPIError` it met). A lost
        connection raises for both (the caller cannot know whether ``earlier`` committed)."""
        params = self._params(values)
        earlier_params = earlier._params(earlier_values)
        dbapi_connection: Any = conn.connection.driver_connection
        earlier_cursor = dbapi_connection.cursor()
        cursor = dbapi_connection.cursor()
        dbapi_error = conn.dialect.loaded_dbapi.Error
        failed: Exception | None = None
        try:
            with dbapi_connection.pipeline() as pipeline:
                earlier_cursor.execute(earlier.sql, earlier_params)
                # A Sync without waiting for it: the end of earlier's implicit transaction.
                pipeline._enqueue_sync()
                cursor.execute(self.sql, params)
        except dbapi_error as err:
            # A failed statement's cursor gets no result; the first error is raised.
            if cursor.pgresult is None or conn.dialect.is_disconnect(err, dbapi_connection, None):
                raise self._error(conn, err, params) from err
            failed = err
        earlier_outcome = (
            earlier._row(earlier_cursor.fetchone())
            if earlier_cursor.pgresult is not None
            else earlier._error(conn, failed or RuntimeError("no result"), earlier_params)
        )
        found = self._row(cursor.fetchone())
        earlier_cursor.close()
        cursor.close()
        return found, earlier_outcome

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
        return self._row(found)


__all__ = ["CURSOR_KEY", "DriverStatement", "runs_on_driver"]
