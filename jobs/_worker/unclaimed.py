"""What a delivery does when its claim took nothing: say why, in the log line (unknown
job, someone else's lease, another version of the kind, a pause, not due, a full key or
kind), and, when a global rate limit held the job back, wait in the worker for the next
start if this delivery is the rate's waiter (:mod:`jobs._store.rate_limits`).

Both answers come from one :class:`Unclaimed`: the job, its kind's limits, the pauses and
the database's now (whether the job is due), each read once, when first asked for, after
the claim; the rate's wait and then the log line's reason read nothing again (and the
rate's hold is handed the limits read)."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

from jobs._core.errors import UnknownJob
from jobs._core.kind_versions import KindVersions
from jobs._core.records import Job, KindLimits, Pause
from jobs._core.states import State
from jobs._store.pause_clauses import holding
from jobs._store.reader import JobReader
from jobs._worker.runner import Runner

log = logging.getLogger("jobs.worker")


# A delivery whose job a rate holds back waits in the worker for the next start when it
# is this near (one delivery per rate: jobs._store.rate_limits); a later one is left to the
# start before it, or the sweeper. It claims again at most this many times.
RATE_WAIT_SECONDS = 2.0
RATE_WAITS = 3


class Unclaimed:
    """What a delivery whose claim took nothing reads of ``job_id`` to decide whether to
    wait for its rate (:func:`wait_for_rate`) and to say why (:func:`why_not_claimed`):
    each read runs once, when first asked for, so it follows the claim and serves both.
    Make a new one after anything that may have moved the job (a wait, a claim)."""

    def __init__(self, reads: JobReader, job_id: str) -> None:
        self.reads = reads
        self.job_id = job_id

    @functools.cached_property
    def job(self) -> Job | None:
        """The job (``None``: no such job)."""
        try:
            return self.reads.get(self.job_id)
        except UnknownJob:
            return None

    @functools.cached_property
    def limits(self) -> KindLimits | None:
        """The limits of the job's kind (``None``: none, or no such job)."""
        return None if self.job is None else self.reads.limits().get(self.job.kind)

    @functools.cached_property
    def pause(self) -> Pause | None:
        """The pause that holds the job (``None``: none, or no such job)."""
        job = self.job
        return None if job is None else holding(self.reads.pauses(), job.kind, job.queue)

    @functools.cached_property
    def due(self) -> bool:
        """Whether the job is due on the database's clock (``False``: no such job)."""
        return self.job is not None and self.job.run_after <= self.reads.now()


def wait_for_rate(runner: Runner, seen: Unclaimed, stopping: Callable[[], bool]) -> bool:
    """The claim took nothing: when a rate held the job back (QUEUED, due, unpaused) and
    this delivery is its rate's waiter for the next start, wait for it and say so (the
    caller claims again, and reads anew); otherwise the job's doorbell is held for the
    rate, or it was not the rate: ``False``. ``seen``: what was read after the claim."""
    if stopping():
        return False
    job = seen.job
    if job is None or job.state is not State.QUEUED or job.kind not in runner.registry.names():
        return False
    limits = seen.limits
    if limits is None or (limits.rate_limit is None and limits.rate_limit_per_key is None):
        return False
    if seen.pause is not None or not seen.due:
        return False
    waiting = runner.store.doorbells.hold_for_rate(job, limits, RATE_WAIT_SECONDS)
    if waiting is None:
        log.info("job %s: held by its rate limit; a start of its rate rings it", job.id)
        return False
    describe, wait = waiting
    if wait > 0:
        log.info("job %s: %s: waiting %.3f s for the next start", job.id, describe, wait)
        time.sleep(wait)
    return True


def _other_version(versions: KindVersions, job: Job) -> str:
    """Why a job of a kind this worker knows is left to another worker's version (its
    doorbell is dropped; the sweeper rings it again after ``JOBS_RING_AGAIN_AFTER_SECONDS``,
    as a job of a kind this worker does not know)."""
    versioned = versions.of(job.kind)
    runs = "none" if versioned is None else ", ".join(versioned.runs)
    if job.code_version is None:
        return (
            f"QUEUED, not claimed yet, of kind {job.kind!r}, and this worker drains "
            "(JOBS_DRAIN=on: it takes no new job of a kind with a version); left for another"
        )
    return (
        f"QUEUED, waiting for a worker that runs version {job.code_version} of kind "
        f"{job.kind!r} (recorded at its first claim; this worker runs {runs}); left for one "
        "that does, rung again by the sweeper"
    )


def why_not_claimed(runner: Runner, seen: Unclaimed) -> tuple[str, Job | None, bool]:
    """Why a claim took nothing, for the log, from what ``seen`` read (or reads now); the
    job, when its concurrency key was full (its doorbell is then held for the key:
    :meth:`Doorbells.hold_for_key`); and whether it is left to a worker of another version
    of its kind (:func:`_other_version`)."""
    job = seen.job
    if job is None:
        return "unknown job", None, False
    if job.state is State.RUNNING:
        return f"RUNNING under {job.owner}'s lease until {job.lease_until:%H:%M:%S.%f}", None, False
    if job.state is not State.QUEUED:
        return f"already {job.state.value}", None, False
    known = runner.registry.names()
    if job.kind not in known:
        return (
            (
                f"QUEUED, of kind {job.kind!r}, which this worker does not know "
                f"(it runs {', '.join(known) or 'no kinds'}); left for a worker that does"
            ),
            None,
            False,
        )
    versions = runner.registry.versions(runner.run_versions, runner.drain)
    if not versions.runs(job.kind, job.code_version):
        return _other_version(versions, job), None, True
    pause = seen.pause
    if pause is not None:
        return f"QUEUED, held: {pause.describe()}; its resume rings it again", None, False
    if not seen.due:
        return f"QUEUED but not due until {job.run_after:%H:%M:%S.%f}", None, False
    limits = seen.limits
    per_key = None if limits is None else limits.max_running_per_key
    if per_key is not None and job.concurrency_key is not None:
        return (
            (
                f"QUEUED, waiting for a slot of key {job.concurrency_key!r} ({job.kind!r} "
                f"allows {per_key} RUNNING per key); a finishing job of the key rings it"
            ),
            job,
            False,
        )
    if limits is not None and limits.max_running is not None:
        return (
            (
                f"QUEUED, waiting for a slot ({job.kind!r} allows {limits.max_running} "
                "RUNNING at once)"
            ),
            None,
            False,
        )
    return "QUEUED, claimed by no one yet (try again)", None, False
