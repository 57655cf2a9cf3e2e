"""Celery task events for outcomes no delivery reported, so Flower tells the truth.

Flower knows a job only through the deliveries of its doorbells (each one a Celery task,
``jobs.<kind>`` with the job ID as its argument). Two outcomes happen where no delivery
can report them:

- the sweeper fails a job whose attempts ran out after crashes: the deliveries Flower saw
  ended long before (a crashed one, a redelivered one dropped while the dead owner's lease
  ran). :class:`OutcomeEvents` then sends the events of one more task of the job's kind
  and argument, received and failed with the job's error, so the job's newest task in
  Flower is FAILURE;
- a job cancelled (or revoked) while queued or running: the delivery that finds it
  cancelled (the doorbell of a queued one, or the run refused at its next fenced write)
  reports its own task as revoked (:func:`revoked_delivery`) instead of succeeded.

Events go only where task events are on (``JOBS_TASK_EVENTS``); a failure to send is
logged in one line, never raised: the job table already holds the truth.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from celery.exceptions import Ignore

from jobs._core.lazy import lazy_module
from jobs._core.states import State
from jobs._doorbell.queues import kind_task_name

if TYPE_CHECKING:  # a worker's main process loads no SQLAlchemy
    from jobs._core.records import Job
    from jobs._store import JobStore
    from jobs._worker import run_results
    from jobs._worker.run_results import RunResult
else:
    run_results = lazy_module("jobs._worker.run_results")

log = logging.getLogger("jobs")

SWEEPER_NODE = "jobs-sweeper@" + socket.gethostname()
"""The hostname the sweeper's events carry (Flower lists the node that sent them)."""


class OutcomeEvents:
    """Sends the task events of jobs that ended without a delivery (the sweeper's FAILED),
    through ``celery()``'s broker (its ``celeryev`` exchange, where Flower listens)."""

    def __init__(self, celery: Callable[[], Any], *, enabled: bool = True) -> None:
        self._celery = celery
        self.enabled = enabled

    def __call__(self, jobs: Sequence[Job]) -> int:
        """Announce each FAILED or CANCELLED job of ``jobs`` as one task received, then
        failed with its error (or revoked); returns how many were sent."""
        ended = [job for job in jobs if job.state in (State.FAILED, State.CANCELLED)]
        if not ended or not self.enabled:
            return 0
        try:
            with self._celery().events.default_dispatcher(hostname=SWEEPER_NODE) as dispatcher:
                for job in ended:
                    for event, fields in task_events_of(job):
                        dispatcher.send(event, **fields)
        except Exception as err:  # the broker may be down: the table already says it
            log.warning("task events of %d ended jobs not sent: %s", len(ended), err)
            return 0
        return len(ended)


def task_events_of(job: Job) -> list[tuple[str, dict[str, Any]]]:
    """The events of one task standing for how ``job`` ended: ``task-received`` (its kind's
    task name and the job ID as argument, as a doorbell's delivery shows) then
    ``task-failed`` with its error, or ``task-revoked``."""
    task_id = uuid.uuid4().hex
    received = {
        "uuid": task_id,
        "name": kind_task_name(job.kind),
        "args": repr((job.id,)),
        "kwargs": "{}",
        "retries": max(job.attempts - 1, 0),
        "eta": None,
        "expires": None,
        "root_id": task_id,
        "parent_id": None,
    }
    ended: tuple[str, dict[str, Any]]
    if job.state is State.FAILED:
        error = job.last_error or "failed"
        ended = (
            "task-failed",
            {
                "uuid": task_id,
                "exception": f"JobFailed('job {job.id} FAILED: {error}')",
                "traceback": f"job {job.id} FAILED: {error}",
            },
        )
    else:
        ended = (
            "task-revoked",
            {"uuid": task_id, "terminated": False, "signum": None, "expired": False},
        )
    return [("task-received", received), ended]


def ended_elsewhere(store: JobStore, result: RunResult) -> Job | None:
    """The job, when a delivery that did not run it to an end of its own (not claimed, or
    its run refused at a fenced write) finds it ended CANCELLED or FAILED by someone else
    (an operator, a revoke, the sweeper): Flower then shows the delivery as what became of
    the job (REVOKED, FAILURE), not as a success. One read, for those two outcomes only."""

    if result.outcome not in (run_results.Outcome.NOT_CLAIMED, run_results.Outcome.LEASE_LOST):
        return None
    try:
        job = store.reads.get(result.job_id)
    except Exception:  # gone (pruned) or unreadable: report the delivery as it went
        return None
    return job if job.state in (State.CANCELLED, State.FAILED) else None


def revoked_delivery(task: Any, job_id: str, events: bool) -> None:
    """End the delivery ``task`` of a job found CANCELLED as Celery ends a revoked task:
    its ``task-revoked`` event (where task events are on), the message acknowledged, no
    ``task-succeeded``. Raises Celery's ``Ignore``, which does exactly that."""
    if events:
        try:
            task.send_event("task-revoked", terminated=False, signum=None, expired=False)
        except Exception as err:  # the broker may be down: the table already says it
            log.warning("job %s: task-revoked event not sent: %s", job_id, err)
    log.info("job %s: CANCELLED; its delivery reported as revoked", job_id)
    raise Ignore()
