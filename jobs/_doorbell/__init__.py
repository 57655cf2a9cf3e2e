"""Doorbells: a job's ID published to Celery after its QUEUED state committed.

The ringer and its AMQP publisher, the message encoding, the queues every process declares
the same way (and their place in a user's Celery app), and the embedded default's filesystem
transport. Private; :func:`jobs.set_doorbell` replaces the ringer.
"""
