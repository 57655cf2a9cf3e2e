"""The project's tasks: plain Celery tasks as they were, and two durable kinds on two
queues (``video`` for the big hosts, ``mail`` for the small ones)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

import jobs
from proj.celery import app

# -- plain Celery tasks, untouched -------------------------------------------------------


@app.task
def add(x: int, y: int) -> int:
    """A plain task: runs on the ``celery`` queue with the app's own settings."""
    return x + y


@app.task
def heartbeat() -> str:
    """What the beat schedule sends every minute."""
    return "alive"


@app.task
def place_order(order_id: int, email: str) -> str:
    """A plain task that records an order and submits the durable confirmation e-mail in
    the same database transaction: both commit, or neither does."""
    engine = jobs.default_app().runtime.engine  # the jobs' database, the same connections
    with engine.begin() as connection:
        connection.execute(
            text("CREATE TABLE IF NOT EXISTS proj_orders (id integer PRIMARY KEY, email text)")
        )
        connection.execute(
            text("INSERT INTO proj_orders (id, email) VALUES (:id, :email)"),
            {"id": order_id, "email": email},
        )
        jobs.submit(
            "send_email",
            {"to": email},
            job_id=f"order-{order_id}-mail",
            connection=connection,
        )
    engine.dispose()
    return f"order {order_id} placed"


# -- durable jobs --------------------------------------------------------------------------


@jobs.job("transcode", queue="video", max_attempts=2)
def transcode(ctx: jobs.JobContext, video_id: int, fail: bool = False) -> dict[str, Any]:
    """Two recorded steps; ``fail`` makes every attempt fail (a codec nobody supports)."""
    probe = ctx.step("probe", lambda: {"video_id": video_id, "frames": 240})
    if fail:
        raise RuntimeError(f"video {video_id}: codec not supported")
    return ctx.step("encode", lambda: {"video_id": probe["video_id"], "encoded": True})


@jobs.job("send_email", queue="mail")
def send_email(ctx: jobs.JobContext, to: str, needs_approval: bool = False) -> dict[str, Any]:
    """One recorded step; ``needs_approval`` parks the job until someone approves it."""
    if needs_approval:
        ctx.wait_for_approval(f"bulk mail to {to}")
    return ctx.step("send", lambda: {"sent_to": to})
