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

Importing :mod:`jobs` imports no Celery and none of ``JOBS_IMPORTS``; both load on first need.
"""

from jobs.api import (
    approve,
    cancel,
    dispatch,
    get,
    history,
    list_jobs,
    seed_limits,
    set_dispatcher,
    set_limits,
    steps,
    submit,
    submit_many,
)
from jobs.core.context import JobContext
from jobs.core.errors import (
    AdmissionRefused,
    DuplicateJob,
    IllegalTransition,
    InvalidInput,
    JobError,
    LeaseLost,
    SettingsError,
    StepError,
    UnknownJob,
    UnknownKind,
)
from jobs.core.registry import REGISTRY, job
from jobs.core.states import TRANSITIONS, State
from jobs.core.store import Job, KindLimits, Step, Transition

__all__ = [
    "REGISTRY",
    "TRANSITIONS",
    "AdmissionRefused",
    "DuplicateJob",
    "IllegalTransition",
    "InvalidInput",
    "Job",
    "JobContext",
    "JobError",
    "KindLimits",
    "LeaseLost",
    "SettingsError",
    "State",
    "Step",
    "StepError",
    "Transition",
    "UnknownJob",
    "UnknownKind",
    "approve",
    "cancel",
    "dispatch",
    "get",
    "history",
    "job",
    "list_jobs",
    "seed_limits",
    "set_dispatcher",
    "set_limits",
    "steps",
    "submit",
    "submit_many",
]
