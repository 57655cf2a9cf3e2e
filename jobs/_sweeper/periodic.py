"""Firing periodic schedules, once per tick, from any number of sweepers and no leader.

For each due tick the sweeper moves the schedule's ``last_tick`` forward with a
compare-and-set and, in the same transaction, submits the job ``<schedule>@<tick>``
(:meth:`jobs._store.JobStore.fire_tick`), then rings the doorbell after the commit.
Of several sweepers firing one tick, one moves ``last_tick`` and submits; the others find
it moved and do nothing. The deterministic job ID is the second guard: even a tick fired
twice (a schedule deleted and re-created) meets the existing row and adds no job.

No caller can choose a tick's ID (:func:`jobs._core.validate.check_user_job_id`); a tick
whose ID is nevertheless taken by another job (written before IDs were reserved) is skipped
with a warning naming it, never retried forever. A schedule row that cannot be computed is
logged and skipped: it never stops the other schedules or the rest of a sweeper's pass.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging

from jobs._core.errors import AdmissionRefused, DuplicateJob, JobError, UnknownKind
from jobs._core.records import Batch, RingBatch
from jobs._core.registry import REGISTRY, Registry
from jobs._core.schedule_ticks import Schedule, tick_job_id
from jobs._store import JobStore

log = logging.getLogger("jobs.periodic")


@dataclasses.dataclass(frozen=True)
class Fired:
    """One tick a pass handled: the job it names, and whether this pass created it."""

    schedule: str
    tick: dt.datetime
    job_id: str
    created: bool


def fire_due_ticks(
    store: JobStore,
    ring_batch: RingBatch,
    *,
    default_max_attempts: int,
    registry: Registry = REGISTRY,
    now: dt.datetime | None = None,
) -> list[Fired]:
    """Submit a job for every due tick of every schedule (per its catch-up policy)."""
    instant = now if now is not None else store.reads.now()
    fired: list[Fired] = []
    for schedule in store.reads.schedules():
        try:
            fired.extend(
                _fire(store, ring_batch, schedule, instant, default_max_attempts, registry)
            )
        except AdmissionRefused as err:
            # Rolled back with last_tick: tried again next pass (or replaced by a later tick).
            log.warning("schedule %s: tick refused (%s)", schedule.name, err)
            store.schedules.count_event("admission_refused", schedule.kind)
        except JobError as err:  # a bad row must not stop the other schedules
            log.error("schedule %s: %s", schedule.name, err)
        except Exception as err:  # a row no check lets in any more (OverflowError …)
            log.error(
                "schedule %s: skipped this pass: %s: %s", schedule.name, type(err).__name__, err
            )
    return fired


def _fire(
    store: JobStore,
    ring_batch: RingBatch,
    schedule: Schedule,
    now: dt.datetime,
    default_max_attempts: int,
    registry: Registry,
) -> list[Fired]:
    try:
        kind = registry.get(schedule.kind)
        max_attempts = kind.max_attempts or default_max_attempts
        priority, queue = kind.priority, kind.queue
    except UnknownKind:  # a sweeper need not import every kind; a worker will check it
        max_attempts, priority, queue = default_max_attempts, 0, None
    fired = []
    for tick in schedule.due_ticks(now):
        job_id = tick_job_id(schedule.name, tick)
        try:
            outcome = store.schedules.fire_tick(
                schedule,
                tick,
                job_id=job_id,
                max_attempts=max_attempts,
                code_version=None,  # recorded at its first claim (jobs._core.kind_versions)
                priority=priority,
                queue=queue,
            )
        except DuplicateJob:
            # The tick's ID is another job's: skip the tick, say so, and go on to the next.
            if store.schedules.advance_schedule(schedule.name, tick):
                log.warning(
                    "schedule %s: tick %s skipped: its job ID %s is taken by another job "
                    "(another kind or inputs); see jobctl show %s",
                    schedule.name,
                    tick.isoformat(),
                    job_id,
                    job_id,
                )
                store.schedules.count_event("tick_skipped", schedule.kind)
            continue
        if outcome is None:
            continue  # another sweeper fired this tick (or a later one) first
        job, created = outcome
        if created:
            ring_batch(Batch.of(job))
            log.info("schedule %s: tick %s submitted %s", schedule.name, tick, job.id)
        fired.append(Fired(schedule.name, tick, job.id, created))
    return fired
