"""A unit of work over Django's own database connection.

SQLAlchemy needs a ``Connection``; Django holds the DBAPI connection and its transaction.
The engine here never opens a connection of its own: its ``creator`` hands SQLAlchemy the
current thread's Django connection, wrapped so that SQLAlchemy's close, commit and
rollback do nothing (the transaction is Django's: ``atomic()`` commits or rolls it back).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections, transaction
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy import types as sqltypes
from sqlalchemy.dialects import sqlite
from sqlalchemy.pool import NullPool

from jobs._core.errors import SettingsError
from jobs._core.records import Doorbell, Ring

_DIALECTS = {"sqlite": "sqlite://", "postgresql": "postgresql+psycopg://"}


class _Borrowed:
    """Django's DBAPI connection as SQLAlchemy sees it: everything passes through except
    ending the transaction or the connection, which stay Django's business."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def close(self) -> None:
        """Django closes its own connection."""

    def commit(self) -> None:
        """Django's ``atomic()`` commits."""

    def rollback(self) -> None:
        """Django's ``atomic()`` rolls back."""

    def add_notice_handler(self, _handler: Any) -> None:
        """psycopg's notice logger, added by SQLAlchemy at each checkout: not on Django's
        long-lived connection."""


class _ConvertedDateTime(sqlite.DATETIME):
    """Django's SQLite connections parse DATETIME columns themselves (``detect_types``):
    take the datetime they hand back, parse only what is still text."""

    def result_processor(self, dialect: Any, coltype: Any) -> Callable[[Any], Any] | None:
        parse = super().result_processor(dialect, coltype)

        def process(value: Any) -> Any:
            if value is None or isinstance(value, dt.datetime) or parse is None:
                return value
            return parse(value)

        return process


class _Engines:
    """One borrowing engine per Django database alias (it holds no connection, so it is
    safe across forks and threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_alias: dict[str, Engine] = {}

    def get(self, alias: str) -> Engine:
        with self._lock:
            engine = self._by_alias.get(alias)
            if engine is None:
                vendor = connections[alias].vendor
                if vendor not in _DIALECTS:
                    raise SettingsError(
                        f"database {alias!r} is {vendor}: jobs support PostgreSQL and SQLite"
                    )
                options: dict[str, Any] = {}
                if vendor == "postgresql":
                    # Its probe wants a real psycopg connection; the job tables use no hstore.
                    options["use_native_hstore"] = False
                engine = create_engine(
                    _DIALECTS[vendor],
                    creator=lambda: _Borrowed(connections[alias].connection),
                    poolclass=NullPool,
                    pool_reset_on_return=None,
                    **options,
                )
                if vendor == "sqlite":
                    engine.dialect.colspecs = {
                        **engine.dialect.colspecs,
                        sqltypes.DateTime: _ConvertedDateTime,
                    }
                self._by_alias[alias] = engine
            return engine


ENGINES = _Engines()


class DjangoUnit:
    """Django's connection for ``using`` (default ``"default"``) inside ``atomic()``, as a
    :class:`jobs._service.unit.UnitOfWork`::

        with transaction.atomic(), DjangoUnit() as unit:
            order = Order.objects.create(...)
            jobs.submit("check_order", {"order_id": order.pk}, unit=unit)

    The doorbell rings from ``transaction.on_commit``; a rollback drops it with the job.
    """

    def __init__(self, using: str | None = None) -> None:
        self.using = using or "default"
        self._connection: Connection | None = None

    def __enter__(self) -> DjangoUnit:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def connection(self) -> Connection:
        """A SQLAlchemy ``Connection`` on Django's connection, inside its ``atomic()``."""
        if self._connection is None:
            django_connection = connections[self.using]
            if not django_connection.in_atomic_block:
                raise transaction.TransactionManagementError(
                    "jobs.contrib.django: submit inside transaction.atomic() "
                    "(or use jobs.contrib.django.submit, which opens one)"
                )
            django_connection.ensure_connection()
            self._connection = ENGINES.get(self.using).connect()
        return self._connection

    def after_commit(self, doorbells: Sequence[Doorbell], ring: Ring) -> None:
        """Ring from ``transaction.on_commit`` (dropped by Django on a rollback)."""
        owed = list(doorbells)
        transaction.on_commit(lambda: ring(owed), using=self.using, robust=True)

    def close(self) -> None:
        """Give the borrowed connection back (Django's transaction goes on untouched)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
