"""The sweeper: recovery that does not depend on the broker.

Each pass (1) takes back jobs whose owner is known dead (PostgreSQL liveness locks),
(2) re-queues RUNNING jobs whose lease ran out on the database clock, or fails them
when out of attempts, ends the waits whose deadline passed (``ctx.wait_for_event``,
``ctx.wait_for_approval(timeout=)``) and queues a parent parked for children none of
which is unfinished (a safety net: the last child's own write queues it), and (3)
re-sends the doorbell for QUEUED jobs that are due and were never published (a failed
publish, a retry whose backoff ended) or whose message seems lost (published longer
ago than ``JOBS_RING_AGAIN_AFTER_SECONDS``). It then
(4) submits one job per due tick of each periodic schedule (:mod:`jobs._sweeper.periodic`)
and (5) deletes a few batches of finished jobs past ``JOBS_RETENTION_DAYS``. Every move is
a fenced compare-and-set and every tick a deterministic job ID, so any number of sweepers
may run at once. Recoveries are counted by cause in the database for the metrics.

On RabbitMQ a :class:`~jobs._sweeper.queue_watch.QueueWatch` also looks at the queue each
pass: when it was gone (declared again now) or served again after its node was down, the
doorbells it held may be lost, so every due QUEUED job is rung again at once instead of
after ``JOBS_RING_AGAIN_AFTER_SECONDS``.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from types import FrameType

from jobs._config.settings import Settings
from jobs._core import tracing
from jobs._core.outage import first_line, is_disconnect
from jobs._core.records import Job, RingBatch, ring_in_batches
from jobs._core.states import State
from jobs._core.validate import check_days
from jobs._doorbell.queues import with_bands
from jobs._store import JobStore
from jobs._sweeper.periodic import fire_due_ticks
from jobs._sweeper.queue_watch import QueueHealth, QueueWatch
from jobs._worker.liveness import rescue_dead_owners

log = logging.getLogger("jobs.sweeper")

Announce = Callable[[Sequence[Job]], object]
"""Tells Celery's monitors (Flower) of jobs a pass ended with no delivery to report it:
:class:`jobs._worker.outcome_events.OutcomeEvents`."""


#: Retention deletes at most this many batches per pass, so a pass stays short and the
#: rest waits for the next one.
PRUNE_BATCH_SIZE = 200
PRUNE_BATCHES_PER_PASS = 4
DAY_SECONDS = 86400.0


@dataclasses.dataclass(frozen=True)
class SweepReport:
    """What one pass did, by job ID."""

    dead_owner: tuple[str, ...] = ()
    expired: tuple[str, ...] = ()
    rung: tuple[str, ...] = ()
    lost_messages: tuple[str, ...] = ()
    ticks: tuple[str, ...] = ()
    pruned: int = 0

    def __bool__(self) -> bool:
        return bool(self.dead_owner or self.expired or self.rung or self.ticks or self.pruned)


def _count_by_kind(store: JobStore, event: str, kinds: Iterable[str]) -> None:
    for kind, amount in Counter(kinds).items():
        store.schedules.count_event(event, kind, amount)


def _trace_recoveries(recovered: Iterable[Job], what: str) -> None:
    """A short ``jobs.recover`` span in each recovered job's trace (jobs._core.tracing)."""
    for job in recovered:
        tracing.recovery(
            job.trace_context,
            what,
            **{
                "jobs.job.id": job.id,
                "jobs.job.kind": job.kind,
                "jobs.state": job.state.value,
                "jobs.attempt": job.attempts,
            },
        )


def ring_all_due(store: JobStore, ring_batch: RingBatch) -> list[str]:
    """Ring again every due QUEUED job's doorbell, however recently it was sent (the queue
    that held it was lost). Each batch is marked rung as it is taken, and only jobs
    rung before this call started are taken, so the loop ends."""
    started = time.monotonic()
    taken: set[str] = set()
    rung: list[str] = []
    while True:
        since_start = max(time.monotonic() - started, 1e-6)
        batch = [
            doorbell
            for doorbell in store.doorbells.take_due_doorbells(since_start)
            if doorbell.job_id not in taken
        ]
        if not batch:
            return rung
        taken.update(doorbell.job_id for doorbell in batch)
        rung += ring_in_batches(ring_batch, batch)


