"""The jobs queues: their names, which one a doorbell of a priority goes to, and how every
process declares them.

RabbitMQ refuses a declare whose arguments differ from the queue's, so workers, sweepers,
submitters and Flower all declare each queue through :func:`task_queue`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kombu.entity import Queue

from jobs._config.settings import Settings
from jobs._core.registry import JobKind
from jobs._core.validate import MAX_PRIORITY

TASK_NAME = "jobs.run"

HIGH_BAND_PRIORITY = 5
"""With quorum queues (no message priorities on RabbitMQ 3.x), doorbells of this priority
and above go to a queue of their own, the high band (:func:`queue_for`)."""

HIGH_BAND_SUFFIX = ".high"


KIND_TASK_PREFIX = "jobs."
"""A doorbell's task name is this and its job's kind (``jobs.send_email``), so Celery's tools
(Flower's task list and filters, ``celery inspect registered``) show each kind by name.
``jobs.run``, the name of doorbells that name no kind, is the same runner."""


def kind_task_name(kind: str | None) -> str:
    """The Celery task name of a doorbell for a job of ``kind`` (``None``: :data:`TASK_NAME`)."""
    return TASK_NAME if kind is None else KIND_TASK_PREFIX + kind


DOORBELL_HEADER = "x-durable-jobs-doorbell"
"""A header only the doorbells carry (set by :mod:`jobs._doorbell.ringer`'s publishers): how a
user's app with durable jobs installed tells a doorbell from its own tasks, whatever their
names (a plain ``@app.task(name="jobs.sum_up")`` is the user's, and passes untouched)."""


def is_doorbell(headers: object) -> bool:
    """Whether a task message's headers are a doorbell's: a job task's name and
    :data:`DOORBELL_HEADER`."""
    return (
        isinstance(headers, dict)
        and headers.get(DOORBELL_HEADER) is True
        and is_job_task_name(headers.get("task"))
    )


def is_job_task_name(name: object) -> bool:
    """Whether a task name is a doorbell's (:data:`TASK_NAME` or a kind's)."""
    return isinstance(name, str) and name.startswith(KIND_TASK_PREFIX)


def queue_names(settings: Settings, queue: str | None = None) -> list[str]:
    """The queues a worker of ``queue`` (default ``JOBS_QUEUE``) consumes: the queue, and
    with quorum queues its high band ``<queue>.high`` too."""
    name = settings.queue if queue is None else queue
    if settings.queue_type == "quorum":
        return [name, name + HIGH_BAND_SUFFIX]
    return [name]


def served_queues(settings: Settings, kinds: Iterable[JobKind]) -> list[str]:
    """Every queue the jobs of ``kinds`` go to: ``JOBS_QUEUE`` and each kind's own
    (``@jobs.job(queue=…)``), each with its high band under quorum queues. What a worker
    consumes when told no queues, and what every process declares."""
    names = [settings.queue, *sorted({kind.queue for kind in kinds if kind.queue})]
    return with_bands(settings, names)


def with_bands(settings: Settings, names: Iterable[str]) -> list[str]:
    """``names`` in order, each followed by its high band under quorum queues."""
    served: list[str] = []
    for name in names:
        served += [band for band in queue_names(settings, name) if band not in served]
    return served


def queue_for(settings: Settings, priority: int, queue: str | None = None) -> str:
    """Where a doorbell of ``priority`` for a job of ``queue`` (default ``JOBS_QUEUE``)
    goes. A classic queue (and the embedded transport) orders messages by priority itself;
    a quorum queue cannot, so priorities from :data:`HIGH_BAND_PRIORITY` up go to the high
    band, which a worker consumes beside the normal one: a high-band doorbell then waits
    behind at most the one normal doorbell each worker process holds, not behind the whole
    normal backlog."""
    name = settings.queue if queue is None else queue
    if settings.queue_type == "quorum" and priority >= HIGH_BAND_PRIORITY:
        return name + HIGH_BAND_SUFFIX
    return name


QUORUM_DELIVERY_LIMIT = 20
"""``x-delivery-limit`` of a quorum queue: a doorbell delivered this many times without an
acknowledgement (each time its consumer died or lost its channel) is dropped by RabbitMQ,
so a message that kills whatever consumes it cannot crash-loop the workers. Ordinary
redeliveries (a killed worker, a reconnect) are far fewer; a hand-back publishes a new
message. A dropped doorbell loses no job: the sweeper rings again after
``JOBS_RING_AGAIN_AFTER_SECONDS``, and the job's attempts in the database decide when it is
poison. 20 is RabbitMQ 4.0's default."""


def queue_arguments(settings: Settings) -> dict[str, Any]:
    """The declare arguments of the jobs queue for ``JOBS_QUEUE_TYPE``.

    A classic queue is a priority queue (``x-max-priority``: RabbitMQ delivers a ready
    message of a higher priority first). A quorum queue on RabbitMQ 3.x has no priorities
    (it refuses ``x-max-priority``) and delivers in publish order: high priorities then get
    a quorum queue of their own, a band (:func:`jobs._doorbell.ringer.queue_for`); see
    docs/guides/priorities.md."""
    if settings.queue_type == "quorum":
        return {"x-queue-type": "quorum", "x-delivery-limit": QUORUM_DELIVERY_LIMIT}
    return {"x-max-priority": MAX_PRIORITY}


def task_queue(settings: Settings, name: str | None = None) -> Queue:
    """The jobs queue (or its high band, ``name``) exactly as every process declares it
    (durable, direct exchange of the same name, as Celery declares its default queue)."""
    name = settings.queue if name is None else name
    return Queue(  # type: ignore[no-untyped-call]
        name,
        exchange=name,
        routing_key=name,
        queue_arguments=queue_arguments(settings),
        durable=True,
    )


def declared_queue(celery: Any, settings: Settings, name: str) -> Queue:
    """Queue ``name`` as the Celery app's configuration declares it (a user's app after
    ``install``: :mod:`jobs._doorbell.app_queues`, the queue a project already had of that
    name among them), else :func:`task_queue`: what the doorbells declare, so they never
    differ from the app's own workers and senders."""
    known = celery.amqp.queues
    found = known.get(name) if name in known else None  # .get: Celery makes no missing one
    return found if isinstance(found, Queue) else task_queue(settings, name)
