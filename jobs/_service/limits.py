"""``app.limits``: backpressure per kind, for every worker at once — at most so many
RUNNING (the claim statement enforces it) and at most so many QUEUED (a submit past it is
refused and writes nothing) — and pauses: a paused kind or queue has none of its jobs
claimed until it is resumed (the claim statement enforces that too)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from jobs._core.records import KindLimits, Pause, Resumed

if TYPE_CHECKING:  # SQLAlchemy loads on first use
    from jobs._worker.process import ProcessRuntime


class LimitService:
    """Kinds' limits (``app.limits``; ``jobs.set_limits`` and ``jobs.seed_limits`` are the
    default app's). ``runtime``: the application's at the time of each call."""

    def __init__(self, runtime: Callable[[], ProcessRuntime]) -> None:
        self._runtime = runtime

    def put(
        self,
        kind: str,
        *,
        max_running: int | None = None,
        max_queued: int | None = None,
        max_running_per_key: int | None = None,
        rate_limit: str | None = None,
        rate_limit_per_key: str | None = None,
    ) -> KindLimits:
        """Set a kind's limits for every worker at once: at most ``max_running`` RUNNING,
        at most ``max_queued`` QUEUED (a submit past it raises
        :class:`jobs.AdmissionRefused` and writes nothing), and at most
        ``max_running_per_key`` RUNNING of one concurrency key; at most ``rate_limit``
        starts of the kind and ``rate_limit_per_key`` of one key, across all workers, in
        Celery's syntax (``"60/m"``: N/s, N/m, N/h). ``None`` lifts a limit."""
        submissions = self._runtime().store.submissions
        return submissions.set_limits(
            kind,
            max_running=max_running,
            max_queued=max_queued,
            max_running_per_key=max_running_per_key,
            rate_limit=rate_limit,
            rate_limit_per_key=rate_limit_per_key,
        )

    def seed(self) -> None:
        """Write the registered kinds' ``max_running``/``max_queued`` defaults for kinds
        that have no limits row yet (workers do this at start-up, submitters before a
        kind's first submit; the database's numbers then rule)."""
        self._runtime().seed_limits()

    def pause(
        self,
        kind: str | None = None,
        *,
        queue: str | None = None,
        by: str | None = None,
        reason: str | None = None,
    ) -> Pause:
        """Pause one job kind, or one ``queue`` (every kind whose doorbells go there): from
        the commit on, no worker claims its jobs. Nothing fails and nothing is lost: jobs
        submitted meanwhile are QUEUED as ever, a doorbell that arrives is dropped (the job
        stays QUEUED), and jobs already RUNNING finish their run. A kind no code here
        registers may be paused (before its code is deployed, say). Pausing what is
        already paused keeps the first pause, which is returned."""
        runtime = self._runtime()
        pause, _created = runtime.store.pauses.pause(
            kind=kind,
            queue=queue,
            by=by,
            reason=reason,
            default_queue=queue is not None and queue == runtime.settings.queue,
        )
        return pause

    def resume(self, kind: str | None = None, *, queue: str | None = None) -> Resumed:
        """Lift a pause and ring, after the commit, the doorbells of the due jobs it held
        (those no other pause still holds), so they run now. ``Resumed.pause`` is ``None``
        when it was not paused (nothing written, nothing rung)."""
        runtime = self._runtime()
        pause, doorbells = runtime.store.pauses.resume(kind=kind, queue=queue)
        runtime.ring(doorbells)
        return Resumed(pause, tuple(doorbell.job_id for doorbell in doorbells))


__all__ = ["LimitService"]