def sweep_once(
    store: JobStore,
    settings: Settings,
    ring_batch: RingBatch,
    waiting: Callable[[], int | None] = lambda: None,
    watch: QueueWatch | None = None,
    announce: Announce | None = None,
) -> SweepReport:
    """One pass of recovery, doorbells, periodic ticks and retention; ``ring_batch(batch)``
    rings a batch of doorbells of one priority, kind and queue and says whether it could (due
    jobs are rung the highest priority first);
    ``waiting()`` is the number of doorbells ready in the broker's queue (``None``: unknown),
    asked only without a ``watch``: the watch's own look at the queue already counted them.

    A doorbell published long ago and still unclaimed is either lost or waiting behind a
    backlog; the queue cannot say which one. So of the stale jobs, only as many are re-sent
    as the queue is short of: with 5,000 doorbells ready in the queue, a backlog of 5,000
    slow jobs is not rung a second time, while lost ones are rung again once it drains.

    With a ``watch`` (RabbitMQ), a queue that was gone or unavailable may have lost every
    doorbell it held: then every due one is rung at once, however recently it was sent.

    ``announce(jobs)`` hears of the jobs this pass FAILED (out of attempts after crashes),
    which no delivery will report to Celery's monitors."""
    dead = rescue_dead_owners(store)
    expired = store.operator.sweep_expired()
    if announce is not None:
        announce([job for job in (*dead, *expired) if job.state is State.FAILED])
    # Workflows: waits whose deadline passed, and (the safety net) parents no unfinished
    # child will wake; both are left QUEUED and unsent, so the ring below reaches them.
    timed_out = store.workflows.fire_deadlines()
    stranded = store.workflows.wake_stranded_parents()
    _count_by_kind(store, "wait_deadline", (job.kind for job in timed_out))
    _count_by_kind(store, "recovery_stranded_parent", (job.kind for job in stranded))
    _count_by_kind(store, "recovery_dead_owner", (job.kind for job in dead))
    _count_by_kind(store, "recovery_expired_lease", (job.kind for job in expired))
    if tracing.ENABLED:
        _trace_recoveries(dead, "dead_owner")
        _trace_recoveries(expired, "expired_lease")
    stale = store.depth.awaiting_ring_again(settings.ring_again_after_seconds)
    health = QueueHealth.OK
    if watch is not None:  # every queue a QUEUED job waits on, JOBS_QUEUE always
        waited_on = sorted(queue for queue in store.depth.queued_by_queue() if queue is not None)
        health = watch.check(with_bands(settings, [settings.queue, *waited_on]))
    rung = ring_all_due(store, ring_batch) if health.ring_all else []
    stale_limit = None
    ready = watch.ready if watch is not None else waiting()
    if ready is not None:
        stale_limit = store.depth.stale_doorbells(settings.ring_again_after_seconds) - ready
    due = store.doorbells.take_due_doorbells(
        settings.ring_again_after_seconds, stale_limit=stale_limit
    )
    rung += ring_in_batches(ring_batch, due)
    lost = [job_id for job_id in rung if job_id in stale]
    _count_by_kind(store, "recovery_lost_message", (stale[job_id] for job_id in lost))
    try:
        ticks = fire_due_ticks(
            store, ring_batch, default_max_attempts=settings.default_max_attempts
        )
    except Exception:  # ticks must not stop retention (each schedule is guarded already)
        log.exception("sweeper: periodic ticks failed this pass")
        ticks = []
    return SweepReport(
        tuple(job.id for job in dead),
        tuple(job.id for job in expired),
        tuple(rung),
        tuple(lost),
        tuple(tick.job_id for tick in ticks if tick.created),
        prune(store, settings.retention_days),
    )


def prune(
    store: JobStore, retention_days: float | None, *, batches: int = PRUNE_BATCHES_PER_PASS
) -> int:
    """Delete up to ``batches`` batches of finished jobs past retention; returns how many."""
    if retention_days is None:
        return 0
    days = check_days(retention_days, "retention days")
    deleted = 0
    for _ in range(batches):
        batch = store.schedules.prune_finished(days * DAY_SECONDS, PRUNE_BATCH_SIZE)
        deleted += len(batch)
        if len(batch) < PRUNE_BATCH_SIZE:
            break
    return deleted


def run_forever(
    store: JobStore,
    settings: Settings,
    ring_batch: RingBatch,
    stop: threading.Event | None = None,
    waiting: Callable[[], int | None] = lambda: None,
    watch: QueueWatch | None = None,
    announce: Announce | None = None,
) -> None:
    """``jobctl sweeper``: a :func:`sweep_once` pass every ``JOBS_SWEEP_INTERVAL_SECONDS``
    until SIGTERM/SIGINT (or ``stop``); a pass that fails is logged and the next one runs.
    Any number of sweepers may run at once: each pass's moves are compare-and-sets."""
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
            report = sweep_once(store, settings, ring_batch, waiting, watch, announce)
            if report:
                log.info("sweeper: %s", report)
        except Exception as err:  # the database may be restarting: try again next pass
            if is_disconnect(err):  # unreachable, or its disk full: one line, no traceback
                log.warning(
                    "sweeper: pass failed (%s); next try in %.1fs",
                    first_line(err),
                    settings.sweep_interval_seconds,
                )
            else:
                log.exception(
                    "sweeper: pass failed; next try in %.1fs", settings.sweep_interval_seconds
                )
        stop.wait(settings.sweep_interval_seconds)
