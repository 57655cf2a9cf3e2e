"""``app.limits``: backpressure per kind, for every worker at once — at most so many
RUNNING (the claim statement enforces it) and at most so many QUEUED (a submit past it is
refused and writes nothing)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from jobs._core.records import KindLimits

if TYPE_CHECKING:  # SQLAlchemy loads on first use
    from jobs._worker.process import ProcessRuntime


class LimitService:
    """Kinds' limits (``app.limits``; ``jobs.set_limits`` and ``jobs.seed_limits`` are the
    default app's). ``runtime``: the application's at the time of each call."""

    def __init__(self, runtime: Callable[[], ProcessRuntime]) -> None:
        self._runtime = runtime

    def put(
        self, kind: str, *, max_running: int | None = None, max_queued: int | None = None
    ) -> KindLimits:
        """Set a kind's limits for every worker at once: at most ``max_running`` RUNNING
        and at most ``max_queued`` QUEUED (a submit past it raises
        :class:`jobs.AdmissionRefused` and writes nothing). ``None`` lifts a limit."""
        submissions = self._runtime().store.submissions
        return submissions.set_limits(kind, max_running=max_running, max_queued=max_queued)

    def seed(self) -> None:
        """Write the registered kinds' ``max_running``/``max_queued`` defaults for kinds
        that have no limits row yet (workers do this at start-up, submitters before a
        kind's first submit; the database's numbers then rule)."""
        self._runtime().seed_limits()

    def all(self) -> dict[str, KindLimits]:
        """Every kind's limits row, by kind."""
        return self._runtime().store.reads.limits()


__all__ = ["LimitService"]
