"""Publishing doorbells: job IDs sent to Celery after their QUEUED state committed.

:class:`CeleryRinger` is the default doorbell of :class:`jobs._worker.process.ProcessRuntime`.
On RabbitMQ (:mod:`jobs._doorbell.amqp`) a publish returns once its doorbells are
written; their confirmations are read at the next publish and by a watcher thread, and a
doorbell RabbitMQ refused, could not route or never confirmed is handed back to the process,
which marks its job unsent for the sweeper
(``JOBS_DOORBELL_CONFIRMS=wait``: return once RabbitMQ confirmed them all). On the embedded
broker Celery publishes them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jobs._config.settings import Settings
from jobs._core.lazy import lazy_module
from jobs._core.records import Batch
from jobs._doorbell.queues import (
    DOORBELL_HEADER,
    declared_queue,
    kind_task_name,
    queue_for,
    queue_names,
)

if TYPE_CHECKING:
    from jobs._doorbell import amqp
else:
    amqp = lazy_module("jobs._doorbell.amqp")


class CeleryRinger:
    """Sends ``jobs.run(job_id)`` for each ID, on the queue the settings name."""

    def __init__(
        self,
        settings: Settings,
        on_lost: Callable[[list[str]], None] | None = None,
        *,
        celery: Callable[[], Any],
    ) -> None:
        self.settings = settings
        self.on_lost = on_lost  # given the jobs whose doorbells were found lost later
        self._celery = celery  # the application's Celery app, asked for on first need
        self._app: Any = None
        self._amqp: Any = None  # AmqpDoorbells, made on the first publish to RabbitMQ
        self._lock = threading.Lock()

    @property
    def app(self) -> Any:
        """The Celery app the doorbells go out with: the application's (a user's own after
        ``install``), asked for on the first publish (Celery is imported then)."""
        if self._app is None:
            self._app = self._celery()
        return self._app

    def __call__(self, batch: Batch) -> None:
        """Publish one doorbell per job of the batch to its queue (default ``JOBS_QUEUE``),
        each named for its kind and carrying its priority (AMQP's message priority: the
        classic queue is a priority queue, the embedded transport orders its files by it;
        with quorum queues it picks the band, :func:`queue_for`). On RabbitMQ, return
        once they are written (``JOBS_DOORBELL_CONFIRMS=background``: a doorbell found lost
        later goes to ``on_lost``) or once every one is confirmed (``wait``)."""
        job_ids, priority = batch.job_ids, batch.priority
        target = queue_for(self.settings, priority, batch.queue)
        task_name = kind_task_name(batch.kind)
        if self.settings.is_embedded_broker:
            app = self.app
            with app.producer_or_acquire() as producer:
                for job_id in job_ids:
                    app.send_task(
                        task_name,
                        args=(job_id,),
                        queue=target,
                        producer=producer,
                        priority=priority,
                        headers={DOORBELL_HEADER: True},
                    )
            return
        with self._lock:
            if self._amqp is None:
                app = self.app
                names = queue_names(self.settings)
                self._amqp = amqp.AmqpDoorbells(
                    app,
                    *(declared_queue(app, self.settings, name) for name in names),
                    wait_for_confirms=self.settings.doorbell_confirms == "wait",
                    declare=lambda name: declared_queue(app, self.settings, name),
                    on_lost=self.on_lost,
                )
        self._amqp.publish(job_ids, priority, target, task_name)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait up to ``timeout`` seconds for the confirmations of the doorbells in flight
        (RabbitMQ); those lost go to ``on_lost``."""
        if self._amqp is not None:
            self._amqp.flush(timeout)

    def close(self) -> None:
        """Close the publishing connection (the process runtime closes or is rebuilt), once
        the doorbells in flight are confirmed (a few seconds at most)."""
        if self._amqp is not None:
            self._amqp.close()

    def waiting(self) -> int | None:
        """Doorbells ready in the queues (not yet delivered to a worker); ``None`` when the
        broker cannot say (a queue does not exist, the broker is unreachable)."""
        try:
            with self.app.connection_for_write() as connection:
                connection.ensure_connection(max_retries=1)
                return sum(
                    int(
                        connection.default_channel.queue_declare(
                            queue=name, passive=True
                        ).message_count
                    )
                    for name in queue_names(self.settings)
                )
        except Exception:  # only a hint: the sweeper then re-sends as if none were waiting
            return None
