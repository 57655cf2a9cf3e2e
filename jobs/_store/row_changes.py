"""What a state move writes to a job's row besides its state: :class:`RowChanges`, one
typed field per column (:data:`KEEP` leaves a column as it is), and the shapes the moves
share (an end, a hand-back, a park). :mod:`jobs._store.statements` turns one into the
``SET`` of a compare-and-set UPDATE.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy import ColumnElement

from jobs._core.records import Claim, PendingStep
from jobs._core.states import State
from jobs._store.tables import JobsTable


class _Keep(enum.Enum):
    KEEP = "keep"


KEEP: Final = _Keep.KEEP
"""A column a state move leaves as it is."""


@dataclasses.dataclass(frozen=True)
class RowChanges:
    """What a state move writes to the job's row besides its state (every move also sets
    ``previous_state`` and ``updated_at``): one field per column, :data:`KEEP` leaving the
    column as it is. A value is a plain value (a bound parameter in a reusable statement)
    or a SQL expression (the clock, ``attempts - 1``), which the statement carries inline.
    """

    owner: str | ColumnElement[Any] | _Keep | None = KEEP
    fence: ColumnElement[Any] | _Keep = KEEP
    lease_until: dt.datetime | ColumnElement[Any] | _Keep | None = KEEP
    liveness_key: int | ColumnElement[Any] | _Keep | None = KEEP
    attempts: int | ColumnElement[Any] | _Keep = KEEP
    run_after: dt.datetime | ColumnElement[Any] | _Keep = KEEP
    dispatched_at: dt.datetime | ColumnElement[Any] | _Keep | None = KEEP
    finished_at: ColumnElement[Any] | _Keep | None = KEEP
    last_error: str | _Keep = KEEP
    result: Any = KEEP
    waiting_for: str | _Keep | None = KEEP
    # The awaited call's place in the handler's sequence, for the write that records it.
    waiting_position: int | _Keep | None = KEEP
    # Workflows: a parked parent's count of unfinished awaited children, the event a job
    # waits for, and when its wait ends.
    children_pending: int | ColumnElement[Any] | _Keep = KEEP
    wait_event: str | _Keep | None = KEEP
    wait_deadline: dt.datetime | ColumnElement[Any] | _Keep | None = KEEP
    # The version of the job's kind recorded at its first claim (jobs._store.version_clauses).
    code_version: ColumnElement[Any] | _Keep = KEEP

    @classmethod
    def finished(cls, now: ColumnElement[Any], **changes: Any) -> RowChanges:
        """A move to an end state: no lease or liveness lock any more, finished ``now``."""
        return cls(lease_until=None, liveness_key=None, finished_at=now, **changes)

    @classmethod
    def given_back(cls, run_after: Any, dispatched_at: Any) -> RowChanges:
        """An owner's move back to QUEUED that is not a failure (a hand-back, a sleep): no
        owner or lease any more, and the attempt given back."""
        return cls(
            owner=None,
            lease_until=None,
            liveness_key=None,
            dispatched_at=dispatched_at,
            run_after=run_after,
            attempts=JobsTable.attempts - 1,
        )

    @classmethod
    def parked(
        cls, waiting_for: str, deadline: Any, position: int | None = None, **changes: Any
    ) -> RowChanges:
        """An owner's park (for an approval, its children or an event): no owner, lease or
        liveness key any more, the attempt given back, the step the wait will be recorded
        under and its position in the handler's calls, and its deadline (``None``: none)."""
        return cls(
            owner=None,
            lease_until=None,
            liveness_key=None,
            attempts=JobsTable.attempts - 1,
            waiting_for=waiting_for,
            waiting_position=position,
            wait_deadline=deadline,
            **changes,
        )

    @classmethod
    def wait_ended(cls, now: Any, *, rung: bool) -> RowChanges:
        """A wait for an event (or for anything, at its deadline) ended: back to QUEUED due
        ``now``, with nothing awaited any more; ``rung``: the caller rings it after the
        commit (else it is left unrung, for the sweeper)."""
        return cls(
            run_after=now,
            dispatched_at=now if rung else None,
            waiting_for=None,
            waiting_position=None,
            wait_event=None,
            wait_deadline=None,
        )

    def columns(self) -> dict[str, Any]:
        """The columns this move writes, by name."""
        return {
            name: value for name in _CHANGE_COLUMNS if (value := getattr(self, name)) is not KEEP
        }


_CHANGE_COLUMNS = tuple(field.name for field in dataclasses.fields(RowChanges))


@dataclasses.dataclass(frozen=True)
class OwnerMove:
    """A claim's owner's move of its job out of RUNNING, as every path that writes one
    takes it (alone, held for the next flight, in a shared flight, or a child's end that
    counts down its parent): to ``target``, writing ``changes`` besides the state, with
    ``reason`` in its history row and ``steps`` recorded in the same write."""

    claim: Claim
    target: State
    changes: RowChanges
    reason: str | None
    steps: Sequence[PendingStep] = ()


NO_CHANGES: Final = RowChanges()
"""A move that writes only the state (and ``previous_state``, ``updated_at``)."""


__all__ = ["KEEP", "NO_CHANGES", "OwnerMove", "RowChanges"]
