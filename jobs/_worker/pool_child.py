"""What a worker that runs durable jobs does to its processes: the code its pool children
share, loaded and frozen before the pool forks, and each prefork child's start (its
time-limit backstop, and its database side made ready in the background).

Only workers that consume a durable queue do any of it (:mod:`jobs._worker.celery_setup`
decides, and says so at start-up): a worker of the same app that serves only plain tasks
keeps its garbage collector and its signal handlers as Celery left them.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import threading
from typing import Any

from billiard.process import current_process

from jobs._config.settings import Settings

log = logging.getLogger("jobs.worker")

EXIT_TIMED_OUT = 70
"""Exit status of a pool child ended because a run passed its time limit (EX_SOFTWARE)."""


def preload_for_the_pool(settings: Settings) -> None:
    """Load, before the pool forks, the code every pool child runs (the delivery, SQLAlchemy,
    the database driver), without connecting anywhere, then freeze the garbage collector's
    view of it: the children share those pages with this process instead of each importing
    its own copy, and no collection in a child touches (and so copies) them. Measured on a
    worker with two children: 116 MiB proportional set size (PSS) against 144 MiB when each
    child imported on its own (bench: worker memory)."""
    import jobs._worker.delivery  # noqa: F401, PLC0415 - what every delivery runs

    if settings.database_url.startswith("postgresql"):
        import psycopg  # noqa: F401, PLC0415 - the driver the children's engines load

    gc.collect()
    gc.freeze()


def start_pool_child(host: Any) -> None:
    """A prefork child arms its time-limit backstop, then, in a thread of its own, takes its
    liveness lock, seeds the limits its kinds declare and writes their schedules. Celery
    ends a child that is not up within ``worker_proc_alive_timeout`` (4 s), and a jobs
    database that accepts connections and never answers holds a connect for up to its
    timeout: so nothing here waits for the database, and the child serves plain tasks at
    once. The lock is taken again before the child's first claim, which waits for the
    database on its own. (The main process never touches the database: it only consumes
    messages and hands them to the pool, so it loads no SQLAlchemy.)"""
    runtime = host.runtime
    # The solo pool sends this signal too, in the worker's own process: ended at a time
    # limit, it would take the whole worker with it. There the stuck step runs on.
    if current_process().name != "MainProcess":  # billiard's name for a prefork child
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the time-limit backstop ends the child
        runtime.stop_on_timeout(_end_timed_out_child, _arm_alarm)
    threading.Thread(
        target=_ready_the_database_side, args=(host,), name="jobs-child-start", daemon=True
    ).start()


def _ready_the_database_side(host: Any) -> None:
    runtime = host.runtime
    try:  # bounded by the connect timeout; taken again before the child's first claim
        runtime.liveness_key()
        runtime.seed_limits()
        host.schedules.sync()  # periodic kinds declared in code, fired by sweepers
    except Exception as err:  # the database may be down: the child must still start
        log.warning("liveness lock not taken yet: %s", type(err).__name__)


def _end_timed_out_child(why: str) -> None:
    """Celery's hard time limit, decided inside the child: billiard's pool ends a child
    past ``time_limit`` with SIGTERM then SIGKILL from the main process, but only the child
    knows a job's kind and its steps, so the child's heartbeat decides. By the time this
    runs the run's outcome (retry or FAILED, fenced) is written; the stuck handler may be
    in a C call no exception can interrupt, so the process exits at once. Celery sees the
    child lost (``task_reject_on_worker_lost``: the doorbell goes back to the queue, and a
    later claim finds the job not due or finished), and the pool starts a new child."""
    log.error("%s; ending pool process %d (the pool starts a new one)", why, os.getpid())
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):  # the process ends next whatever happens
            handler.flush()
    os._exit(EXIT_TIMED_OUT)


def _arm_alarm(seconds: float | None) -> None:
    """The time-limit backstop of a pool child: the kernel's interval timer, whose SIGALRM
    (default action) ends the process with no Python code running, so even a step holding
    the GIL in C code, which keeps the heartbeat thread from ever running, is ended. Armed
    one lease past the earliest deadline (the heartbeat's own stop comes first whenever it
    can run), disarmed when the run ends."""
    signal.setitimer(signal.ITIMER_REAL, 0.0 if seconds is None else max(seconds, 0.001))
