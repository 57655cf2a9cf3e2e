"""A Jobs view in Flower: ``jobctl flower`` serves Flower as ever, plus pages under
``/jobs`` behind Flower's own authentication.

- ``/jobs``: jobs by kind and state with counts, the queues' depth and the oldest due
  job's age, the jobs ``jobctl list``'s filters select (state, kind, changed since, error
  like), a search by ID, the schedules (last and next tick), the limits per kind, and
  the paused kinds and queues (since when, by whom, how many jobs each holds);
- ``/jobs/job/<id>``: a job's inputs, result, recorded steps with their outputs, history,
  ``jobctl explain``'s paragraph, its parent and children, and buttons to approve, wake,
  retry and cancel, each recorded with the Flower user's name.

Server-rendered (no JavaScript), every write a POST with Tornado's XSRF token, every
stored value escaped. Reads go through the store's read methods, writes through
:class:`jobs.application.JobsApp`. To embed the pages in a Flower you start yourself,
build :class:`JobsFlower` instead of ``flower.app.Flower``.
"""

from jobs.contrib.flower_jobs.server import JobsFlower, main
from jobs.contrib.flower_jobs.views import jobs_handlers

__all__ = ["JobsFlower", "jobs_handlers", "main"]
