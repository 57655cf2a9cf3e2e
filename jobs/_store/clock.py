"""Where "now" comes from: the database's clock in production, a logical clock in tests.

Workers on different hosts never compare their own clocks. Every lease is set and
checked with a SQL expression evaluated by the database inside the statement that
uses it, so the only clock that matters is the server's. A :class:`LogicalClock`
swaps that expression for a bound parameter whose value it supplies at each execution,
which makes lease tests and the seed simulation deterministic without sleeping.

Either way a statement built once runs on any clock: the database's clock is SQL, a
logical clock is a bound parameter (``clock_now``), and :meth:`Clock.values` gives the
values of a clock's parameters to pass with each execution of a reusable statement
(``{}`` for the database's clock). So the store's hot path (:mod:`jobs._store.driver`) runs
the same statement whichever clock a store has.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Protocol

from sqlalchemy import DateTime, Float, bindparam, literal
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import TypeDecorator

UTC = dt.UTC


class UtcDateTime(TypeDecorator[dt.datetime]):
    """A timezone-aware UTC instant on every backend.

    PostgreSQL keeps ``timestamptz``; SQLite has no time zones, so values are stored
    as naive UTC text with microseconds (the same format :class:`db_now` produces,
    so text comparison in SQLite orders instants correctly) and read back as UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given where an aware UTC instant is required")
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        assert isinstance(value, dt.datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class db_now(FunctionElement[dt.datetime]):
    """The database server's current instant, evaluated when the statement runs."""

    type = UtcDateTime()
    inherit_cache = True
    name = "db_now"


class db_now_plus(FunctionElement[dt.datetime]):
    """The database server's current instant plus a number of seconds."""

    type = UtcDateTime()
    inherit_cache = True
    name = "db_now_plus"


class instant_plus(FunctionElement[dt.datetime]):
    """An instant (a SQL expression: a bound parameter) plus a number of seconds."""

    type = UtcDateTime()
    inherit_cache = True
    name = "instant_plus"


# clock_timestamp(), not now(): now() is the start of the transaction, and a claim
# that waited on a row lock must not see an instant from before it waited.
@compiles(db_now, "postgresql")
def _pg_now(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "clock_timestamp()"


@compiles(db_now_plus, "postgresql")
def _pg_now_plus(element: db_now_plus, compiler: SQLCompiler, **kw: Any) -> str:
    return f"(clock_timestamp() + make_interval(secs => {compiler.process(element.clauses, **kw)}))"


@compiles(instant_plus, "postgresql")
def _pg_instant_plus(element: instant_plus, compiler: SQLCompiler, **kw: Any) -> str:
    instant, seconds = (compiler.process(clause, **kw) for clause in element.clauses)
    return f"({instant} + make_interval(secs => {seconds}))"


# SQLite's CURRENT_TIMESTAMP has one-second precision; strftime('%f') has milliseconds.
_SQLITE_FORMAT = "'%Y-%m-%d %H:%M:%f000'"


@compiles(db_now, "sqlite")
def _sqlite_now(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return f"strftime({_SQLITE_FORMAT}, 'now')"


@compiles(db_now_plus, "sqlite")
def _sqlite_now_plus(element: db_now_plus, compiler: SQLCompiler, **kw: Any) -> str:
    seconds = compiler.process(element.clauses, **kw)
    return f"strftime({_SQLITE_FORMAT}, 'now', printf('%+.6f seconds', {seconds}))"


@compiles(instant_plus, "sqlite")
def _sqlite_instant_plus(element: instant_plus, compiler: SQLCompiler, **kw: Any) -> str:
    instant, seconds = (compiler.process(clause, **kw) for clause in element.clauses)
    return f"strftime({_SQLITE_FORMAT}, {instant}, printf('%+.6f seconds', {seconds}))"


def seconds_of(seconds: float | ColumnElement[float]) -> ColumnElement[float]:
    """A number of seconds as SQL: a bound parameter stays one, a number becomes a literal."""
    if isinstance(seconds, ColumnElement):
        return seconds
    return literal(float(seconds), Float())


class Clock(Protocol):
    """Where the store's instants come from, as SQL expressions: every lease, due time and
    history instant is computed by the database from one clock, never by a worker's."""

    def now(self) -> ColumnElement[dt.datetime]:
        """The current instant."""
        ...

    def after(self, seconds: float | ColumnElement[float]) -> ColumnElement[dt.datetime]:
        """``seconds`` from now (negative: in the past); a bound parameter makes a
        statement reusable for any number of seconds."""
        ...

    def values(self) -> dict[str, Any]:
        """The current values of the clock's own bound parameters, to pass with each
        execution of a statement built once (``{}`` when the clock is plain SQL)."""
        ...


class DatabaseClock:
    """The production clock: the database server's."""

    def now(self) -> ColumnElement[dt.datetime]:
        """``clock_timestamp()`` on PostgreSQL, the millisecond clock on SQLite."""
        return db_now()

    def after(self, seconds: float | ColumnElement[float]) -> ColumnElement[dt.datetime]:
        """``seconds`` from now; a bound parameter makes a statement reusable for any value."""
        return db_now_plus(seconds_of(seconds))

    def values(self) -> dict[str, Any]:
        """None: the database's clock is SQL (``clock_timestamp()``)."""
        return {}


CLOCK_NOW = "clock_now"
"""The name of a logical clock's bound parameter (no column has it)."""


class LogicalClock:
    """A clock that only moves when told to: one tick is one second after ``EPOCH``."""

    EPOCH = dt.datetime(2000, 1, 1, tzinfo=UTC)

    def __init__(self, tick: float = 0) -> None:
        self.tick = tick

    def advance(self, ticks: float = 1) -> float:
        """Move the clock forward ``ticks`` seconds; returns the new tick."""
        self.tick += ticks
        return self.tick

    def instant(self, tick: float | None = None) -> dt.datetime:
        """The instant of ``tick`` (default: now)."""
        return self.EPOCH + dt.timedelta(seconds=self.tick if tick is None else tick)

    def ticks_of(self, instant: dt.datetime | None) -> float | None:
        """The tick of a stored instant (``None`` stays ``None``), for readable tests."""
        if instant is None:
            return None
        return (instant - self.EPOCH).total_seconds()

    def now(self) -> ColumnElement[dt.datetime]:
        """The current tick's instant, as the bound parameter ``clock_now``: its value is
        read at each execution (from :meth:`values`, or else from the clock itself)."""
        return bindparam(CLOCK_NOW, type_=UtcDateTime(), callable_=self.instant)

    def after(self, seconds: float | ColumnElement[float]) -> ColumnElement[dt.datetime]:
        """``seconds`` past the current tick: a bound parameter's seconds added by the
        database to ``clock_now`` (a statement built once), a number's added here, to the
        microsecond (SQLite's own arithmetic keeps milliseconds), as a bound parameter of
        its own whose value is read at each execution."""
        if isinstance(seconds, ColumnElement):
            return instant_plus(self.now(), seconds)
        return bindparam(
            None, type_=UtcDateTime(), callable_=lambda: self.instant(self.tick + seconds)
        )

    def values(self) -> dict[str, Any]:
        """``clock_now``: the current tick's instant."""
        return {CLOCK_NOW: self.instant()}
