"""Celery's own calls on an app with durable jobs reach the job table:
``app.AsyncResult(job_id)`` gives the job's :class:`jobs.results.JobResult`, and
``app.control.revoke(job_id)`` cancels the job durably before Celery broadcasts the revoke
as it always does. IDs that are not jobs get exactly Celery's behaviour.
(:func:`jobs.contrib.celery.install` calls :func:`wrap_results_and_revoke`.)
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable
from typing import Any

from jobs._core.errors import IllegalTransition, InvalidInput, UnknownJob
from jobs._core.validate import check_lookup_id
from jobs.application import JobsApp
from jobs.results import JobResult

log = logging.getLogger("jobs")

WRAPPED = "durable_jobs_control"
"""The attribute set on a Celery app once its result and revoke calls are wrapped."""


def wrap_results_and_revoke(celery: Any, jobs_app: JobsApp) -> None:
    """Make ``celery.AsyncResult`` answer a job's ID with its :class:`JobResult`, and
    ``celery.control.revoke`` cancel jobs durably (:func:`revoke_jobs`), then broadcast as
    Celery does. Wrapping the same app twice is a no-op."""
    if getattr(celery, WRAPPED, False):
        return
    celerys_result = celery.AsyncResult
    celerys_send_task = celery.send_task
    celerys_revoke = celery.control.revoke

    def async_result(task_id: Any, **options: Any) -> Any:
        """A job's handle for a job's ID asked for alone (``app.AsyncResult(job_id)``);
        Celery's own result for anything else, and for Celery's internal calls (which
        name the backend or the task)."""
        if not options and is_job(jobs_app, task_id):
            return JobResult(task_id, jobs_app)
        return celerys_result(task_id, **options)

    def send_task(*args: Any, result_cls: Any = None, **options: Any) -> Any:
        """Celery's ``send_task``, whose result for a plain task is Celery's own (no look-up
        in the job table for the ID it just made)."""
        return celerys_send_task(*args, result_cls=result_cls or celerys_result, **options)

    def revoke(task_id: Any, *args: Any, terminate: bool = False, **options: Any) -> Any:
        """Cancel the jobs among ``task_id`` (one ID or a list) durably, then broadcast the
        revoke as Celery does (its workers then skip, or with ``terminate`` end, a plain
        task of that ID)."""
        revoke_jobs(jobs_app, _ids(task_id), terminate=terminate)
        return celerys_revoke(task_id, *args, terminate=terminate, **options)

    celery.AsyncResult = async_result
    celery.send_task = send_task
    celery.control.revoke = revoke
    setattr(celery, WRAPPED, True)


def is_job(jobs_app: JobsApp, task_id: Any) -> bool:
    """Whether ``task_id`` names a job in the job table. A job table that cannot be read
    answers no (logged in one line), so Celery's results go on working through an outage."""
    if not isinstance(task_id, str):
        return False
    try:
        check_lookup_id(task_id)
        jobs_app.jobs.get(task_id)
    except (UnknownJob, InvalidInput):
        return False
    except Exception as err:  # the database is down: plain tasks' results must still work
        log.warning("AsyncResult(%.64r): job table not read (%s)", task_id, type(err).__name__)
        return False
    return True


def revoke_jobs(jobs_app: JobsApp, job_ids: Iterable[str], *, terminate: bool = False) -> list[str]:
    """Cancel each of ``job_ids`` that is an unfinished job, recording in its history that
    Celery's revoke did it, from which host and process; returns the IDs cancelled. IDs
    that are not jobs, and jobs already ended, are left to Celery. A running job stops at
    its next step whether or not ``terminate`` was asked (its next fenced write is refused)."""
    who = f"{socket.gethostname()}:{os.getpid()}"
    reason = f"revoked through Celery's app.control.revoke from {who}" + (
        " (terminate=True)" if terminate else ""
    )
    cancelled = []
    for job_id in job_ids:
        if not is_job(jobs_app, job_id):
            continue
        try:
            jobs_app.operator.cancel(job_id, reason)
        except IllegalTransition:
            continue  # already ended: as Celery's revoke of a finished task, nothing
        cancelled.append(job_id)
    return cancelled


def _ids(task_id: Any) -> list[str]:
    if isinstance(task_id, str):
        return [task_id]
    if isinstance(task_id, Iterable):
        return [one for one in task_id if isinstance(one, str)]
    return []
