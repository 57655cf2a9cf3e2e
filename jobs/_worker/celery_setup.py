"""The Celery side of durable jobs: the app's configuration, and installing the job runner
on an app (its tasks, :mod:`jobs._worker.installed`; its worker signals,
:mod:`jobs._worker.signals`). ``celery -A jobs.celery_app worker`` runs the default
application's app (:mod:`jobs.celery_app`) as users run any Celery daemon.

A message carries one thing, a job ID; the job table holds the rest. Each setting below
closes one of Celery's known ways to lose or double-run work
(see docs/explanation/celery-settings.md):

- ``task_acks_late``: the message is acknowledged after the task returns, so a worker
  that dies before it claimed the job does not swallow the doorbell.
- ``task_reject_on_worker_lost``: without it a killed pool child's message is acked and lost.
- ``worker_prefetch_multiplier=1``: a worker reserves one message per process, so queued
  jobs are not hoarded by one busy worker (backpressure stays in the queue, visible).
- ``worker_cancel_long_running_tasks_on_connection_loss``: after a broker reconnect the
  old delivery is redelivered; the old run is stopped instead of racing it.
- ``confirm_publish`` (AMQP): a publish returns only once RabbitMQ has the message.
- JSON only: pickle is refused on both sides.
- task events on: Flower sees every delivery and its outcome.
- the queue is declared by :func:`task_queue` with ``JOBS_QUEUE_TYPE`` and the same
  arguments in every process that builds its app here (workers, sweepers, submitters,
  Flower): RabbitMQ refuses a declare whose arguments differ from the queue's.
- ``broker_channel_error_retry`` and ``worker_consumer``: a broker-side error (queue's
  node down, inequivalent declare, refused permission) pauses and retries instead of
  stopping the worker (see jobs/_worker/broker_errors.py); and a message that is not
  exactly a doorbell is dropped with one log line before Celery decodes it
  (:mod:`jobs._worker.gate`), so no message can stop a worker.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from celery import Celery

from jobs._config.settings import Settings
from jobs._core.errors import SettingsError
from jobs._core.validate import clip
from jobs._doorbell.queues import TASK_NAME, queue_names, task_queue
from jobs._worker.frameworks import set_up_for_job_modules
from jobs._worker.installed import (
    JOB_TASK_OPTIONS,
    Installed,
    JobsHost,
    installed_on,
    register_kind_tasks,
)
from jobs._worker.signals import WORKER_SIGNALS, connect_for_app

log = logging.getLogger("jobs.worker")


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery configuration every process uses for these settings (docs/explanation/
    celery-settings.md says what each entry is for); the bench's plain side gets
    the same one."""
    config: dict[str, Any] = {
        "broker_url": settings.broker_url,
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "task_ignore_result": True,
        "worker_send_task_events": settings.task_events,  # JOBS_TASK_EVENTS
        # Doorbells are published by jobs._doorbell.amqp, without a task-sent event.
        "task_send_sent_event": False,
        "task_default_queue": settings.queue,
        "task_queues": [task_queue(settings, name) for name in queue_names(settings)],
        # RetryingConsumer (broker errors) with the doorbell gate in front of its task handler.
        "worker_consumer": "jobs._worker.gate:GuardedConsumer",
        "broker_channel_error_retry": True,
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": True,
        "enable_utc": True,
    }
    if settings.is_embedded_broker and settings.broker_url.startswith("filesystem"):
        folder = settings.broker_folder
        for sub in ("processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        # kombu's transport with atomic publishes and unreadable files dropped, not raised.
        config["broker_transport"] = "jobs._doorbell.fs_transport:Transport"
        config["broker_transport_options"] = {
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "processed_folder": str(folder / "processed"),
            "store_processed": False,
            # Fanout (events, remote control) bindings; kombu's default is ./control.
            "control_folder": str(folder / "control"),
            # kombu polls the folder once a second by default: a worker whose pool was busy
            # at a poll would leave a waiting job alone for up to a second.
            "polling_interval": 0.05,
        }
    elif not settings.is_embedded_broker:
        config["broker_transport_options"] = {"confirm_publish": True}
    return config


def make_app(settings: Settings, host: JobsHost | None = None) -> Celery:
    """A Celery app configured by :func:`celery_config`, running ``host``'s jobs when given
    (the application's own app; ``celery -A jobs.celery_app`` uses the default one's)."""
    celery = Celery("jobs", set_as_current=False)
    celery.conf.update(celery_config(settings))
    if host is not None:
        install_runner(celery, host, dedicated=True)
    return celery


def install_runner(celery: Celery, host: JobsHost, *, dedicated: bool = False) -> Installed:
    """Register the job runner on ``celery`` for ``host``'s jobs: ``jobs.run`` (the name of
    a doorbell that names no kind) and one task per kind the registry knows now
    (:func:`register_kind_tasks`; a worker adds those imported later at start-up).
    Installing on the same app again is a no-op. ``dedicated``: the app runs durable jobs
    only, so its consumer drops any message that is not a doorbell."""
    found = installed_on(celery)
    if found is not None:
        return found
    installed = Installed(host, dedicated)
    setattr(celery, Installed.ATTRIBUTE, installed)
    celery.task(name=TASK_NAME, **JOB_TASK_OPTIONS)(installed.task_body)
    with contextlib.suppress(SettingsError):  # a broken JOBS_IMPORTS stops the worker later
        register_kind_tasks(celery, installed, host.registry.registered_names())
    connect_worker_signals(celery)
    return installed


def connect_worker_signals(celery: Celery) -> None:
    """Connect the worker signals durable jobs act on, for ``celery``'s workers only
    (:func:`jobs._worker.signals.connect_for_app`; again for the same app: nothing
    more). Nothing is connected at import, so a process that imports this module and runs
    a worker of another app hears nothing from durable jobs."""
    for signal, handler in WORKER_SIGNALS:
        connect_for_app(celery, signal, handler)


def import_task_modules(celery: Any) -> None:
    """Import the Celery app's own task modules as its workers do (``include``, ``imports``,
    ``autodiscover_tasks()``: Celery's ``loader.import_default_modules``), setting a Django
    project up first, so a web process, a shell or ``jobctl`` knows the kinds defined there
    as the workers do. A module that fails to import is one :class:`SettingsError` line."""
    try:
        set_up_for_job_modules()
        celery.loader.import_default_modules()
    except Exception as err:  # whatever the project's modules raise
        detail = str(err).strip()
        detail = clip(detail.splitlines()[0] if detail else "", 300)
        raise SettingsError(
            f"Celery app {celery.main!r}: cannot import its task modules: "
            f"{type(err).__name__}: {detail}"
        ) from err
