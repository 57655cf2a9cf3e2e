"""Durable jobs on your own Celery app: ``install(app)``.

In ``proj/celery.py``, after the app is configured::

    from celery import Celery
    import jobs.contrib.celery

    app = Celery("proj", broker="amqp://…")
    app.config_from_object("proj.celeryconfig")
    jobs.contrib.celery.install(app)

Then ``celery -A proj worker -Q celery,jobs`` runs the project's plain tasks and durable
jobs alike, ``celery -A proj inspect registered`` lists each kind as ``jobs.<kind>``, and
Flower shows each delivery by its kind, a failed job as FAILURE and a retried attempt as
RETRY.

What ``install`` sets, and what it leaves alone:

- The job tasks carry what durability needs as *task* options (late acknowledgement,
  rejection when a pool child is lost, JSON): the app's own defaults for its other tasks
  (serializer, acks, routes, result backend) stay as they are.
- The doorbells go through the app's broker connection; ``JOBS_BROKER_URL`` need not be set
  (when it is and differs, a warning says which one is used).
- The jobs queues (``JOBS_QUEUE``, each kind's ``queue=``) are declared by every process with
  the same arguments (a priority queue, or quorum with its high band), added to the app's
  queues when a worker starts, so ``-Q jobs`` consumes the right declaration.
- Worker-wide settings cannot be set per task, so they stay the user's: the consumer (the
  doorbell gate that drops hostile messages is installed only where the app uses Celery's
  default consumer), the prefetch multiplier, the pool and task events. The README's
  "Your own Celery app" says what each choice costs.
"""

from __future__ import annotations

import logging
from typing import Any

from jobs.application import JobsApp, default_app
from jobs.contrib.celery_control import wrap_results_and_revoke
from jobs.runtime.celery_app import Installed, install_runner

log = logging.getLogger("jobs")

CELERY_DEFAULT_CONSUMER = "celery.worker.consumer:Consumer"
GATED_CONSUMER = "jobs.runtime.doorbell:GuardedConsumer"


def install(app: Any, *, jobs_app: JobsApp | None = None) -> JobsApp:
    """Put durable jobs on the Celery app ``app`` (the process's default jobs application,
    or ``jobs_app``): register the job runner and a task per kind on it, send doorbells
    through it, and gate its consumer when it uses Celery's default one. Returns the jobs
    application, whose operations (``submit`` …) ``jobs.submit`` and friends also reach.
    Installing twice is a no-op."""
    jobs_app = default_app() if jobs_app is None else jobs_app
    installed: Installed = install_runner(app, jobs_app)
    if installed.host is not jobs_app:
        raise ValueError("this Celery app already runs another jobs application's jobs")
    jobs_app.adopt_celery(app)
    wrap_results_and_revoke(app, jobs_app)  # app.AsyncResult(job_id), app.control.revoke
    if app.conf.worker_consumer in (None, CELERY_DEFAULT_CONSUMER):
        app.conf.worker_consumer = GATED_CONSUMER
    elif app.conf.worker_consumer != GATED_CONSUMER:
        log.warning(
            "the app has its own worker consumer (%s): durable jobs run on it, without the "
            "gate that drops messages that are not doorbells before Celery decodes them",
            app.conf.worker_consumer,
        )
    return jobs_app
