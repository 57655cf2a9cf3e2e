"""The durable queues in a user's Celery app's own configuration.

RabbitMQ refuses a declare whose arguments differ from the queue's (``PRECONDITION_FAILED -
inequivalent arg``), and Celery declares a queue its configuration does not list with none.
So :func:`jobs.contrib.celery.install` puts every durable queue (``JOBS_QUEUE``, each kind's
``queue=``, their high bands under quorum queues), with its arguments, into the app's
``task_queues``, and routes each kind's task there: a plain ``celery -A proj worker``
consumes them with the app's other queues, and every process that loads the app (a worker
with other imports, ``send_task(..., queue="jobs")``, beat, Flower) declares each one as the
doorbells do (:func:`jobs._doorbell.queues.declared_queue`).

A queue the app already declares itself (a project whose own queue is called ``jobs``) is
adopted as the app declares it: the doorbells then declare it with the app's arguments, and
when those lack ours (a queue without priorities) one warning says which setting gives
durable jobs a queue of their own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from kombu.entity import Queue

from jobs._config.settings import Settings
from jobs._doorbell.queues import TASK_NAME, queue_names, task_queue

log = logging.getLogger("jobs")


class KindRoutes:
    """A Celery router (first in ``task_routes``): ``jobs.run`` and each kind's task go to
    the kind's queue, so ``app.send_task("jobs.<kind>", …)`` and the task's own
    ``apply_async`` land where the kind's workers listen. Any other name is left to the
    app's own routes."""

    def __init__(self, default_queue: Callable[[], str]) -> None:
        self.default_queue = default_queue  # JOBS_QUEUE, read when a task is routed
        self.queues: dict[str, str | None] = {TASK_NAME: None}  # None: JOBS_QUEUE

    def __call__(self, name: str, *args: Any, **kwargs: Any) -> dict[str, str] | None:
        if name not in self.queues:
            return None
        return {"queue": self.queues[name] or self.default_queue()}


def arguments_of(queue: Queue) -> dict[str, Any]:
    """A queue's declare arguments (``{}`` for none)."""
    return dict(getattr(queue, "queue_arguments", None) or {})


LOST_WITHOUT = {
    "x-max-priority": "job priorities are not applied there",
    "x-delivery-limit": (
        "RabbitMQ sets no doorbell aside however often it is redelivered unacknowledged"
    ),
}
"""What durable jobs lose on a queue declared without each of their arguments."""


def what_is_lost(theirs: dict[str, Any], ours: dict[str, Any]) -> str:
    """What durable jobs lose on a queue declared with ``theirs`` instead of ``ours``."""
    lost = [
        LOST_WITHOUT.get(key, f"no {key}")
        for key, value in ours.items()
        if theirs.get(key) != value
    ]
    return "; ".join(lost) or "its arguments differ"


def apps_own_queues(celery: Any) -> dict[str, Queue]:
    """The queues the app's configuration declares, by name: its ``task_queues``, or the
    default queue Celery makes from ``task_default_queue`` when it lists none."""
    return dict(celery.amqp.Queues(celery.conf.task_queues or ()).items())


def add_durable_queues(celery: Any, settings: Settings, names: Iterable[str]) -> list[str]:
    """Put each queue of ``names`` that the app does not declare yet into its ``task_queues``
    (kept with Celery's default queue when the app listed none) and into its queues already
    built, if any. A queue the app declares itself is left as it is, with a warning when its
    arguments are not ours. Returns the names added."""
    own = apps_own_queues(celery)
    added: list[Queue] = []
    for name in names:
        ours = task_queue(settings, name)
        theirs = own.get(name)
        if theirs is None:
            added.append(ours)
        elif arguments_of(theirs) != arguments_of(ours):
            setting = "JOBS_QUEUE" if name in queue_names(settings) else "the kind's queue="
            log.warning(
                "durable jobs share the Celery app's own queue %r as the app declares it "
                "(arguments %s, not %s: %s); set %s to another name to give durable jobs a "
                "queue of their own",
                name,
                arguments_of(theirs) or "none",
                arguments_of(ours),
                what_is_lost(arguments_of(theirs), arguments_of(ours)),
                setting,
            )
    if not added:
        return []
    celery.conf.task_queues = [*own.values(), *added]
    built = vars(celery.amqp).get("queues")  # Celery's queues, when something built them
    for queue in added:
        if built is not None and queue.name not in built:
            built.add(queue)
    return [queue.name for queue in added]


def route_kinds(celery: Any, default_queue: Callable[[], str]) -> KindRoutes:
    """Put a :class:`KindRoutes` first in the app's ``task_routes`` (the app's own routes
    follow, as they were) and return it."""
    routes = KindRoutes(default_queue)
    existing = celery.conf.task_routes
    if existing is None:
        theirs: tuple[Any, ...] = ()
    elif isinstance(existing, (list, tuple)):
        theirs = tuple(existing)
    else:
        theirs = (existing,)
    celery.conf.task_routes = (routes, *theirs)
    return routes


def consume_as_declared(celery: Any, names: Iterable[str]) -> list[str]:
    """Of ``names`` (a worker's ``-Q``), those the app's queues do not list but the broker
    (RabbitMQ) already has, added to the app's queues as consumed without a declare: a
    worker that serves a durable queue whose kinds it does not import then consumes it as it
    is (RabbitMQ would refuse Celery's declare of it without arguments, and the worker would
    never consume), and leaves those jobs QUEUED for a worker that knows their kinds.
    Returns the names so added; nothing when the broker cannot be asked now."""
    known = celery.amqp.queues
    missing = [name for name in names if name not in known]
    found: list[str] = []
    if not missing:
        return found
    try:
        with celery.connection_for_read() as connection:
            if connection.transport.driver_type != "amqp":
                return found
            connection.ensure_connection(max_retries=1)
            channel = connection.channel()
            for name in missing:
                try:
                    channel.queue_declare(queue=name, passive=True)
                except connection.channel_errors:  # not there: Celery declares it as usual
                    channel = connection.channel()  # the refusal closed the channel
                    continue
                found.append(name)
    except Exception:  # only a precaution: the consumer's own start reports the broker
        return []
    for name in found:
        known.add(Queue(name, exchange=name, routing_key=name, no_declare=True))  # type: ignore[no-untyped-call]
    return found
