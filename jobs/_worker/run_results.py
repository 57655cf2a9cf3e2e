"""How one delivery of a job ended: the :class:`Outcome` and the :class:`RunResult` the
runner returns (to the Celery task, ``jobs.testing``, the logs, the metrics and the
events), and how that end is put on the run's trace span."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from jobs._core import tracing
from jobs._store import Job


class Outcome(enum.StrEnum):
    """How one delivery of a job ended, as the runner reports it (logs, tests, metrics)."""

    COMPLETED = "completed"
    FAILED = "failed"
    RETRYING = "retrying"
    WAITING_APPROVAL = "waiting_approval"
    SLEEPING = "sleeping"
    HANDED_BACK = "handed_back"
    WAITING = "waiting"  # parked WAITING for children or an event
    NOT_CLAIMED = "not_claimed"
    LEASE_LOST = "lease_lost"


@dataclass(frozen=True)
class RunResult:
    """One delivery's result: its outcome, the job as it was written, and which steps ran
    and which were replayed from their records (what ``jobs.testing`` returns)."""

    job_id: str
    outcome: Outcome
    job: Job | None = None
    ran_steps: tuple[str, ...] = ()
    replayed_steps: tuple[str, ...] = ()
    error: str | None = None
    # The kind's running limit seen by the claim: a finished run freed one of its slots.
    max_running: int | None = None
    # The per-key limit the claim enforced for the job's concurrency key: a finished run
    # freed a slot of that key.
    max_running_per_key: int | None = None


def trace_outcome(span: Any, result: RunResult) -> None:
    """Put ``result`` on the run's span: an event for the wait, sleep or retry the run
    ended in (with when it is due again), then the outcome and any error."""
    job = result.job
    if job is not None:
        due = job.run_after.isoformat()
        if result.outcome is Outcome.RETRYING:
            tracing.event("jobs.retry", attempt=job.attempts, due_at=due, error=result.error)
        elif result.outcome is Outcome.SLEEPING:
            tracing.event("jobs.sleep", wake_at=due)
        elif result.outcome is Outcome.WAITING_APPROVAL:
            tracing.event("jobs.wait.approval", step=job.waiting_for)
        elif result.outcome is Outcome.WAITING:
            tracing.event(
                "jobs.wait",
                event=job.wait_event,
                children_pending=job.children_pending,
                step=job.waiting_for,
            )
        elif result.outcome is Outcome.HANDED_BACK:
            tracing.event("jobs.hand_back")
    tracing.outcome(span, result.outcome.value, result.error)
