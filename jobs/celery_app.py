"""``celery -A jobs.celery_app worker`` keeps working; the app is in jobs.runtime.celery_app."""

from jobs.runtime.celery_app import app, run_job  # noqa: F401
