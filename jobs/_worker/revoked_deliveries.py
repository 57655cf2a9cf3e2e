"""A revoke of a doorbell's delivery cancels its job, in a worker that runs durable jobs.

Flower's revoke button and ``celery -A proj control revoke <task-id>`` broadcast Celery's
``revoke`` remote control command naming a *delivery's* task ID (the ID Flower lists),
not the job's, and without :func:`jobs.contrib.celery_control.wrap_results_and_revoke`
on the sender's side. Celery's worker only flags that task ID: a delivery not started is
skipped (and its job would wait for the sweeper), a running one runs on. Here the worker
that knows the delivery maps its task ID to the job it names and cancels the job
durably, recording that Celery's remote control did it:

- the ``revoke`` command is wrapped (:func:`cancel_jobs_on_revoke`): after Celery's own
  handling, each named delivery among the worker's reserved and running ones has its job
  cancelled; a running job's process hears it at its next heartbeat (``ctx.cancelled``,
  ``ctx.on_cancel``; a prefork child stuck in the step is ended) and is refused at its
  next fenced write, and its delivery then reports itself revoked
  (:func:`jobs._worker.outcome_events.revoked_delivery`);
- Celery's ``task_revoked`` signal: a delivery that arrives after the revoke and is
  skipped as revoked (or one ended with ``terminate=True``) has its job cancelled too.

The cancel runs in a thread of the worker's main process (that process loads the store
on the first such revoke only), so the remote control never waits for the database; a
database that cannot be reached is one log line, and the job is then left as it is.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any

from celery import signals
from celery.worker import control
from celery.worker import state as worker_state

from jobs._core.errors import IllegalTransition, UnknownJob
from jobs._core.validate import NAME_LENGTH

log = logging.getLogger("jobs")

REASON = "revoked through Celery's remote control (revoke of delivery {task_id}) on {node}"
"""The reason recorded in the history of a job cancelled by a revoke of its delivery."""

_WRAPPED = "durable_jobs_revoke"


def cancel_jobs_on_revoke(
    is_doorbell_task: Callable[[str], bool], store_of: Callable[[], Any]
) -> None:
    """Wrap this process's ``revoke`` control command, and connect Celery's
    ``task_revoked`` signal, so a revoke naming a delivery of a doorbell (a task whose name
    ``is_doorbell_task``) ends in ``store_of().operator.cancel(…)`` for the job it names.
    The store is asked for at the first such revoke, not before: a prefork worker's main
    process holds no database connection until then. Once a process; a later call replaces
    what the first one set."""
    celerys = control.Panel.data["revoke"]
    celerys = getattr(celerys, _WRAPPED, celerys)

    def revoke(state: Any, task_id: Any, terminate: bool = False, **kwargs: Any) -> Any:
        named = _named(task_id)
        jobs = _doorbell_jobs(named, is_doorbell_task)
        answer = celerys(state, task_id, terminate=terminate, **kwargs)
        if jobs:
            node = str(getattr(state, "hostname", "") or socket.gethostname())
            _cancel_in_background(store_of, jobs, node)
        return answer

    revoke.__doc__ = celerys.__doc__
    setattr(revoke, _WRAPPED, celerys)
    control.Panel.data["revoke"] = revoke

    def on_task_revoked(request: Any = None, **_: Any) -> None:
        task_id = getattr(request, "id", None)
        name = getattr(request, "task", None) or getattr(request, "name", None)
        job_id = _job_id_of(getattr(request, "args", None))
        known = isinstance(name, str) and is_doorbell_task(name)
        if isinstance(task_id, str) and known and job_id is not None:
            node = str(getattr(request, "hostname", "") or socket.gethostname())
            _cancel_in_background(store_of, {task_id: job_id}, node)

    _signal_handler[0] = on_task_revoked
    signals.task_revoked.connect(_on_task_revoked, weak=False)


_signal_handler: list[Callable[..., None]] = [lambda **_: None]


def _on_task_revoked(**kwargs: Any) -> None:
    """Celery's ``task_revoked`` signal, connected once: the handler set last."""
    _signal_handler[0](**kwargs)


def _named(task_id: Any) -> set[str]:
    if isinstance(task_id, str):
        return {task_id}
    if isinstance(task_id, Iterable):
        return {one for one in task_id if isinstance(one, str)}
    return set()


def _job_id_of(args: Any) -> str | None:
    """The job ID a doorbell's delivery names (its one argument), else ``None``."""
    if isinstance(args, list | tuple) and len(args) == 1:
        job_id = args[0]
        if isinstance(job_id, str) and 0 < len(job_id) <= NAME_LENGTH:
            return job_id
    return None


def _doorbell_jobs(task_ids: set[str], is_doorbell_task: Callable[[str], bool]) -> dict[str, str]:
    """``{delivery task ID: job ID}`` of the deliveries among ``task_ids`` this worker has
    reserved or is running."""
    found: dict[str, str] = {}
    if not task_ids:
        return found
    for request in [*worker_state.reserved_requests, *worker_state.active_requests]:
        if request.id not in task_ids or not is_doorbell_task(str(request.name)):
            continue
        job_id = _job_id_of(request.args)
        if job_id is not None:
            found[request.id] = job_id
    return found


def _cancel_in_background(store_of: Callable[[], Any], jobs: dict[str, str], node: str) -> None:
    def cancel_each() -> None:
        for task_id, job_id in jobs.items():
            try:
                store_of().operator.cancel(job_id, REASON.format(task_id=task_id, node=node))
            except (IllegalTransition, UnknownJob):
                continue  # already ended (or gone): as Celery's revoke of a finished task
            except Exception as err:  # the database may be down: say so, never raise
                log.warning("job %s: revoke of its delivery not applied: %s", job_id, err)
                continue
            log.info("job %s: CANCELLED by a revoke of its delivery %s", job_id, task_id)

    threading.Thread(target=cancel_each, name="jobs-revoke", daemon=True).start()
