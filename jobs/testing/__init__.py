"""Run jobs in-process, for tests (yours and ours): the ``perform_job`` of this system.

These go through the same claim, steps, fencing and transitions as a Celery worker;
only the doorbell is skipped, so a test needs neither a broker nor a worker process.

A job that calls ``ctx.sleep`` (or was submitted with ``delay=``/``run_at=``) comes back
QUEUED, its ``run_after`` the wake-up instant: :func:`drain` leaves it alone until then.
:func:`wake` makes it due now, so the next :func:`drain` runs it past its timer without
the test waiting.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import jobs
from jobs._service.replay_check import ReplayVerdict, replay_job
from jobs._store import Job, JobStore
from jobs._store.replay_reads import RecordedJob
from jobs._worker.run_results import Outcome, RunResult
from jobs._worker.runner import Runner
from jobs.application import default_app


def make_runner(
    store: JobStore | None = None, owner: str | None = None, heartbeat: bool = True
) -> Runner:
    """A runner like a worker's, signed ``inline@<host>:<pid>``; ``heartbeat=False`` runs
    without lease renewals (deterministic tests whose lease outlasts the run). On the
    application's store it rings the doorbells its writes owe with the application's
    doorbell; on a ``store`` of the caller's it rings none."""
    runtime = default_app().runtime
    return Runner.from_settings(
        store or runtime.store,
        owner or f"inline@{socket.gethostname()}:{os.getpid()}",
        runtime.settings,
        heartbeat=runtime.heartbeat if heartbeat else None,
        ring=runtime.ring if store is None else None,
        event_loops=runtime.event_loops,
    )


def run(job_id: str) -> RunResult:
    """Claim and run one job now, in this process."""
    return make_runner().run(job_id)


def perform_job(
    kind: str,
    inputs: dict[str, Any] | None = None,
    *,
    job_id: str | None = None,
    max_attempts: int | None = None,
) -> Job:
    """Submit a job without ringing the doorbell, run it once in-process, return its record."""
    with default_app().runtime.doorbell_off():
        job_id = jobs.submit(kind, inputs, job_id=job_id, max_attempts=max_attempts)
    run(job_id)
    return jobs.get(job_id)


def drain(max_runs: int = 1000) -> list[RunResult]:
    """Run every job that is claimable now, in-process, until none is left (or ``max_runs``)."""
    runner = make_runner()
    results: list[RunResult] = []
    while len(results) < max_runs:
        ids = runner.store.ownership.next_claimable(runner.registry.names(), limit=1)
        if not ids:
            break
        result = runner.run(ids[0])
        results.append(result)
        if result.outcome is Outcome.NOT_CLAIMED:
            break  # another process took it between the look and the claim: let it
    return results


def wake(job_id: str | None = None) -> list[str]:
    """Make sleeping and delayed jobs due now (all of them, or ``job_id``) and return their
    IDs; run them with :func:`drain`. A recorded timer does not sleep again, so the job
    continues past ``ctx.sleep``. For tests only: in production the wake-up is the
    database's clock reaching the timer's instant."""
    return default_app().runtime.store.operator.make_due(None if job_id is None else [job_id])


def replay(job_id: str, store: JobStore | None = None) -> ReplayVerdict:
    """Replay job ``job_id``'s handler, as this process has it, against the steps the job
    recorded, in dry mode (what ``jobctl replay-check`` does for live jobs): recorded
    outputs are returned, and the replay stops at the first call with nothing recorded;
    nothing runs that had not run and nothing is written. Raises the job's
    :class:`jobs.NonDeterministic` if the code no longer makes the calls it recorded;
    otherwise returns the verdict (``ok``, or ``raised`` with what the handler raised).

    In a test of changed code: run a job part way under the old handler (a sleep, an
    approval), register the new one, and ``jobs.testing.replay(job_id)``."""
    app = default_app()
    store = store or app.runtime.store
    steps = store.reads.steps(job_id)
    recorded = RecordedJob(
        store.reads.get(job_id),
        {step.name: step.output for step in steps},
        {step.name: step.position for step in steps},
    )
    verdict = replay_job(store, app.registry, recorded, app.settings.default_max_attempts)
    if verdict.error is not None:
        raise verdict.error
    return verdict
