"""The job state machine: one table, read by the code and by every UPDATE's WHERE clause.

The store never writes a state change without deriving its allowed source states
from :data:`TRANSITIONS`, so the table below is the whole truth about what may follow what.
"""

from __future__ import annotations

import enum

from jobs._core.errors import IllegalTransition


class State(enum.StrEnum):
    """A job's state. COMPLETED, FAILED and CANCELLED are final for the system (no worker,
    sweeper or timer moves a job out of them); only an operator's retry takes a FAILED or
    CANCELLED job back to QUEUED. Every move between states is one entry of
    :data:`TRANSITIONS`, which every UPDATE's WHERE clause is built from. WAITING is a parked
    job (``ctx.wait_for``, ``ctx.map``, ``ctx.wait_for_event``): it holds no worker, lease or
    message until its last child finishes, its event arrives or its deadline passes."""

    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    WAITING_APPROVAL = "WAITING_APPROVAL"
    WAITING = "WAITING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


#: (from, to) -> who makes the move. ``None`` as the source is a job's birth (submit).
TRANSITIONS: dict[tuple[State | None, State], str] = {
    (None, State.QUEUED): "submit",
    (State.QUEUED, State.RUNNING): "a worker's claim",
    (State.RUNNING, State.RUNNING): "a new owner's claim after the old lease expired",
    (State.RUNNING, State.WAITING_APPROVAL): "the owner; the lease is released while waiting",
    (State.WAITING_APPROVAL, State.QUEUED): (
        "an approval, recording who approved, or its deadline passing (the sweeper)"
    ),
    (State.RUNNING, State.WAITING): (
        "the owner, parked for its children or an event; the lease is released while waiting"
    ),
    (State.WAITING, State.QUEUED): (
        "the last awaited child finishing (in its own finishing write), the awaited event "
        "arriving, or the wait's deadline passing (the sweeper)"
    ),
    (State.QUEUED, State.QUEUED): "an operator's wake: a job waiting on a timer made due now",
    (State.RUNNING, State.QUEUED): (
        "the sweeper after an expired lease, or the owner's retry, hand-back or sleep"
    ),
    (State.RUNNING, State.COMPLETED): "the owner",
    (State.RUNNING, State.FAILED): "the owner, or the sweeper once attempts are exhausted",
    (State.QUEUED, State.CANCELLED): "an operator",
    (State.WAITING_APPROVAL, State.CANCELLED): "an operator",
    (State.WAITING, State.CANCELLED): "an operator, or the cancel of its parent",
    (State.RUNNING, State.CANCELLED): "an operator; the owner notices at its next fenced write",
    (State.FAILED, State.QUEUED): (
        "an operator's retry: a fresh budget of attempts, the fence bumped, the recorded "
        "steps kept (the re-run starts at the step that failed) or, from the start, dropped"
    ),
    (State.CANCELLED, State.QUEUED): "an operator's retry, as from FAILED",
}

TERMINAL: frozenset[State] = frozenset({State.COMPLETED, State.FAILED, State.CANCELLED})

#: The states an operator's retry takes a job from (``jobs.retry``, ``jobctl retry``).
RETRYABLE: tuple[State, ...] = (State.FAILED, State.CANCELLED)


def is_legal(source: State | None, target: State) -> bool:
    """Whether the state table allows ``source`` -> ``target`` (``None``: a new job)."""
    return (source, target) in TRANSITIONS


def sources_of(target: State) -> tuple[State, ...]:
    """Every state a job may be in for a move into ``target``: the WHERE clause's ``state IN``."""
    return tuple(source for (source, to) in TRANSITIONS if to is target and source is not None)


#: The states an operator's cancel takes a job from, one job or many (``jobs.cancel``,
#: ``jobctl cancel``): every unfinished one, parked parents and event listeners included.
CANCELLABLE: tuple[State, ...] = sources_of(State.CANCELLED)

#: The states an operator's approval takes a job from, one job or many.
APPROVABLE: tuple[State, ...] = (State.WAITING_APPROVAL,)


def check(source: State | None, target: State) -> None:
    """Raise :class:`IllegalTransition` unless the table allows ``source -> target``."""
    if not is_legal(source, target):
        raise IllegalTransition(source, target)
