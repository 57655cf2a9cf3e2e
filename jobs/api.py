"""The public operations (``jobs.submit``, ``jobs.approve`` …) over the process's store.

This facade wires the core to the outside: it opens the store from the settings and
rings the doorbell after every commit that leaves a job QUEUED. The doorbell is a
plain callable, by default the Celery publisher (imported only when first needed, so
the core never imports Celery); tests and embedded users may replace it.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
import uuid
from collections.abc import Callable
from typing import Any

from jobs.core.db import engine_for
from jobs.core.errors import AdmissionRefused
from jobs.core.registry import REGISTRY
from jobs.core.schedule import Schedule, normalize_spec
from jobs.core.settings import get_settings
from jobs.core.states import State
from jobs.core.store import Job, JobStore, KindLimits, Step, Transition
from jobs.schema import ensure_schema

log = logging.getLogger("jobs")

Dispatcher = Callable[[str], None]

_lock = threading.Lock()
_store: tuple[int, str, JobStore] | None = None
_dispatcher: Dispatcher | None = None
_dispatcher_set = False


def get_store() -> JobStore:
    """The process's store for ``JOBS_DATABASE_URL``; the schema is checked on first use."""
    global _store  # noqa: PLW0603 - one store per process and database
    settings = get_settings()
    pid = os.getpid()
    cached = _store
    if cached is not None and cached[0] == pid and cached[1] == settings.database_url:
        return cached[2]
    with _lock:
        engine = engine_for(settings.database_url)
        ensure_schema(engine)
        store = JobStore(engine, max_payload_bytes=settings.max_input_bytes)
        _store = (pid, settings.database_url, store)
        return store


def reset() -> None:
    """Forget the cached store and dispatcher (after the settings changed)."""
    global _store, _dispatcher, _dispatcher_set  # noqa: PLW0603
    with _lock:
        _store = None
        _dispatcher = None
        _dispatcher_set = False


def set_dispatcher(dispatcher: Dispatcher | None) -> None:
    """Replace the doorbell. ``None`` sends none: jobs then reach workers only through the
    sweeper's re-dispatch or an in-process :func:`jobs.testing.drain`."""
    global _dispatcher, _dispatcher_set  # noqa: PLW0603
    _dispatcher = dispatcher
    _dispatcher_set = True


def get_dispatcher() -> Dispatcher | None:
    """The doorbell in use (the Celery publisher unless replaced)."""
    global _dispatcher, _dispatcher_set  # noqa: PLW0603
    if not _dispatcher_set:
        from jobs.runtime.dispatch import publish  # noqa: PLC0415 - Celery only when needed

        _dispatcher = publish
        _dispatcher_set = True
    return _dispatcher


def dispatch(job_id: str) -> bool:
    """Publish a job's ID after its QUEUED state committed. A failure loses nothing: the
    job stays QUEUED in the database and the sweeper sends it again."""
    dispatcher = get_dispatcher()
    if dispatcher is None:
        return False
    try:
        dispatcher(job_id)
    except Exception as err:
        log.warning("job %s: publish failed (%s); the sweeper will re-dispatch it", job_id, err)
        try:
            get_store().forget_dispatch(job_id)
        except Exception:
            log.exception("job %s: could not mark it for re-dispatch", job_id)
        return False
    return True


def new_job_id() -> str:
    return uuid.uuid4().hex


def submit(
    kind: str,
    inputs: dict[str, Any] | None = None,
    *,
    job_id: str | None = None,
    max_attempts: int | None = None,
    delay_seconds: float = 0,
) -> str:
    """Queue a job of a registered kind and return its ID.

    A caller-chosen ``job_id`` makes submit idempotent: the same ID with the same kind and
    inputs returns the existing job's ID (nothing new is written or sent); the same ID with
    different kind or inputs raises :class:`jobs.DuplicateJob`.
    """
    inputs = {} if inputs is None else inputs
    job_kind = REGISTRY.get(kind)
    if isinstance(inputs, dict):
        job_kind.check_inputs(inputs)
    settings = get_settings()
    attempts = (
        max_attempts
        if max_attempts is not None  # 0 is refused by the store, not replaced
        else job_kind.max_attempts or settings.default_max_attempts
    )
    try:
        job, created = get_store().create(
            kind,
            inputs,
            job_id=job_id or new_job_id(),
            max_attempts=attempts,
            delay_seconds=delay_seconds,
            code_version=job_kind.version,
        )
    except AdmissionRefused:
        _count("admission_refused", kind)
        raise
    if created and delay_seconds <= 0:
        dispatch(job.id)
    return job.id


