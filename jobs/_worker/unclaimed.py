"""What a delivery does when its claim took nothing: say why, in the log line (unknown
job, someone else's lease, another version of the kind, a pause, not due, a full key or
kind), and, when a global rate limit held the job back, wait in the worker for the next
start if this delivery is the rate's waiter (:mod:`jobs._store.rate_limits`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from jobs._core.errors import UnknownJob
from jobs._core.kind_versions import KindVersions
from jobs._core.records import Job
from jobs._core.states import State
from jobs._store.pause_clauses import holding
from jobs._worker.runner import Runner

log = logging.getLogger("jobs.worker")


# A delivery whose job a rate holds back waits in the worker for the next start when it
# is this near (one delivery per rate: jobs._store.rate_limits); a later one is left to the
# start before it, or the sweeper. It claims again at most this many times.
RATE_WAIT_SECONDS = 2.0
RATE_WAITS = 3


def wait_for_rate(runner: Runner, job_id: str, stopping: Callable[[], bool]) -> bool:
    """The claim took nothing: when a rate held the job back (QUEUED, due, unpaused) and
    this delivery is its rate's waiter for the next start, wait for it and say so (the
    caller claims again); otherwise the job's doorbell is held for the rate, or it was
    not the rate: ``False``."""
    if stopping():
        return False
    reads = runner.store.reads
    try:
        job = reads.get(job_id)
    except UnknownJob:
        return False
    if job.state is not State.QUEUED or job.kind not in runner.registry.names():
        return False
    limits = reads.limits().get(job.kind)
    if limits is None or (limits.rate_limit is None and limits.rate_limit_per_key is None):
        return False
    if holding(reads.pauses(), job.kind, job.queue) is not None or job.run_after > reads.now():
        return False
    waiting = runner.store.doorbells.hold_for_rate(job, RATE_WAIT_SECONDS)
    if waiting is None:
        log.info("job %s: held by its rate limit; a start of its rate rings it", job_id)
        return False
    describe, wait = waiting
    if wait > 0:
        log.info("job %s: %s: waiting %.3f s for the next start", job_id, describe, wait)
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


def why_not_claimed(runner: Runner, job_id: str) -> tuple[str, Job | None, bool]:
    """Why a claim took nothing, for the log; the job, when its concurrency key was full
    (its doorbell is then held for the key: :meth:`Doorbells.hold_for_key`); and whether it
    is left to a worker of another version of its kind (:func:`_other_version`)."""
    try:
        job = runner.store.reads.get(job_id)
    except UnknownJob:
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
    pause = holding(runner.store.reads.pauses(), job.kind, job.queue)
    if pause is not None:
        return f"QUEUED, held: {pause.describe()}; its resume rings it again", None, False
    if job.run_after > runner.store.reads.now():
        return f"QUEUED but not due until {job.run_after:%H:%M:%S.%f}", None, False
    limits = runner.store.reads.limits().get(job.kind)
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
