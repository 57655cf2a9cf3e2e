"""Starts read from the history, on the database's clock (each ``claimed`` transition):
how many fall in a window (a rate limit's check) and which claims a late tenant's jobs
were after their submission (fairness's check); shared by the rate-limit and fair-claim
acceptance tests."""

from __future__ import annotations

import datetime as dt
from typing import Protocol

from jobs._core.records import Transition
from jobs._core.states import State


class HasHistory(Protocol):
    """What these checks read of a stack: a job's history."""

    def history(self, job_id: str) -> list[Transition]: ...


def starts_of(stack: HasHistory, job_ids: list[str]) -> list[dt.datetime]:
    """Every claim of the jobs, from their history, in order."""
    return sorted(
        move.at
        for job_id in job_ids
        for move in stack.history(job_id)
        if move.to_state is State.RUNNING
    )


def most_in_window(starts: list[dt.datetime], seconds: float) -> int:
    """The most starts in any window of ``seconds`` (both ends included)."""
    window = dt.timedelta(seconds=seconds)
    most = 0
    for first, at in enumerate(starts):
        inside = [later for later in starts[first:] if later - at <= window]
        most = max(most, len(inside))
    return most


def claims_after(stack: HasHistory, job_ids: list[str], since: dt.datetime) -> list[str]:
    """The jobs of every claim at or after ``since``, in the order of the claims."""
    claims = sorted(
        (move.at, job_id)
        for job_id in job_ids
        for move in stack.history(job_id)
        if move.to_state is State.RUNNING
    )
    return [job_id for at, job_id in claims if at >= since]
