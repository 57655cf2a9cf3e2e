"""What a run's deferred writes share: its pending steps (:mod:`jobs._core.pending_steps`)
and its progress (:mod:`jobs._core.progress_reporter`) are both written later, fenced by
the run's claim, by the handler's thread or the heartbeat's, and both stop the run when
the fence refuses a write.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobs._core.errors import LeaseLost
    from jobs._core.heartbeat import LeaseHeartbeat
    from jobs._core.outage import LeaseHold
    from jobs._store import Claim, JobStore


@dataclasses.dataclass(frozen=True)
class DeferredWrites:
    """One run's link to the writes it defers, built once by the run's context: the store
    that writes them, the claim that fences them, ``hold`` (keeps the handler's thread
    trying through a database outage while the lease can be live; ``None`` writes once),
    the heartbeat (if any) that makes a write later, ``lost`` (the context's, called when
    the fence refuses a write) and ``is_lost`` (whether the run's lease is lost already)."""

    store: JobStore
    claim: Claim
    hold: LeaseHold | None
    heartbeat: LeaseHeartbeat | None
    lost: Callable[[LeaseLost], None]
    is_lost: Callable[[], bool]

    def flush_later(self, key: int, flush: Callable[[], None]) -> bool:
        """Have the heartbeat's thread call ``flush`` (under ``key``) should the handler
        make no write first; False when there is no heartbeat to do it."""
        if self.heartbeat is None:
            return False
        self.heartbeat.flush_later(key, flush)
        return True

    def cancel_flush(self, key: int) -> None:
        """Forget the flush asked for under ``key`` (the handler writes it itself)."""
        if self.heartbeat is not None:
            self.heartbeat.cancel_flush(key)


__all__ = ["DeferredWrites"]
