"""Firing periodic schedules, once per tick, from any number of sweepers and no leader.

For each due tick the sweeper submits the job ``<schedule>@<tick>`` through the store's
idempotent create (a second sweeper firing the same tick meets the existing row and
writes nothing), rings the doorbell only if it created the job, then moves the schedule's
``last_tick`` forward with a compare-and-set. A crash between the two leaves the tick
to be fired again at the next pass, where the existing job ID makes it a no-op.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable

from jobs.core.errors import AdmissionRefused, JobError, UnknownKind
from jobs.core.registry import REGISTRY, Registry
from jobs.core.schedule import Schedule, tick_job_id
from jobs.core.store import JobStore

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
    publish: Callable[[str], bool],
    *,
    default_max_attempts: int,
    registry: Registry = REGISTRY,
    now: dt.datetime | None = None,
) -> list[Fired]:
    """Submit a job for every due tick of every schedule (per its catch-up policy)."""
    instant = now if now is not None else store.now()
    fired: list[Fired] = []
    for schedule in store.schedules():
        try:
            fired.extend(_fire(store, publish, schedule, instant, default_max_attempts, registry))
        except AdmissionRefused as err:
            # Not advanced: the tick is tried again next pass (or replaced by a later one).
            log.warning("schedule %s: tick refused (%s)", schedule.name, err)
            store.count_event("admission_refused", schedule.kind)
        except JobError as err:  # a bad row must not stop the other schedules
            log.error("schedule %s: %s", schedule.name, err)
    return fired


def _fire(
    store: JobStore,
    publish: Callable[[str], bool],
    schedule: Schedule,
    now: dt.datetime,
    default_max_attempts: int,
    registry: Registry,
) -> list[Fired]:
    try:
        kind = registry.get(schedule.kind)
        max_attempts = kind.max_attempts or default_max_attempts
        version = kind.version
    except UnknownKind:  # a sweeper need not import every kind; a worker will check it
        max_attempts, version = default_max_attempts, None
    fired = []
    for tick in schedule.due_ticks(now):
        job_id = tick_job_id(schedule.name, tick)
        job, created = store.create(
            schedule.kind,
            schedule.inputs,
            job_id=job_id,
            max_attempts=max_attempts,
            code_version=version,
        )
        if created:
            publish(job.id)
            log.info("schedule %s: tick %s submitted %s", schedule.name, tick, job.id)
        store.advance_schedule(schedule.name, tick)
        fired.append(Fired(schedule.name, tick, job.id, created))
    return fired
