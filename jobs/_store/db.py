"""Engines that keep the store's promises on each backend.

SQLite needs three things for claims to be safe under contention: WAL (readers do
not block the writer), a busy timeout (writers queue instead of failing), and
``BEGIN IMMEDIATE`` (a deferred transaction that reads first fails its upgrade to a
write lock with "database is locked" whatever the timeout). pysqlite's own
transaction handling is switched off so that we issue the BEGIN ourselves.

PostgreSQL engines do not ping a pooled connection at every checkout (a round trip per
write on the hot path); a write that meets a connection the server closed is retried once
on a fresh one (:func:`retry_on_disconnect`). Single-statement writes run in autocommit
mode (:func:`autocommit`), which spares the ``BEGIN`` and ``COMMIT`` round trips.

A pooled connection must never cross a fork (Celery's prefork children inherit the
parent's pool): the process's runtime object (:mod:`jobs._worker.process`) owns its
engine and makes a new one in a child.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import StaticPool

from jobs._config.database_urls import database_hosts
from jobs._core.validate import load_json

T = TypeVar("T")

log = logging.getLogger("jobs.db")

OPTIONS_REFUSED = "unsupported startup parameter: options"
"""What PgBouncer with its default ``ignore_startup_parameters`` answers a connection that
carries the ``options`` start-up parameter (our session timeouts)."""

READ_ONLY = "jobs_read_only"
SQLITE_BUSY_TIMEOUT_MS = 30_000
IDLE_IN_TRANSACTION_MS = 15_000
# No statement of ours takes long; one that does is stuck (a lock, a dead server). Bounded
# so a worker or sweeper gets an error it can retry instead of hanging. Generous for
# `jobctl db upgrade`; behind a pooler set them on the role instead (deploy/README.md).
STATEMENT_TIMEOUT_MS = 120_000
LOCK_TIMEOUT_MS = 30_000
CONNECT_TIMEOUT_SECONDS = 10


def _prepare_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we send BEGIN ourselves
        cursor = dbapi_connection.cursor()
        if engine.url.database not in (None, "", ":memory:"):
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if conn.get_execution_options().get(READ_ONLY):
            conn.exec_driver_sql("BEGIN")
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: str, *, pooled: bool = False, **kwargs: Any) -> Engine:
    """A new engine for ``url`` with the per-backend settings the store relies on.

    ``pooled``: the URL reaches PostgreSQL through a pooler in transaction mode (PgBouncer),
    which refuses the ``options`` start-up parameter and cannot keep prepared statements
    across transactions (before PgBouncer 1.21): neither is used then."""
    parsed = make_url(url)
    # A stored value that cannot be read back loads as validate.Unloadable, not an error.
    kwargs.setdefault("json_deserializer", load_json)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        if database in (None, "", ":memory:"):
            kwargs.setdefault("poolclass", StaticPool)
            kwargs.setdefault("connect_args", {"check_same_thread": False})
        else:
            Path(database).parent.mkdir(parents=True, exist_ok=True)
            kwargs.setdefault("connect_args", {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        engine = create_engine(url, **kwargs)
        _prepare_sqlite(engine)
        return engine
    connect_args: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_SECONDS}
    if pooled:
        connect_args["prepare_threshold"] = None
    else:
        # Our transactions last milliseconds. One left open by a stopped (SIGSTOP) or wedged
        # process would hold its row locks and stall every sweeper and claim behind it.
        connect_args["options"] = session_options(own_options(parsed.query))
    kwargs.setdefault("connect_args", connect_args)
    engine = create_engine(url, **kwargs)
    if not pooled:
        _unprepare_behind_a_proxy(engine, url_ports_of(url))
        _without_options_where_refused(engine)
    return engine


SESSION_TIMEOUTS = (
    f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS} "
    f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c lock_timeout={LOCK_TIMEOUT_MS}"
)


def own_options(query: Any) -> str:
    """The ``options`` a URL's query names itself (``?options=-csearch_path%3Dtenant_a``),
    else libpq's ``PGOPTIONS``: what the session time-outs must not replace."""
    given = query.get("options")
    if isinstance(given, tuple):
        given = " ".join(given)
    return str(given) if given else os.environ.get("PGOPTIONS", "")


def session_options(own: str) -> str:
    """The ``options`` start-up parameter: our session time-outs, then the URL's own
    options, which therefore win for a setting both name (a tenant's ``search_path``,
    a longer ``statement_timeout``)."""
    return f"{SESSION_TIMEOUTS} {own}".strip()


def _without_options_where_refused(engine: Engine) -> None:
    """A pooler that refuses the ``options`` start-up parameter (PgBouncer's default) gets
    connections without it, and one warning naming ``JOBS_LIVENESS_DATABASE_URL``: the
    session timeouts are then not set, and liveness falls back to lease expiry (see
    :mod:`jobs._worker.liveness`)."""
    refused: list[bool] = []

    @event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, _record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        if refused:
            cparams.pop("options", None)
            return None  # the dialect connects with the parameters as they are now
        try:
            return dialect.connect(*cargs, **cparams)
        except Exception as err:
            if OPTIONS_REFUSED not in str(err) or "options" not in cparams:
                raise
        refused.append(True)
        log.warning(
            "the database (a pooler such as PgBouncer) refuses the 'options' start-up "
            "parameter: connecting without the session timeouts; set "
            "JOBS_LIVENESS_DATABASE_URL to a direct PostgreSQL URL (deploy/README.md), or "
            "ignore_startup_parameters = extra_float_digits, options in pgbouncer.ini"
        )
        cparams.pop("options", None)
        return dialect.connect(*cargs, **cparams)


def url_ports_of(url: str) -> set[int]:
    """Every port a PostgreSQL URL names (a libpq host list names several; 5432 when one
    is left out): a server listening on one of them is reached directly, not via a proxy."""
    try:
        return {port or 5432 for _host, port in database_hosts(url)}
    except ValueError:
        return {5432}


def _unprepare_behind_a_proxy(engine: Engine, url_ports: set[int]) -> None:
    """A connection that reaches a server listening on another port than the URL's goes
    through a proxy, maybe a pooler in transaction mode, which (before PgBouncer 1.21)
    loses psycopg's prepared statements between transactions: prepare nothing there."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SELECT inet_server_port()")
            row = cursor.fetchone()
        finally:
            cursor.close()
        dbapi_connection.rollback()
        server_port = None if row is None else row[0]  # a DBAPI row: a tuple, one column
        if server_port is not None and int(server_port) not in url_ports:
            dbapi_connection.prepare_threshold = None


@contextlib.contextmanager
def autocommit(engine: Engine) -> Iterator[Connection]:
    """A pooled connection in autocommit mode, for a write that is one statement: the
    statement commits on its own, with no ``BEGIN``/``COMMIT`` round trips around it."""
    with engine.connect() as conn:
        yield conn.execution_options(isolation_level="AUTOCOMMIT")


def retry_on_disconnect(attempt: Callable[[], T]) -> T:
    """Run ``attempt``; if it met a pooled connection the server had closed (a database
    restart, an idle timeout), run it once more on a fresh one. SQLAlchemy then discards
    the whole pool's older connections, so one retry is enough. Only for writes whose
    retry is safe: fenced compare-and-sets, which refuse a second application."""
    try:
        return attempt()
    except DBAPIError as err:
        if not err.connection_invalidated:
            raise
    return attempt()
