"""Publishing doorbells: job IDs sent to Celery after their QUEUED state committed.

:class:`CeleryPublisher` is the default doorbell of :class:`jobs.runtime.process.ProcessRuntime`.
On RabbitMQ (:mod:`jobs.runtime.amqp_doorbells`) every doorbell is confirmed by the broker
before the call returns; a batch (a bulk submit, a sweep) is published in full and its
confirmations awaited together. On the embedded broker Celery publishes them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from jobs.core.settings import Settings

TASK_NAME = "jobs.run"


class CeleryPublisher:
    """Sends ``jobs.run(job_id)`` for each ID, on the queue the settings name."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._app: Any = None
        self._amqp: Any = None  # AmqpDoorbells, made on the first publish to RabbitMQ
        self._lock = threading.Lock()

    @property
    def app(self) -> Any:
        """The Celery app for these settings (Celery is imported on the first publish)."""
        if self._app is None:
            from jobs.runtime.celery_app import app_for  # noqa: PLC0415 - Celery when needed

            self._app = app_for(self.settings)
        return self._app

    def __call__(self, job_ids: Sequence[str]) -> None:
        """Publish one doorbell per job; on RabbitMQ, return once every one is confirmed."""
        if self.settings.is_embedded_broker:
            app = self.app
            with app.producer_or_acquire() as producer:
                for job_id in job_ids:
                    app.send_task(
                        TASK_NAME, args=(job_id,), queue=self.settings.queue, producer=producer
                    )
            return
        with self._lock:
            if self._amqp is None:
                from jobs.runtime.amqp_doorbells import AmqpDoorbells  # noqa: PLC0415
                from jobs.runtime.celery_app import task_queue  # noqa: PLC0415

                self._amqp = AmqpDoorbells(self.app, task_queue(self.settings))
        self._amqp.publish(job_ids)

    def close(self) -> None:
        """Close the publishing connection (the process runtime closes or is rebuilt)."""
        if self._amqp is not None:
            self._amqp.close()

    def waiting(self) -> int | None:
        """Doorbells ready in the queue (not yet delivered to a worker); ``None`` when the
        broker cannot say (the queue does not exist, the broker is unreachable)."""
        try:
            with self.app.connection_for_write() as connection:
                connection.ensure_connection(max_retries=1)
                declared = connection.default_channel.queue_declare(
                    queue=self.settings.queue, passive=True
                )
                return int(declared.message_count)
        except Exception:  # only a hint: the sweeper then re-sends as if none were waiting
            return None
