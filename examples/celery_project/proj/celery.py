"""The project's own Celery app, as it was before durable jobs, plus one call.

Run it as any Celery project runs::

    celery -A proj worker -Q celery,mail --hostname small@%h     # plain tasks and e-mail
    celery -A proj worker -Q video --hostname big@%h             # the transcoding pool
    celery -A proj beat                                          # the plain beat schedule
    celery -A proj flower                                        # Flower shows each kind
"""

from __future__ import annotations

import os

from celery import Celery

import jobs.contrib.celery

app = Celery(
    "proj",
    broker=os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    include=["proj.tasks"],
)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_default_queue="celery",
    task_routes={"proj.tasks.*": {"queue": "celery"}},
    beat_schedule={"heartbeat": {"task": "proj.tasks.heartbeat", "schedule": 60.0}},
    worker_prefetch_multiplier=1,  # worker-wide: durable jobs want it, plain tasks do not mind
    worker_send_task_events=True,  # worker-wide: what Flower reads
)

jobs.contrib.celery.install(app)  # the one added line: durable jobs on this app
