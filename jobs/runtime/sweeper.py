"""The sweeper: recovery that does not depend on the broker.

Each pass (1) takes back jobs whose owner is known dead (PostgreSQL liveness locks),
(2) re-queues RUNNING jobs whose lease ran out on the database clock, or fails them
when out of attempts, and (3) re-sends the doorbell for QUEUED jobs that are due and
were never published (a failed publish, a retry whose backoff ended) or whose message
seems lost (published longer ago than ``JOBS_REDISPATCH_AFTER_SECONDS``). Every move is
a fenced compare-and-set, so any number of sweepers may run at once.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType

from jobs.core.settings import Settings
from jobs.core.store import JobStore
from jobs.runtime.liveness import rescue_dead_owners

log = logging.getLogger("jobs.sweeper")


@dataclasses.dataclass(frozen=True)
class SweepReport:
    dead_owner: tuple[str, ...] = ()
    expired: tuple[str, ...] = ()
    dispatched: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.dead_owner or self.expired or self.dispatched)


def sweep_once(
    store: JobStore,
    settings: Settings,
    publish: Callable[[Sequence[str]], bool],
    waiting: Callable[[], int | None] = lambda: None,
) -> SweepReport:
    """One pass; ``publish(job_ids)`` rings a batch of doorbells and says whether it could;
    ``waiting()`` is the number of doorbells ready in the broker's queue (``None``: unknown).

    A doorbell published long ago and still unclaimed is either lost or waiting behind a
    backlog; the queue cannot say which one. So of the stale jobs, only as many are re-sent
    as the queue is short of: with 5,000 doorbells ready in the queue, a backlog of 5,000
    slow jobs is not published a second time, while lost ones are re-sent once it drains."""
    dead = [job.id for job in rescue_dead_owners(store)]
    expired = [job.id for job in store.sweep_expired()]
    stale_limit = None
    ready = waiting()
    if ready is not None:
        stale_limit = store.stale_dispatches(settings.redispatch_after_seconds) - ready
    due = store.due_for_dispatch(settings.redispatch_after_seconds, stale_limit=stale_limit)
    dispatched = due if due and publish(due) else []
    return SweepReport(tuple(dead), tuple(expired), tuple(dispatched))


def run_forever(
    store: JobStore,
    settings: Settings,
    publish: Callable[[Sequence[str]], bool],
    stop: threading.Event | None = None,
    waiting: Callable[[], int | None] = lambda: None,
) -> None:
    stop = stop or threading.Event()

    def _stop(signum: int, _frame: FrameType | None) -> None:
        log.info("sweeper: signal %d, stopping after this pass", signum)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
    log.info(
        "sweeper: every %.1fs on %s",
        settings.sweep_interval_seconds,
        store.engine.url.render_as_string(hide_password=True),
    )
    while not stop.is_set():
        try:
            report = sweep_once(store, settings, publish, waiting)
            if report:
                log.info("sweeper: %s", report)
        except Exception:  # the database may be restarting: try again next pass
            log.exception(
                "sweeper: pass failed; next try in %.1fs", settings.sweep_interval_seconds
            )
        stop.wait(settings.sweep_interval_seconds)
