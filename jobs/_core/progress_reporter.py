"""A run's progress reporter: keeps the latest ``ctx.progress`` value and writes it, fenced,
at most once per interval, at each step's end and at the run's end.

The handler reports as often as it likes; a value not yet written is written by the
handler's next call once the interval is up, or by the heartbeat's thread should the
handler make no further call (a long call after a burst). Progress is advisory: a
database error only delays the write, but a write the fence refuses stops the run.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from jobs._core.errors import LeaseLost
from jobs._core.progress import PROGRESS_INTERVAL_SECONDS

if TYPE_CHECKING:
    from jobs._core.deferred_writes import DeferredWrites

log = logging.getLogger("jobs.context")


class ProgressReporter:
    """The latest progress of one run and when it was last written.

    Built by the run's context with its :class:`jobs._core.deferred_writes.DeferredWrites`:
    the claim (whose row's progress, from an earlier run, it starts from), the store that
    writes it, the heartbeat (if any) that writes a held value later, and the context's
    lost-lease callback and check."""

    def __init__(self, writes: DeferredWrites) -> None:
        self.writes = writes
        self.latest: dict[str, Any] | None = writes.claim.job.progress
        self._unwritten = False
        self._written_at: float | None = None
        # Held while written, by the handler's thread or the heartbeat's (a run timed out
        # from there writes its outcome there).
        self._lock = threading.Lock()
        self.interval = PROGRESS_INTERVAL_SECONDS
        # The heartbeat's key for writing a held value once its second is up (negative:
        # never the key of the pending steps' flush, which is a positive ``id``).
        self.key = -id(self)

    def report(self, value: dict[str, Any]) -> None:
        """Keep ``value`` (checked already) and write it if the interval is up; else leave
        it to the next chance or to the heartbeat's thread."""
        with self._lock:
            self.latest = value
            self._unwritten = True
            written = self._written_at
            due = written is None or time.monotonic() - written >= self.interval
        if due:
            self.flush()
        else:
            self.writes.flush_later(self.key, self._flush_when_due)

    def _flush_when_due(self) -> None:
        """From the heartbeat's thread: write a held value once :attr:`interval` has passed
        since the last write (until then, ask to be called again)."""
        if self.writes.is_lost():
            return  # the run is over for this owner: its next step (or outcome) says why
        with self._lock:
            if not self._unwritten:
                return
            written = self._written_at
            waiting = written is not None and time.monotonic() - written < self.interval
        if waiting:
            self.writes.flush_later(self.key, self._flush_when_due)
            return
        self.flush()

    def flush(self) -> None:
        """Write the latest progress now if the row does not have it yet. A write the fence
        refuses raises :class:`LeaseLost` (and the handler stops); one a database error
        stops is logged and tried again at the next chance."""
        with self._lock:
            if not self._unwritten or self.latest is None:
                return
            try:
                self.writes.store.progress.record(self.writes.claim, self.latest)
            except LeaseLost as lost:
                self._unwritten = False
                self.writes.lost(lost)
                raise
            except Exception as err:  # an outage: progress is advisory, never the job's end
                log.warning(
                    "job %s: progress not written (%s); will try again",
                    self.writes.claim.job_id,
                    err,
                )
            else:
                self._unwritten = False
            self._written_at = time.monotonic()

    def stop_later_writes(self) -> None:
        """Forget a write the heartbeat was asked to make (the run's outcome writes it)."""
        self.writes.cancel_flush(self.key)


__all__ = ["ProgressReporter"]