def get(job_id: str) -> Job:
    return get_store().get(job_id)


def steps(job_id: str) -> list[Step]:
    get_store().get(job_id)  # unknown IDs are an error, not an empty list
    return get_store().steps(job_id)


def history(job_id: str) -> list[Transition]:
    get_store().get(job_id)
    return get_store().history(job_id)


def approve(job_id: str, *, by: str, note: str | None = None) -> Job:
    """WAITING_APPROVAL → QUEUED, recording who approved; the job resumes past its steps."""
    job = get_store().approve(job_id, by, note)
    dispatch(job.id)
    return job


def cancel(job_id: str, reason: str = "cancelled by an operator") -> Job:
    """Stop a job that has not ended; a running owner is refused at its next fenced write."""
    return get_store().cancel(job_id, reason)


def set_limits(
    kind: str, *, max_running: int | None = None, max_queued: int | None = None
) -> KindLimits:
    """Backpressure for a kind, for every worker at once: at most ``max_running`` RUNNING
    (enforced by the claim statement) and at most ``max_queued`` QUEUED (a submit past it
    raises :class:`jobs.AdmissionRefused` and writes nothing). ``None`` lifts a limit."""
    return get_store().set_limits(kind, max_running=max_running, max_queued=max_queued)


def seed_limits() -> None:
    """Write the registered kinds' ``max_running``/``max_queued`` defaults for kinds that have
    no limits row yet (workers do this at start-up; the database's numbers then rule)."""
    store = get_store()
    for kind in REGISTRY.kinds():
        if kind.max_running is not None or kind.max_queued is not None:
            store.set_limits(
                kind.name,
                max_running=kind.max_running,
                max_queued=kind.max_queued,
                only_if_absent=True,
            )


def list_jobs(state: State | None = None, kind: str | None = None, limit: int = 100) -> list[Job]:
    return get_store().list(state, kind, limit)


def _count(event: str, kind: str) -> None:
    """Bump an operational counter for the metrics; a failure to count is logged, never raised
    (the caller's own error matters more)."""
    try:
        get_store().count_event(event, kind)
    except Exception:
        log.exception("could not count %s for kind %s", event, kind)


# -- periodic jobs -------------------------------------------------------------------------


def schedule(
    name: str,
    kind: str,
    every: str | int | float | dt.timedelta,
    *,
    inputs: dict[str, Any] | None = None,
    timezone: str = "UTC",
    catch_up: str = "latest",
) -> Schedule:
    """Create or change a periodic job at run time, held in the database for every sweeper.

    ``every`` is a cron expression (``"*/15 * * * *"``, read in ``timezone``) or an interval
    (``"every 10m"``, seconds, a timedelta). Each tick submits one job of ``kind`` with
    ``inputs`` and the ID ``<name>@<tick>``; changing a schedule keeps its last tick.
    """
    inputs = {} if inputs is None else inputs
    REGISTRY.get(kind).check_inputs(inputs)
    return get_store().put_schedule(
        Schedule(
            name, kind, normalize_spec(every), timezone=timezone, inputs=inputs, catch_up=catch_up
        )
    )


def unschedule(name: str) -> bool:
    """Stop a periodic job (its submitted jobs are left alone); False if it did not exist."""
    return get_store().delete_schedule(name)


def schedules() -> list[Schedule]:
    """Every periodic schedule with its last tick (see :meth:`Schedule.next_tick`)."""
    return get_store().schedules()


def sync_schedules() -> list[Schedule]:
    """Write the schedules declared with ``@jobs.job(schedule=…)`` into the database (workers
    and sweepers do this at start-up). A kind whose schedule was removed from the code keeps
    its row until ``jobctl schedules remove NAME``: one process's partial imports must not
    stop another's schedule."""
    store = get_store()
    return [
        store.put_schedule(
            Schedule(
                kind.name,
                kind.name,
                kind.schedule,
                timezone=kind.timezone,
                catch_up=kind.catch_up,
                source="code",
            )
        )
        for kind in REGISTRY.kinds()
        if kind.schedule is not None
    ]
