"""``celery -A jobs.celery_app worker``: the default application's Celery app, for projects
without a Celery app of their own (a project with one adopts durable jobs into it with
:func:`jobs.contrib.celery.install`)."""

from jobs.application import default_app

app = default_app().celery
"""The Celery app of :func:`jobs.application.default_app`, built from the ``JOBS_*``
settings."""
