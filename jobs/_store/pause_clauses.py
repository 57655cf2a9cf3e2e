"""Pauses (``jobctl pause``): the SQL condition that a job row is of no paused kind and on
no paused queue, which the claim's compare-and-set, the sweeper's doorbells and the depth
reads all use, and the checks of what may be paused. The writes are
:class:`jobs._store.pauses.Pauses`'."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Row, exists, literal, or_, select

from jobs._core.errors import InvalidInput
from jobs._core.records import Pause
from jobs._core.validate import check_name, check_queue_name
from jobs._store.tables import JobsTable, PausesTable

KIND = "kind"
"""A pause of one job kind: ``jobctl pause KIND``."""

QUEUE = "queue"
"""A pause of one queue (every kind whose doorbells go there): ``jobctl pause --queue Q``."""

SCOPES = (KIND, QUEUE)

PAUSE_COLUMNS = tuple(PausesTable.__table__.c)


def pause_of(row: Row[Any]) -> Pause:
    """A :class:`Pause` from a ``job_pauses`` row."""
    return Pause(
        row.scope, row.name, row.paused_at, row.paused_by, row.reason, bool(row.default_queue)
    )


def holding(pauses: Sequence[Pause], kind: str, queue: str | None) -> Pause | None:
    """The pause that holds a job of ``kind`` on ``queue`` (``None``: ``JOBS_QUEUE``), if
    any: its kind's first, else its queue's."""
    for pause in pauses:
        if pause.scope == KIND and pause.name == kind:
            return pause
    for pause in pauses:
        on_it = pause.name == queue or (queue is None and pause.default_queue)
        if pause.scope == QUEUE and on_it:
            return pause
    return None


def _scope(scope: str) -> ColumnElement[Any]:
    return literal(scope, PausesTable.scope.type)


def kind_paused() -> ColumnElement[bool]:
    """The job row's kind is paused."""
    return exists(
        select(PausesTable.name).where(
            PausesTable.scope == _scope(KIND), PausesTable.name == JobsTable.kind
        )
    )


def queue_paused() -> ColumnElement[bool]:
    """The job row's queue is paused (a pause of ``JOBS_QUEUE`` holds the jobs that name no
    queue: their ``queue`` is NULL)."""
    return exists(
        select(PausesTable.name).where(
            PausesTable.scope == _scope(QUEUE),
            or_(
                PausesTable.name == JobsTable.queue,
                JobsTable.queue.is_(None) & PausesTable.default_queue,
            ),
        )
    )


def not_paused() -> ColumnElement[bool]:
    """The job row is of no paused kind and on no paused queue: a claim may take it and the
    sweeper may ring it. Two indexed look-ups in a table of a few rows."""
    return ~kind_paused() & ~queue_paused()


def check_target(kind: str | None, queue: str | None) -> tuple[str, str]:
    """``(scope, name)`` of a pause's target: exactly one of a kind or a queue, valid."""
    if (kind is None) == (queue is None):
        raise InvalidInput("give a job kind or a queue to pause or resume, exactly one")
    if kind is not None:
        check_name(kind, "job kind")
        return KIND, kind
    assert queue is not None
    check_queue_name(queue, "queue")
    return QUEUE, queue


__all__ = [
    "KIND",
    "PAUSE_COLUMNS",
    "QUEUE",
    "SCOPES",
    "check_target",
    "holding",
    "kind_paused",
    "not_paused",
    "pause_of",
    "queue_paused",
]
