"""durable jobs: Celery delivers a job ID; the database holds the job.

Public API::

    import jobs

    @jobs.job("check_order", max_attempts=3)
    def check_order(ctx, order_id):
        order = ctx.step("lookup", fetch_order, order_id)
        ctx.wait_for_approval("refund over limit")
        return ctx.step("refund", refund, order)

    job_id = jobs.submit("check_order", {"order_id": 42})
    jobs.approve(job_id, by="alice")
    result = check_order.delay(order_id=42)   # Celery's way: a jobs.JobResult handle

Importing :mod:`jobs` imports no Celery, no SQLAlchemy and none of ``JOBS_IMPORTS``: a
module that only defines jobs stays light (a worker's main process never connects to the
database), and the operations load what they need on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from jobs._core.context import JobContext
from jobs._core.errors import (
    AdmissionRefused,
    ChildFailed,
    DuplicateJob,
    EventTimedOut,
    IllegalTransition,
    InvalidInput,
    JobCancelled,
    JobError,
    LeaseLost,
    NonDeterministic,
    NothingToWake,
    SettingsError,
    StepError,
    UnknownJob,
    UnknownKind,
)
from jobs._core.registry import REGISTRY
from jobs._core.signatures import Signature
from jobs._core.states import TRANSITIONS, State
from jobs.tasks import JobTask, job

if TYPE_CHECKING:
    from jobs._core.async_context import AsyncJobContext
    from jobs._core.records import Job, JobFilter, KindLimits, Pause, Resumed, Step, Transition
    from jobs._core.schedule_ticks import Schedule
    from jobs._service.options import SubmitOptions
    from jobs.application import (
        JobsApp,
        approve,
        cancel,
        children,
        default_app,
        get,
        history,
        list_jobs,
        reset,
        retry,
        ring,
        schedule,
        schedules,
        seed_limits,
        send_event,
        set_doorbell,
        set_limits,
        steps,
        submit,
        submit_many,
        unschedule,
        wake,
    )
    from jobs.results import JobFailure, JobResult

#: Where the names of ``__all__`` not imported above come from, each module imported when
#: one of its names is first read, in this order (the first that has the name gives it).
_LAZY_FROM = (
    "jobs._core.async_context",  # asyncio: imported only for an async handler's context
    "jobs._core.records",
    "jobs._core.schedule_ticks",
    "jobs._service.options",
    "jobs.application",
    "jobs.results",  # Celery's result states: imported only for the result handle
)


def __getattr__(name: str) -> Any:
    """The operations and record types, imported on first use (PEP 562)."""
    if name in __all__:
        for module_name in _LAZY_FROM:
            module = importlib.import_module(module_name)
            if hasattr(module, name):
                value = getattr(module, name)
                globals()[name] = value
                return value
    raise AttributeError(f"module 'jobs' has no attribute {name!r}")


__all__ = [
    "REGISTRY",
    "TRANSITIONS",
    "AdmissionRefused",
    "AsyncJobContext",
    "ChildFailed",
    "DuplicateJob",
    "EventTimedOut",
    "IllegalTransition",
    "InvalidInput",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobError",
    "JobFailure",
    "JobFilter",
    "JobResult",
    "JobTask",
    "JobsApp",
    "KindLimits",
    "LeaseLost",
    "NonDeterministic",
    "NothingToWake",
    "Pause",
    "Resumed",
    "Schedule",
    "SettingsError",
    "Signature",
    "State",
    "Step",
    "StepError",
    "SubmitOptions",
    "Transition",
    "UnknownJob",
    "UnknownKind",
    "approve",
    "cancel",
    "children",
    "default_app",
    "get",
    "history",
    "job",
    "list_jobs",
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
    "unschedule",
    "wake",
]
