"""A submit's options and IDs: :class:`SubmitOptions`, a frozen value of how a submit asks
for its jobs (kept and reused, ``jobs.SubmitOptions``), :func:`chosen_options` (the options
with a call's keywords over them) and :func:`new_job_id` for a submit that names no job ID.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

from jobs._core.errors import InvalidInput
from jobs._core.validate import check_instant


def new_job_id() -> str:
    """A new random job ID (32 hex digits), for a submit that names none."""
    return uuid.uuid4().hex


@dataclasses.dataclass(frozen=True)
class SubmitOptions:
    """How a submit asks for its jobs, beside their kind and inputs: a value to keep and
    reuse (``URGENT = jobs.SubmitOptions(priority=9, queue="fast")``, then
    ``jobs.submit(kind, inputs, options=URGENT)``). A field left ``None`` takes the kind's
    default (``@jobs.job``), then the settings'; a keyword given to ``submit`` wins over the
    field of the same name. ``delay`` (seconds or a ``timedelta``) and ``run_at`` (an aware
    instant) say when the jobs start; at most one of them. ``concurrency_key`` keys the jobs
    for their kind's ``max_running_per_key``, over the key the kind takes from the inputs."""

    max_attempts: int | None = None
    delay: float | dt.timedelta | None = None
    run_at: dt.datetime | None = None
    priority: int | None = None
    queue: str | None = None
    # The jobs' concurrency key, over the one the kind takes from the inputs.
    concurrency_key: str | None = None

    def merged(self, **given: Any) -> SubmitOptions:
        """These options with the fields ``given`` (not ``None``) put over them."""
        chosen = {name: value for name, value in given.items() if value is not None}
        return dataclasses.replace(self, **chosen) if chosen else self

    def start(self) -> tuple[float, dt.datetime | None]:
        """When the jobs start: ``(delay in seconds, run_at)``, at most one of them given."""
        if self.delay is not None and self.run_at is not None:
            raise InvalidInput("give one of delay and run_at, not both")
        if self.run_at is not None:
            return 0.0, check_instant(self.run_at, "run_at")
        if isinstance(self.delay, dt.timedelta):
            return self.delay.total_seconds(), None
        return (0.0 if self.delay is None else self.delay), None


def chosen_options(
    options: SubmitOptions | None,
    max_attempts: int | None,
    delay: float | dt.timedelta | None,
    run_at: dt.datetime | None,
    priority: int | None,
    queue: str | None,
    concurrency_key: str | None = None,
) -> SubmitOptions:
    """A submit's options: ``options`` with the keywords given over them."""
    return (options or SubmitOptions()).merged(
        max_attempts=max_attempts,
        delay=delay,
        run_at=run_at,
        priority=priority,
        queue=queue,
        concurrency_key=concurrency_key,
    )


__all__ = ["SubmitOptions", "chosen_options", "new_job_id"]
