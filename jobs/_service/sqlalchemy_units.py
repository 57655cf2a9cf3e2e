"""The units of work for a caller's SQLAlchemy transaction: a ``Connection`` in a
transaction (:class:`ConnectionUnit`) and a ``Session`` (:class:`SessionUnit`, also what
Flask-SQLAlchemy hands out). A rollback drops the pending doorbells with the rows."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, event

from jobs._core.records import Doorbell

if TYPE_CHECKING:  # the ORM only where a caller brings a Session (workers never load it)
    from sqlalchemy.orm import Session, scoped_session

    from jobs._core.records import Ring
    from jobs._service.unit import UnitOfWork


class _Pending:
    """Doorbells waiting for one transaction's end."""

    def __init__(self) -> None:
        self.batches: list[tuple[list[Doorbell], Ring]] = []

    def ring_all(self) -> None:
        batches, self.batches = self.batches, []
        for doorbells, ring in batches:
            ring(doorbells)

    def drop(self) -> None:
        self.batches = []


_by_connection: weakref.WeakKeyDictionary[Connection, _Pending] = weakref.WeakKeyDictionary()
_by_session: weakref.WeakKeyDictionary[Session, _Pending] = weakref.WeakKeyDictionary()


class ConnectionUnit:
    """A SQLAlchemy ``Connection`` in a transaction (``with engine.begin() as conn``, or
    ``conn.commit()`` later).

    SQLAlchemy Core has no event after a commit, only one just before it. To ring after
    the data is durable, the hook commits the database connection itself at that point
    (SQLAlchemy's own commit that follows then finds nothing to commit) and rings once that
    succeeded; if the commit fails, the error propagates as it would have, and nothing rings.
    """

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    @property
    def connection(self) -> Connection:
        """The caller's connection, inside its transaction."""
        return self._connection

    def after_commit(self, doorbells: Sequence[Doorbell], ring: Ring) -> None:
        """Ring ``doorbells`` once the caller's transaction commits; nothing on a rollback."""
        pending = _by_connection.get(self._connection)
        if pending is None:
            pending = _by_connection[self._connection] = _Pending()
            _listen(self._connection, pending)
        pending.batches.append((list(doorbells), ring))


def _listen(connection: Connection, pending: _Pending) -> None:
    def on_commit(conn: Connection) -> None:
        if not pending.batches:
            return
        conn.connection.dbapi_connection.commit()  # type: ignore[union-attr]
        pending.ring_all()

    def on_rollback(conn: Connection) -> None:
        pending.drop()

    event.listen(connection, "commit", on_commit)
    event.listen(connection, "rollback", on_rollback)


class SessionUnit:
    """A SQLAlchemy ``Session`` (Flask-SQLAlchemy's ``db.session`` too): the job is written
    on the session's connection and rung from the session's ``after_commit`` event."""

    def __init__(self, session: Session) -> None:
        self._session = session

    @property
    def connection(self) -> Connection:
        """The session's connection (the session begins its transaction if it had none)."""
        return self._session.connection()

    def after_commit(self, doorbells: Sequence[Doorbell], ring: Ring) -> None:
        """Ring ``doorbells`` from the session's ``after_commit``; nothing on a rollback."""
        pending = _by_session.get(self._session)
        if pending is None:
            pending = _by_session[self._session] = _Pending()
            event.listen(self._session, "after_commit", lambda _session: pending.ring_all())
            event.listen(self._session, "after_rollback", lambda _session: pending.drop())
        pending.batches.append((list(doorbells), ring))


def unit_for(
    connection: Connection | None = None,
    session: Session | scoped_session[Any] | None = None,
    unit: UnitOfWork | None = None,
) -> UnitOfWork | None:
    """The unit of work a submit was given, or ``None`` for a submit that commits alone."""
    given = [value for value in (connection, session, unit) if value is not None]
    if len(given) > 1:
        raise TypeError("pass at most one of connection=, session= and unit=")
    if connection is not None:
        return ConnectionUnit(connection)
    if session is not None:
        from sqlalchemy.orm import scoped_session  # noqa: PLC0415 - the caller loaded it

        if isinstance(session, scoped_session):
            # Flask-SQLAlchemy's db.session: join this thread's session, not the registry
            # (whose events would fire for every session it ever makes).
            return SessionUnit(session())
        return SessionUnit(session)
    return unit


__all__ = ["ConnectionUnit", "SessionUnit", "unit_for"]
