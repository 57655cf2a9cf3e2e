"""``python -m bench``: durable jobs measured against plain Celery in the same run.

Both sides use the same broker, the same worker settings (``jobs.celery_app.celery_config``:
acks_late, prefetch 1, reject_on_worker_lost, JSON, task events) and the same concurrency,
with real ``celery worker`` processes started by the bench. Every figure is reported with
its ratio ``durable / plain``.
"""
