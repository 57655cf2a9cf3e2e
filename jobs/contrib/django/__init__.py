"""Durable jobs in a Django project: add ``"jobs.contrib.django"`` to ``INSTALLED_APPS``.

- :func:`submit` writes the job through Django's own database connection, inside the
  current ``transaction.atomic()`` block: the job commits or rolls back with the view's
  data, and its doorbell rings from ``transaction.on_commit``. A plain ``jobs.submit`` (or
  a kind's ``.delay()``) inside ``atomic()`` on the jobs' database joins it the same way.
- :func:`submit_on_commit` is for a job table in another database: it checks the inputs
  and the kind's queue limit now (a refusal can still roll the request back) and submits
  once the request's transaction has committed.
- Settings come from ``settings.JOBS`` (the ``JOBS_*`` names without the prefix); the
  ``JOBS_*`` environment variables still win. Without ``DATABASE_URL`` the jobs live in
  Django's ``default`` database.
- ``manage.py jobs_worker`` / ``jobs_sweeper`` / ``jobs_stats`` run ``jobctl``'s commands
  with Django set up; job handlers may use the ORM (stale connections are closed around
  each job, as Celery's Django fix-up does).
- The admin lists jobs (filters by state and kind, search by ID), shows a job's steps and
  history a page at a time, and approves (recording the admin user), cancels, or retries a
  FAILED or CANCELLED job from the step that failed, through ``jobs.approve``/``cancel``/
  ``retry`` (which join the admin's ``atomic()`` block when there is one); each action
  needs its own permission (``durable_jobs.approve_job``, ``cancel_job``, ``retry_job``).
"""

from __future__ import annotations

from jobs.contrib.django.orm_unit import DjangoUnit
from jobs.contrib.django.submit import (
    AdmissionRefusedMiddleware,
    submit,
    submit_many,
    submit_on_commit,
)

__all__ = [
    "AdmissionRefusedMiddleware",
    "DjangoUnit",
    "submit",
    "submit_many",
    "submit_on_commit",
]
