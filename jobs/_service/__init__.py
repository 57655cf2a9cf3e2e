"""The application's services, composed by :class:`jobs.application.JobsApp` the way
Celery composes ``app.control`` and ``app.events``:

- ``app.jobs`` (:class:`~jobs._service.submitting.JobService`): submit, ring, send events,
  read;
- ``app.operator`` (:class:`~jobs._service.operator.Operator`): approve, wake, cancel,
  retry, one job or a selected batch;
- ``app.schedules`` (:class:`~jobs._service.scheduling.ScheduleService`): periodic jobs;
- ``app.limits`` (:class:`~jobs._service.limits.LimitService`): backpressure per kind;

and :mod:`~jobs._service.unit`, where their writes commit and their doorbells ring.
The module functions ``jobs.submit``, ``jobs.approve`` … are these services of the
default app (:mod:`jobs.application`).
"""
