"""Durable jobs on your own Celery app: ``install(app)``.

In ``proj/celery.py``, after the app is configured::

    from celery import Celery
    import jobs.contrib.celery

    app = Celery("proj", broker="amqp://…")
    app.config_from_object("proj.celeryconfig")
    jobs.contrib.celery.install(app)

Then ``celery -A proj worker`` runs the project's plain tasks and durable jobs alike (it
consumes the durable queues with the app's others), ``celery -A proj inspect registered``
lists each kind as ``jobs.<kind>``, and Flower shows each delivery by its kind, a failed job
as FAILURE and a retried attempt as RETRY.

What ``install`` sets, and what it leaves alone:

- The job tasks carry what durability needs as *task* options (late acknowledgement,
  rejection when a pool child is lost, JSON): the app's own defaults for its other tasks
  (serializer, acks, routes, result backend) stay as they are. Each kind's task is
  registered when the kind is defined, in every process of the app.
- A kind looked up and not known imports the app's own task modules, once, as its workers
  do (``include``, ``imports``, ``autodiscover_tasks()``): no ``JOBS_IMPORTS`` is needed.
  So does the app's finalization (the first read of ``app.tasks``), so ``app.tasks`` lists
  every kind's task in every process.
- The doorbells go through the app's broker connection; ``JOBS_BROKER_URL`` need not be set
  (when it is and differs, a warning says which one is used). A doorbell carries a header
  only our publishers set, so the app's own tasks pass untouched whatever their names.
- The durable queues (``JOBS_QUEUE``, each kind's ``queue=``) go into the app's
  ``task_queues`` with their arguments, and each kind's task is routed to its queue
  (:mod:`jobs._doorbell.app_queues`): every process of the app declares them alike. A queue
  the app already declares itself is used as the app declares it.
- Worker-wide settings cannot be set per task, so they stay the user's: the consumer (the
  doorbell gate is installed only where the app uses Celery's default consumer, keeping
  every step of Celery's own), the prefetch multiplier, the pool and task events. The
  guide docs/guides/celery-app.md says what each choice costs.
"""

from __future__ import annotations

import logging
from typing import Any

from jobs._config.settings import Settings
from jobs._core.errors import SettingsError
from jobs._core.registry import JobKind
from jobs._doorbell.app_queues import add_durable_queues, route_kinds
from jobs._doorbell.queues import kind_task_name, queue_names, with_bands
from jobs._worker.celery_setup import import_task_modules, install_runner
from jobs._worker.installed import Installed, register_kind_tasks
from jobs.application import JobsApp, default_app
from jobs.contrib.celery_control import wrap_results_and_revoke

log = logging.getLogger("jobs")

CELERY_DEFAULT_CONSUMER = "celery.worker.consumer:Consumer"
GATED_CONSUMER = "jobs._worker.gate:UsersAppConsumer"
DEDICATED_CONSUMER = "jobs._worker.gate:GuardedConsumer"  # Celery's steps left out


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
    if not installed.first_install_on_users_app():
        return jobs_app
    jobs_app.adopt_celery(app)
    wrap_results_and_revoke(app, jobs_app)  # app.AsyncResult(job_id), app.control.revoke
    registry = jobs_app.registry
    routes = route_kinds(app, lambda: jobs_app.settings.queue)

    def on_kind(kind: JobKind) -> None:
        """A kind defined, before install or after: its task, its queue and its route."""
        register_kind_tasks(app, installed, [kind.name])
        routes.queues[kind_task_name(kind.name)] = kind.queue
        settings = _settings_or_none(jobs_app)
        if kind.queue and settings is not None:
            add_durable_queues(app, settings, with_bands(settings, [kind.queue]))

    settings = _settings_or_none(jobs_app)
    if settings is not None:
        add_durable_queues(app, settings, queue_names(settings))
    for name in registry.registered_names():
        on_kind(registry.get(name))
    registry.on_register(on_kind)
    # A kind looked up and not known yet: import the app's task modules as its workers do.
    registry.discover_with(lambda: import_task_modules(app))
    _discover_before_finalize(app, jobs_app)
    if app.conf.worker_consumer in (None, CELERY_DEFAULT_CONSUMER):
        app.conf.worker_consumer = GATED_CONSUMER
    elif app.conf.worker_consumer not in (GATED_CONSUMER, DEDICATED_CONSUMER):
        log.warning(
            "the app has its own worker consumer (%s): durable jobs run on it, without the "
            "gate that drops messages that are not doorbells before Celery decodes them",
            app.conf.worker_consumer,
        )
    return jobs_app


def _discover_before_finalize(app: Any, jobs_app: JobsApp) -> None:
    """Make ``app.tasks`` list every kind's task at its first read, in any process: Celery
    finalizes the app there (``app.finalize()``), and the app's task modules are imported
    just before it, outside Celery's finalize lock, so a module imported meanwhile by
    another thread cannot wait on it. Modules that cannot be imported yet (a Django
    project still loading its apps) or fail are left for the next look-up of a kind, which
    says what is wrong in one line; the app is finalized as Celery does either way."""
    if app.finalized:
        return
    celerys_finalize = app.finalize

    def finalize(auto: bool = False) -> Any:
        if not app.finalized:
            try:
                jobs_app.registry.names()  # JOBS_IMPORTS, then the app's task modules
            except SettingsError as err:
                log.debug("kinds not imported as the Celery app is finalized: %s", err)
        return celerys_finalize(auto=auto)

    app.finalize = finalize


def _settings_or_none(jobs_app: JobsApp) -> Settings | None:
    """The settings in force, or ``None`` when they are wrong: importing the project's app
    must not fail on them (a worker says what is wrong in one line at its start, and adds
    the durable queues then)."""
    try:
        return jobs_app.settings
    except SettingsError:
        return None
