"""The signals that stop a handler at a call and tell the runner what to do with its job.

Each derives from BaseException, so a handler's ``except Exception`` cannot swallow it:
wait for approval, sleep, hand back, time out, fail as unstorable or as diverged (the
context's), and wait for children or an event (the workflow calls'). The runner turns each
into the job's state change.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from jobs._core.errors import InvalidInput, NonDeterministic

T = TypeVar("T")


class JobInterrupt(BaseException):
    """Stops a handler at a step boundary; the runner turns it into a state change."""


class WaitingForApproval(JobInterrupt):
    """Raised by :meth:`JobContext.wait_for_approval` on a first run: the runner parks the
    job in WAITING_APPROVAL (lease released) until ``jobs.approve`` or a cancel."""

    def __init__(
        self,
        reason: str,
        step_name: str,
        timeout: float | None = None,
        position: int | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.step_name = step_name
        self.timeout = timeout
        self.position = position  # the call's place in the handler's sequence


class Sleeping(JobInterrupt):
    """A durable timer: the job goes back to the queue, due at ``wake_at`` (the database's
    clock), with the timer recorded as step ``name`` in the same write."""

    def __init__(self, name: str, wake_at: dt.datetime, position: int | None = None) -> None:
        super().__init__(f"sleep until {wake_at.isoformat()} (timer {name!r})")
        self.name = name
        self.wake_at = wake_at
        self.position = position  # the timer's place in the handler's sequence


#: A timer's recorded output: ``{"wake_at": "<ISO 8601 instant, UTC>"}``.
WAKE_AT = "wake_at"


def wake_at_of(output: Any) -> dt.datetime | None:
    """The wake-up instant of a recorded timer step; ``None`` for any other step."""
    if isinstance(output, dict) and set(output) == {WAKE_AT} and isinstance(output[WAKE_AT], str):
        try:
            return dt.datetime.fromisoformat(output[WAKE_AT])
        except ValueError:
            return None
    return None


class HandBack(JobInterrupt):
    """The run used up its time budget for one delivery: give the job back to the queue."""


class TimedOut(JobInterrupt):
    """The run or a step passed its time limit (noticed by the handler's own thread when no
    heartbeat watches the run): the attempt counts, and the job is retried or FAILED."""


class Unstorable(JobInterrupt):
    """A step name, step output or approval reason that can never be recorded: the job
    fails now with the reason; retrying would only run the step's side effect again."""


class Diverged(JobInterrupt):
    """The handler asked for a step other than the one recorded at that place in its
    sequence of calls (or returned while recorded steps were never asked for): the job
    fails now with :attr:`error`, a :class:`jobs.NonDeterministic`, its recorded steps kept.
    An interrupt, so a handler's ``except Exception`` cannot swallow it."""

    def __init__(self, error: NonDeterministic) -> None:
        super().__init__(str(error))
        self.error = error


class WaitingForChildren(BaseException):
    """Raised by ``ctx.wait_for`` while children are unfinished: the runner parks the job
    WAITING (:meth:`JobStore.wait_for_children`). A BaseException, like the context's
    other interrupts, so a handler's ``except Exception`` cannot swallow it."""

    def __init__(self, child_ids: Sequence[str], step_name: str) -> None:
        super().__init__(f"waiting for {len(child_ids)} children (step {step_name!r})")
        self.child_ids = list(child_ids)
        self.step_name = step_name


class WaitingForEvent(BaseException):
    """Raised by ``ctx.wait_for_event`` when the event has not come: the runner parks the
    job WAITING until it comes or ``timeout`` passes (:meth:`JobStore.wait_for_event`)."""

    def __init__(
        self, name: str, step_name: str, timeout: float | None, position: int | None = None
    ) -> None:
        super().__init__(f"waiting for event {name!r} (step {step_name!r})")
        self.name = name
        self.step_name = step_name
        self.timeout = timeout
        self.position = position  # the wait's place in the handler's sequence


def storable(check: Callable[[], T]) -> T:
    """``check()``'s value; its :class:`InvalidInput` becomes :class:`Unstorable` (a name or
    value the run was about to record that can never be stored fails the job now)."""
    try:
        return check()
    except InvalidInput as err:
        raise Unstorable(str(err)) from None


__all__ = [
    "WAKE_AT",
    "Diverged",
    "HandBack",
    "JobInterrupt",
    "Sleeping",
    "TimedOut",
    "Unstorable",
    "WaitingForApproval",
    "WaitingForChildren",
    "WaitingForEvent",
    "storable",
    "wake_at_of",
]
