"""``app.operator``: what an operator does to jobs it does not own — approve, wake,
cancel and retry one job, or a selected batch.

Each move is one compare-and-set in the store (:mod:`jobs._store.operations`); a job
it queues is rung only after the move committed, alone or with the caller's transaction
(:mod:`jobs._service.unit`). The reasons recorded by default are :mod:`jobs._core.reasons`'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Unpack

from jobs._core import reasons
from jobs._core.records import BulkOutcome, Job, Selected, doorbell_of
from jobs._core.validate import check_lookup_id
from jobs._service.unit import JoinKeywords, check_keywords

if TYPE_CHECKING:  # SQLAlchemy and Celery load on first use
    from jobs._service.unit import Transactions
    from jobs._worker.process import ProcessRuntime


class Operator:
    """An operator's moves (``app.operator``; ``jobs.approve``, ``jobs.cancel`` … are the
    default app's). ``runtime``: the application's at the time of each call;
    ``transactions``: where writes commit and doorbells ring.

    Every one-job move takes ``connection=``/``session=``/``unit=`` to join the caller's
    transaction (as :meth:`jobs._service.submitting.JobService.submit` does); without them
    it joins the caller's ambient one where a framework says how to find it (Django's
    ``atomic()``), else commits alone."""

    def __init__(self, runtime: Callable[[], ProcessRuntime], transactions: Transactions) -> None:
        self._runtime = runtime
        self._transactions = transactions

    def approve(
        self,
        job_id: str,
        *,
        by: str,
        note: str | None = None,
        **join: Unpack[JoinKeywords],
    ) -> Job:
        """WAITING_APPROVAL → QUEUED, recording who approved; the job resumes past its
        steps."""
        check_lookup_id(job_id)
        check_keywords("approve", join, JoinKeywords)
        operator = self._runtime().store.operator
        return self._transactions.queue_one(
            lambda conn: operator.approve(job_id, by, note, conn=conn), join
        )

    def wake(
        self,
        job_id: str,
        reason: str = reasons.WOKEN,
        **join: Unpack[JoinKeywords],
    ) -> Job:
        """Make a QUEUED job that waits on a timer (``ctx.sleep``, ``delay``/``run_at``, a
        retry's backoff) due now, recording ``reason`` in its history, and ring its
        doorbell. Any other job raises :class:`jobs.NothingToWake` and nothing changes."""
        check_lookup_id(job_id)
        check_keywords("wake", join, JoinKeywords)
        operator = self._runtime().store.operator
        return self._transactions.queue_one(
            lambda conn: operator.wake_job(job_id, reason, conn=conn), join
        )

    def retry(
        self,
        job_id: str,
        *,
        by: str,
        reason: str = reasons.RETRIED,
        from_start: bool = False,
        **join: Unpack[JoinKeywords],
    ) -> Job:
        """Run a FAILED or CANCELLED job again, from the step that failed: back to QUEUED
        with a fresh budget of attempts (``attempts`` reset to 0, ``max_attempts`` as it
        was), its fence bumped so nothing from an earlier run can write, and its recorded
        steps kept, so the re-run replays them and runs again only from the step that
        failed. ``from_start=True`` drops the recorded steps instead (every step runs
        again). The history records ``by``, ``reason`` and which of the two. A job that is
        queued, running or waiting raises :class:`jobs.IllegalTransition` and nothing
        changes. The doorbell rings after the commit."""
        check_lookup_id(job_id)
        check_keywords("retry", join, JoinKeywords)
        operator = self._runtime().store.operator
        return self._transactions.queue_one(
            lambda conn: operator.retry(job_id, by, reason, from_start=from_start, conn=conn),
            join,
        )

    def cancel(
        self,
        job_id: str,
        reason: str = reasons.CANCELLED,
        **join: Unpack[JoinKeywords],
    ) -> Job:
        """Stop a job that has not ended; a running owner's heartbeat hears it within a
        third of the lease (``ctx.cancelled`` turns true and ``ctx.on_cancel``'s callbacks
        run while the step runs; a prefork child stuck in the step is ended), and its next
        fenced write is refused: nothing more is recorded."""
        check_lookup_id(job_id)
        check_keywords("cancel", join, JoinKeywords)
        with self._transactions.joined(join) as joined:
            conn = None if joined is None else joined.connection
            return self._runtime().store.operator.cancel(job_id, reason, conn=conn)

    def retry_selected(
        self,
        selected: Sequence[Selected],
        *,
        by: str,
        reason: str = reasons.RETRIED,
        from_start: bool = False,
    ) -> BulkOutcome:
        """:meth:`retry` for one batch from ``app.jobs.select_jobs``, in one transaction; a
        job no longer in the state and fence it was selected with is skipped, untouched.
        The retried jobs' doorbells ring after the commit."""
        store = self._runtime().store
        outcome = store.operator.retry_selected(selected, by, reason, from_start=from_start)
        self._transactions.ring_after_commit(None, [doorbell_of(job) for job in outcome.done])
        return outcome

    def cancel_selected(
        self, selected: Sequence[Selected], *, reason: str = reasons.CANCELLED
    ) -> BulkOutcome:
        """:meth:`cancel` for one batch from ``app.jobs.select_jobs``, as
        :meth:`retry_selected`."""
        return self._runtime().store.operator.cancel_selected(selected, reason)

    def approve_selected(
        self, selected: Sequence[Selected], *, by: str, note: str | None = None
    ) -> BulkOutcome:
        """:meth:`approve` for one batch from ``app.jobs.select_jobs``, as
        :meth:`retry_selected` (a selected job not WAITING_APPROVAL is skipped)."""
        outcome = self._runtime().store.operator.approve_selected(selected, by, note)
        self._transactions.ring_after_commit(None, [doorbell_of(job) for job in outcome.done])
        return outcome


__all__ = ["Operator"]
