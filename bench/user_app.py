"""A user's own Celery app with durable jobs installed: ``celery -A bench.user_app worker``.

It is the plain side's app (``bench.plain_app``'s configuration and no-op task) plus the
bench's job kinds and one call, ``jobs.contrib.celery.install(app)``: what a Celery project
that adopts durable jobs runs. The bench drains jobs through it against the durable side's
own app (``jobs.celery_app``), and plain tasks on it (a mixed worker) against the plain side.
"""

from __future__ import annotations

import json
import os
from typing import Any

from celery import Celery

import bench.kinds  # noqa: F401 - the job kinds, as a project's task module defines them
import jobs.contrib.celery
from bench import marks, plain_app

app = Celery("bench_user", set_as_current=False)
app.conf.update(plain_app.from_json(json.loads(os.environ.get(plain_app.CONFIG_ENV) or "{}")))


@app.task(name=plain_app.NOOP, bind=True, ignore_result=True)  # type: ignore[untyped-decorator]
def noop(self: Any, tag: str) -> None:
    """The plain side's trivial task, on the user's app."""
    marks.record("done", tag, getattr(self.request, "hostname", None) or "-")


jobs.contrib.celery.install(app)
