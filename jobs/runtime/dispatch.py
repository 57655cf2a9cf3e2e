"""Publishing doorbells: job IDs sent to Celery after their QUEUED state committed.

:class:`CeleryPublisher` is the default doorbell of :class:`jobs.runtime.process.ProcessRuntime`.
A batch (a bulk submit, a sweep) goes out through one producer on one connection; on
AMQP every publish is confirmed by RabbitMQ before the call returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jobs.core.settings import Settings


class CeleryPublisher:
    """Sends ``jobs.run(job_id)`` for each ID, on the queue the settings name."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._app: Any = None

    @property
    def app(self) -> Any:
        """The Celery app for these settings (Celery is imported on the first publish)."""
        if self._app is None:
            from jobs.runtime.celery_app import app_for  # noqa: PLC0415 - Celery when needed

            self._app = app_for(self.settings)
        return self._app

    def __call__(self, job_ids: Sequence[str]) -> None:
        from jobs.runtime.celery_app import TASK_NAME  # noqa: PLC0415

        app = self.app
        if len(job_ids) == 1:
            app.send_task(TASK_NAME, args=(job_ids[0],), queue=self.settings.queue)
            return
        with app.producer_or_acquire() as producer:
            for job_id in job_ids:
                app.send_task(
                    TASK_NAME, args=(job_id,), queue=self.settings.queue, producer=producer
                )
