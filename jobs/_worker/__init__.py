"""A worker process running durable jobs under Celery.

The process state rebuilt after a fork (:mod:`~jobs._worker.process`), Celery's configuration
and the runner task (:mod:`~jobs._worker.celery_setup`), the consumer's gate, one delivery's
claim-run-report (:mod:`~jobs._worker.delivery`, :mod:`~jobs._worker.runner`), liveness locks,
pool children, signals and start-up checks. Private: users run ``celery -A … worker`` or
``jobctl worker``.
"""
