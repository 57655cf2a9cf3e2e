"""Steps that ran and wait to be recorded with the job's next write.

A step's output is not written the moment it returns: it is recorded with the run's next
write (the next step's start, a wait, or the run's outcome), one write fewer per step. The
heartbeat's thread records it should the handler run on for long without one. A step never
begins while an earlier one is unrecorded, and a write the fence refuses stops the run.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from jobs._core.errors import LeaseLost

if TYPE_CHECKING:
    from jobs._core.deferred_writes import DeferredWrites
    from jobs._core.outage import LeaseHold
    from jobs._store import PendingStep


class PendingSteps:
    """The steps of one run that ran but are not recorded yet.

    Built by the run's context with its :class:`jobs._core.deferred_writes.DeferredWrites`:
    the store that records them, the claim that fences the write, the hold through an
    outage, the heartbeat (if any) and the context's lost-lease callback."""

    def __init__(self, writes: DeferredWrites) -> None:
        self.writes = writes
        self._steps: list[PendingStep] = []
        # Held while pending steps are written, by the handler's thread or the heartbeat's.
        self._lock = threading.Lock()
        # The heartbeat's key for this run's flush (positive; the progress reporter's is
        # negative).
        self.key = id(self)

    def add(self, step: PendingStep, *, record_soon: bool) -> None:
        """Keep ``step`` for the job's next write; ``record_soon`` (a step's end) has the
        heartbeat record it should the handler run on without a write, or records it now
        when there is no heartbeat to bound the wait."""
        with self._lock:
            self._steps.append(step)
        if record_soon and not self.writes.flush_later(self.key, self.flush):
            self.flush(held=True)

    def take(self) -> list[PendingStep]:
        """The pending steps, handed to the write that records them (a wait, a spawn, the
        run's outcome); forgotten here. Waits for a write of them in flight."""
        self.writes.cancel_flush(self.key)
        with self._lock:
            steps, self._steps = self._steps, []
        return steps

    def record_now(self) -> None:
        """Record the pending steps now, in the handler's thread (the next step's start)."""
        self.writes.cancel_flush(self.key)
        self.flush(held=True)

    def flush(self, *, held: bool = False) -> None:
        """Record the pending steps. ``held`` (the handler's own thread): through a
        database outage, keep them and try again while the lease can be live
        (:class:`jobs._core.outage.LeaseHold`); the heartbeat's thread writes once."""
        with self._lock:
            if not self._steps:
                return
            steps = self._steps
            try:
                if held and self.writes.hold is not None:
                    self._record_held(self.writes.hold, steps)
                else:
                    self.writes.store.ownership.record_steps(self.writes.claim, steps)
            except LeaseLost as lost:  # refused by the fence: the handler stops too
                self.writes.lost(lost)
                raise
            self._steps = []

    def _record_held(self, hold: LeaseHold, steps: list[PendingStep]) -> None:
        """Record ``steps`` through an outage (:meth:`jobs._core.outage.LeaseHold.write`):
        an attempt whose acknowledgement was lost had landed when this claim's owner has
        every one of them recorded."""
        store, claim, names = self.writes.store, self.writes.claim, [step.name for step in steps]

        def record() -> bool:
            store.ownership.record_steps(claim, steps)
            return True

        def landed() -> bool | None:
            recorded = store.reads.steps_recorded_by(claim.job_id, claim.owner, claim.fence, names)
            return True if recorded else None

        hold.write(record, renew_after=True, landed=landed)


__all__ = ["PendingSteps"]
