"""Where an operation's writes commit, and the one place its doorbells ring: after that
commit.

An operation (a submit, an approval, a retry …) either commits alone or joins the
caller's transaction, so that the job commits or rolls back with the caller's own data.
:class:`Transactions` decides which, for every service of an application, and rings the
doorbells a write owes once the write is durable, never before.

A :class:`UnitOfWork` is what an operation needs from a caller's transaction: a
SQLAlchemy ``Connection`` inside it, and a way to run something once it has committed.
Three adapters come with the project: a SQLAlchemy ``Connection`` and a SQLAlchemy
``Session`` (also what Flask-SQLAlchemy hands out), in :mod:`jobs._service.sqlalchemy_units`,
and Django's connection (``jobs.contrib.django``). A rollback drops the pending doorbells with
the rows; a process that dies between the commit and the publish leaves QUEUED jobs whose
doorbell the sweeper sends once ``JOBS_RING_AGAIN_AFTER_SECONDS`` has passed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, TypeVar

from jobs._core.records import Doorbell, Job, Ring, doorbell_of

if TYPE_CHECKING:  # the ORM only where a caller brings a Session (workers never load it)
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session, scoped_session

MaybeJob = TypeVar("MaybeJob", Job, "Job | None")
"""What a write of one job returns: the job it moved, or (an event no job waited for) none."""


class UnitOfWork(Protocol):
    """A caller's transaction that a submit joins."""

    @property
    def connection(self) -> Connection:
        """A connection inside the caller's transaction; the store writes through it."""
        ...

    def after_commit(self, doorbells: Sequence[Doorbell], ring: Ring) -> None:
        """Call ``ring(doorbells)`` once the caller's transaction has committed; never if it
        rolls back."""
        ...


class JoinKeywords(TypedDict, total=False):
    """The keywords by which an operation joins the caller's transaction, declared once
    for every operation that takes them (``submit``, ``submit_many``, ``apply_async``,
    ``approve``, ``wake``, ``retry``, ``cancel``, ``send_event``): a SQLAlchemy
    ``connection`` in a transaction, a SQLAlchemy ``session``, or a :class:`UnitOfWork`."""

    connection: Connection | None
    session: Session | scoped_session[Any] | None
    unit: UnitOfWork | None


def check_keywords(operation: str, given: Mapping[str, Any], allowed: type) -> None:
    """Refuse a keyword the ``TypedDict`` ``allowed`` does not name, as Python refuses one a
    signature does not name (``**keywords: Unpack[…]`` accepts any at run time)."""
    unknown = sorted(set(given) - allowed.__optional_keys__ - allowed.__required_keys__)  # type: ignore[attr-defined]
    if unknown:
        raise TypeError(f"{operation}() got an unexpected keyword argument {unknown[0]!r}")


AmbientUnit = Callable[[], contextlib.AbstractContextManager["UnitOfWork | None"]]
"""Where an operation given no transaction finds the caller's own, if it is in one
(Django's ``transaction.atomic()``: ``jobs.contrib.django``)."""


class Transactions:
    """An application's rule for where its operations' writes commit, and the one place
    their doorbells ring.

    ``ring``: this process's ringer at the time of the call (``ProcessRuntime.ring``; the
    runtime is rebuilt after a fork). Services call :meth:`joined` around a write and
    :meth:`ring_after_commit` with the doorbells the write owes."""

    def __init__(self, ring: Callable[[], Ring]) -> None:
        self._ring = ring
        self._ambient: AmbientUnit | None = None

    def join_from(self, source: AmbientUnit | None) -> None:
        """Let an operation given no ``connection=``/``session=``/``unit=`` join the
        transaction ``source()`` finds the caller in (a context manager yielding a unit of
        work, or ``None`` when there is none): how a plain ``jobs.submit`` (or
        ``.delay()``, ``jobs.approve`` …) inside Django's ``transaction.atomic()`` commits
        or rolls back with it. ``None`` removes the source."""
        self._ambient = source

    def joined(self, join: JoinKeywords) -> contextlib.AbstractContextManager[UnitOfWork | None]:
        """The transaction an operation joins: the one it was given (``join``: the call's
        :class:`JoinKeywords`), else the caller's ambient one (:meth:`join_from`), else none
        (``None``: it commits alone)."""
        given = join.get("unit")
        connection, session = join.get("connection"), join.get("session")
        if connection is not None or session is not None:
            from jobs._service.sqlalchemy_units import unit_for  # noqa: PLC0415 - SQLAlchemy

            given = unit_for(connection, session, given)
        if given is not None or self._ambient is None:
            return contextlib.nullcontext(given)
        return self._ambient()

    def queue_one(
        self,
        write: Callable[[Connection | None], MaybeJob],
        join: JoinKeywords,
    ) -> MaybeJob:
        """Run ``write`` (a store write of one job, on the connection it is given, ``None``
        to commit alone) in the transaction :meth:`joined` finds, and ring the doorbell of
        the job it queued, if any, after that commit: what an operator's approve, wake and
        retry, and an event that wakes a job, all do."""
        with self.joined(join) as joined:
            job = write(None if joined is None else joined.connection)
            if job is not None:
                self.ring_after_commit(joined, [doorbell_of(job)])
        return job

    def ring_after_commit(self, unit: UnitOfWork | None, doorbells: Sequence[Doorbell]) -> None:
        """Ring ``doorbells`` now if the write committed alone (``unit`` is ``None``), else
        once the caller's transaction has; never on its rollback."""
        if not doorbells:
            return
        if unit is None:
            self._ring()(doorbells)
        else:
            unit.after_commit(doorbells, self._ring())
