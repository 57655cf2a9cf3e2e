"""The hot path's statements run on the driver's cursor, compiled once.

A claim or an owner's move is one statement PostgreSQL executes in about 50 µs of client
CPU when sent straight through psycopg, and in about 200 µs through SQLAlchemy's
``Connection.execute``: each execution builds an execution context, processes every bound
value, asks the driver for the result's description and builds result metadata from it.
On a worker that runs two such statements per job, that overhead was a larger share of a
job's CPU than PostgreSQL's own work on the statement.

:class:`DriverStatement` keeps the statement's SQLAlchemy definition (built in
:mod:`jobs._store`, the only package that writes job SQL) and compiles it once for the
engine's dialect: the SQL text, the values of its constant parameters (already processed),
a processor per value that changes per call, and the result's column names and
processors. :meth:`DriverStatement.first` runs it on the DBAPI connection behind a
pooled SQLAlchemy :class:`~sqlalchemy.engine.Connection`, so the pool, autocommit mode and
invalidation stay SQLAlchemy's; driver errors come back as SQLAlchemy's exceptions
(``IntegrityError``, and ``DBAPIError`` with ``connection_invalidated`` for a lost
connection, which :func:`jobs._store.db.retry_on_disconnect` retries).
"""

from __future__ import annotations

import collections
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.selectable import ReturnsRows

from jobs._core.self_check import SelfCheck

CURSOR_KEY = "jobs_driver_cursor"
"""Where a pooled connection keeps its reusable cursor (in the pool record's ``info``,
which lives as long as the DBAPI connection itself)."""

Processor = Callable[[Any], Any]

log = logging.getLogger("jobs")

TESTED_PSYCOPG = "3.1 to 3.3"
"""The psycopg releases whose private ``Pipeline._enqueue_sync`` the pipelined flight
(:meth:`DriverStatement.first_after`) was tested on."""


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
        return sqlalchemy_error(conn, err, self.sql, params)

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
            raise sqlalchemy_error(conn, err, self.sql, params, cursor=cursor) from err
        return self._row(found)

    def first_and_commit(self, conn: Connection, values: Mapping[str, Any]) -> Any:
        """Run inside ``conn``'s open transaction and send its ``COMMIT`` in the same flight
        (psycopg's pipeline mode: one round trip for both); the first row or ``None``. An
        error raises (SQLAlchemy's) before anything committed, the transaction left aborted
        for the caller to roll back: PostgreSQL skips the ``COMMIT`` after a failed
        statement. A lost connection raises with ``connection_invalidated`` (nobody can
        know then whether the commit landed)."""
        params = self._params(values)
        dbapi_connection: Any = conn.connection.driver_connection
        cursor, committing = dbapi_connection.cursor(), dbapi_connection.cursor()
        try:
            # COMMIT as a statement of the flight: psycopg's commit() would wait for a Sync
            # of its own, and the pipeline's end for another (three round trips, not one).
            with dbapi_connection.pipeline():
                cursor.execute(self.sql, params)
                committing.execute("COMMIT")
            return self._row(cursor.fetchone())
        except conn.dialect.loaded_dbapi.Error as err:
            raise self._error(conn, err, params) from err
        finally:
            cursor.close()
            committing.close()


def run_together(
    conn: Connection, writes: Sequence[tuple[DriverStatement, Mapping[str, Any]]]
) -> list[Any]:
    """Run ``writes`` in one flight and one transaction: psycopg's pipeline mode on
    ``conn``'s DBAPI connection (in autocommit mode) sends every statement before reading
    any result and one Sync after the last, so PostgreSQL runs them as one implicit
    transaction, committed once. Returns each statement's first row (or ``None``), in
    order. An error in any of them rolls every one back and raises (SQLAlchemy's error;
    ``connection_invalidated`` when the connection was lost, and then nobody can know
    whether the commit landed)."""
    dbapi_connection: Any = conn.connection.driver_connection
    if not dbapi_connection.autocommit:
        raise ValueError("statements run together on an autocommit connection only")
    cursors = [dbapi_connection.cursor() for _ in writes]
    params = [driver._params(values) for driver, values in writes]
    try:
        with dbapi_connection.pipeline():
            for cursor, (driver, _values), bound in zip(cursors, writes, params, strict=True):
                cursor.execute(driver.sql, bound)
        return [
            driver._row(cursor.fetchone())
            for cursor, (driver, _values) in zip(cursors, writes, strict=True)
        ]
    except conn.dialect.loaded_dbapi.Error as err:
        failed = next(
            (i for i, cursor in enumerate(cursors) if cursor.pgresult is None), len(writes) - 1
        )
        raise writes[failed][0]._error(conn, err, params[failed]) from err
    finally:
        for cursor in cursors:
            cursor.close()


