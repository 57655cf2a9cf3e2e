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

from jobs.core.context import JobContext
from jobs.core.errors import (
    AdmissionRefused,
    ChildFailed,
    DuplicateJob,
    EventTimedOut,
    IllegalTransition,
    InvalidInput,
    JobError,
    LeaseLost,
    NothingToWake,
    SettingsError,
    StepError,
    UnknownJob,
    UnknownKind,
)
from jobs.core.registry import REGISTRY
from jobs.core.signatures import Signature
from jobs.core.states import TRANSITIONS, State
from jobs.tasks import JobTask, job

if TYPE_CHECKING:
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
    from jobs.core.records import Job, JobFilter, KindLimits, Pause, Resumed, Step, Transition
    from jobs.core.schedule import Schedule
    from jobs.results import JobFailure, JobResult
    from jobs.service.options import SubmitOptions

_LAZY = {
    **dict.fromkeys(
        (
            "approve",
            "cancel",
            "children",
            "default_app",
            "get",
            "history",
            "list_jobs",
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
        ),
        "jobs.application",
    ),
    **dict.fromkeys(
        ("Job", "JobFilter", "KindLimits", "Pause", "Resumed", "Step", "Transition"),
        "jobs.core.records",
    ),
    **dict.fromkeys(("JobsApp", "reset"), "jobs.application"),
    "SubmitOptions": "jobs.service.options",
    **dict.fromkeys(("JobFailure", "JobResult"), "jobs.results"),
    "Schedule": "jobs.core.schedule",
}


def __getattr__(name: str) -> Any:
    """The operations and record types, imported on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'jobs' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "REGISTRY",
    "TRANSITIONS",
    "AdmissionRefused",
    "ChildFailed",
    "DuplicateJob",
    "EventTimedOut",
    "IllegalTransition",
    "InvalidInput",
    "Job",
    "JobContext",
    "JobError",
    "JobFailure",
    "JobFilter",
    "JobResult",
    "JobTask",
    "JobsApp",
    "KindLimits",
    "LeaseLost",
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
