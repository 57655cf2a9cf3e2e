"""The public operations (``jobs.submit``, ``jobs.approve`` …) on the process's default app.

Each is the method of the same name of :class:`jobs.application.JobsApp`, called on
:func:`jobs.application.default_app` at call time (so a test that resets the default app's
settings or runtime is followed). Code that holds an app of its own calls its methods.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

from jobs.application import JobsApp, default_app
from jobs.submit_options import new_job_id

P = ParamSpec("P")
R = TypeVar("R")

__all__ = [
    "approve",
    "cancel",
    "check_submit",
    "children",
    "get",
    "history",
    "list_jobs",
    "new_job_id",
    "reset",
    "retry",
    "ring",
    "schedule",
    "schedules",
    "seed_limits",
    "send_event",
    "set_doorbell",
    "set_limits",
    "steps",
    "submit",
    "submit_many",
    "sync_schedules",
    "unschedule",
    "wake",
]


def _on_default_app(method: Callable[Concatenate[JobsApp, P], R]) -> Callable[P, R]:
    """``method`` called on the default app, with the method's name, signature and
    docstring."""

    @functools.wraps(method)
    def on_default_app(*args: P.args, **kwargs: P.kwargs) -> R:
        return method(default_app(), *args, **kwargs)

    return on_default_app


submit = _on_default_app(JobsApp.submit)
submit_many = _on_default_app(JobsApp.submit_many)
check_submit = _on_default_app(JobsApp.check_submit)
ring = _on_default_app(JobsApp.ring)
get = _on_default_app(JobsApp.get)
steps = _on_default_app(JobsApp.steps)
history = _on_default_app(JobsApp.history)
list_jobs = _on_default_app(JobsApp.list_jobs)
approve = _on_default_app(JobsApp.approve)
wake = _on_default_app(JobsApp.wake)
cancel = _on_default_app(JobsApp.cancel)
retry = _on_default_app(JobsApp.retry)
send_event = _on_default_app(JobsApp.send_event)
children = _on_default_app(JobsApp.children)
set_limits = _on_default_app(JobsApp.set_limits)
seed_limits = _on_default_app(JobsApp.seed_limits)
schedule = _on_default_app(JobsApp.schedule)
unschedule = _on_default_app(JobsApp.unschedule)
schedules = _on_default_app(JobsApp.schedules)
sync_schedules = _on_default_app(JobsApp.sync_schedules)


def reset() -> None:
    """Close and forget the default app's store, engine and doorbell (after the settings
    changed, or between tests)."""
    default_app().reset()


def set_doorbell(ring_one: Callable[[str], Any] | None) -> None:
    """Replace the default app's doorbell with ``ring_one(job_id)``, called once per job
    after its QUEUED state committed (a test that records doorbells, an embedded user's own
    transport). ``None`` rings none: jobs then reach workers only through the sweeper,
    which rings them again, or an in-process :func:`jobs.testing.drain`. Kept until
    :func:`reset`. (:meth:`jobs.JobsApp.use_doorbell` takes a batch ringer instead.)"""
    if ring_one is None:
        default_app().use_doorbell(None)
        return
    ringer = ring_one

    def ring_each(job_ids: Sequence[str], priority: int = 0, **_: Any) -> None:
        for job_id in job_ids:
            ringer(job_id)

    default_app().use_doorbell(ring_each)