def sqlalchemy_error(
    conn: Connection,
    err: Any,
    sql: str,
    params: Mapping[str, Any],
    *,
    cursor: Any = None,
    lost: bool | None = None,
) -> DBAPIError:
    """The driver's error ``err`` as SQLAlchemy raises it (``IntegrityError``, and
    ``DBAPIError`` with ``connection_invalidated`` for a lost connection, which
    :func:`jobs._store.db.retry_on_disconnect` retries); the connection is invalidated when
    it was lost (``lost``, or the dialect's own test when ``None``)."""
    dialect = conn.dialect
    if lost is None:
        lost = bool(dialect.is_disconnect(err, conn.connection.driver_connection, cursor))
    if lost:
        conn.invalidate(err)
    error: DBAPIError = DBAPIError.instance(
        sql,
        params,
        err,
        dialect.loaded_dbapi.Error,
        connection_invalidated=lost,
        dialect=dialect,
    )
    return error


def pipeline_sync_problem(dbapi_connection: Any) -> str | None:
    """What keeps :meth:`DriverStatement.first_after` from working with the installed
    psycopg, or ``None``. It relies on ``Pipeline._enqueue_sync``, a private method: a Sync
    sent without waiting for it. Checked on ``dbapi_connection`` (in autocommit mode) with
    two flights of two statements each: split by that Sync, they must run as two
    transactions (``txid_current()`` differs), and the second must run although the first
    failed. A lost connection raises the driver's error; anything else is a problem."""
    first, second = dbapi_connection.cursor(), dbapi_connection.cursor()
    try:
        with dbapi_connection.pipeline() as pipeline:
            enqueue_sync = getattr(pipeline, "_enqueue_sync", None)
            if not callable(enqueue_sync):
                return "psycopg's Pipeline has no _enqueue_sync"
            first.execute("SELECT txid_current()")
            enqueue_sync()
            second.execute("SELECT txid_current()")
        if first.fetchone()[0] == second.fetchone()[0]:
            return "two statements split by Pipeline._enqueue_sync ran in one transaction"
        failed: Exception | None = None
        try:
            with dbapi_connection.pipeline() as pipeline:
                first.execute("SELECT 1 / 0")
                pipeline._enqueue_sync()
                second.execute("SELECT 2")
        except Exception as err:  # the first statement's error, raised as the flight ends
            failed = err
        if getattr(failed, "sqlstate", None) != "22012":  # division_by_zero
            return f"a failed statement in a pipeline raised {failed!r}"
        if second.pgresult is None or second.fetchone()[0] != 2:
            return "a statement after a failed one and its Sync did not run"
        return None
    except Exception as err:
        if dbapi_connection.closed or dbapi_connection.broken:
            raise
        return f"the check failed ({type(err).__name__}: {err})"
    finally:
        first.close()
        second.close()


def _warn_one_flight_off(problem: str) -> None:
    psycopg = sys.modules.get("psycopg")
    log.warning(
        "held completions: %s with psycopg %s (tested on %s); each is sent alone before the "
        "next claim instead (one more round trip per job)",
        problem,
        getattr(psycopg, "__version__", "?"),
        TESTED_PSYCOPG,
    )


PIPELINE_SYNC = SelfCheck(_warn_one_flight_off)
"""This process's answer for ``Pipeline._enqueue_sync`` (one check, one warning at most)."""


def pipeline_sync_verified(conn: Connection) -> bool:
    """Whether this process may send a held write and the next statement in one flight: the
    first call runs :func:`pipeline_sync_problem` on ``conn`` (an autocommit connection),
    logging one warning naming the installed psycopg when the answer is no; later calls
    return the same answer. A lost connection raises (SQLAlchemy's ``DBAPIError``) and
    leaves the question open for the next call."""

    def find_problem() -> str | None:
        try:
            return pipeline_sync_problem(conn.connection.driver_connection)
        except conn.dialect.loaded_dbapi.Error as err:  # raised only for a lost connection
            raise sqlalchemy_error(conn, err, "pipeline check", {}, lost=True) from err

    return PIPELINE_SYNC.verified(find_problem)


def forget_pipeline_verdict() -> None:
    """Check again at the next :func:`pipeline_sync_verified` (tests that change psycopg)."""
    PIPELINE_SYNC.forget()


__all__ = [
    "CURSOR_KEY",
    "PIPELINE_SYNC",
    "DriverStatement",
    "forget_pipeline_verdict",
    "pipeline_sync_problem",
    "pipeline_sync_verified",
    "run_together",
    "runs_on_driver",
]
