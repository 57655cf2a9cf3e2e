"""Publishing doorbells: a job ID sent to Celery after the job's QUEUED state committed."""

from __future__ import annotations

from jobs.core.settings import get_settings


def publish(job_id: str) -> None:
    from jobs.runtime.celery_app import app_for  # noqa: PLC0415 - Celery on first publish
    from jobs.runtime.doorbell import TASK_NAME  # noqa: PLC0415

    settings = get_settings()
    app_for(settings).send_task(TASK_NAME, args=(job_id,), queue=settings.queue)
