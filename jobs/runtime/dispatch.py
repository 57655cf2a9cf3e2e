"""Publishing doorbells: a job ID sent to Celery after the job's QUEUED state committed."""

from __future__ import annotations


def publish(job_id: str) -> None:
    from jobs.celery_app import run_job  # noqa: PLC0415 - the app is built on first publish

    run_job.apply_async(args=(job_id,), task_id=None)
