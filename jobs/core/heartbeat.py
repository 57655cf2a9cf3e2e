"""One heartbeat per process: renews the leases of every job the process runs, in one
statement per beat.

A thread per job (started and joined around each run) costs a thread start and a
statement per job per beat; a worker process runs one job at a time per pool slot, and a
threaded pool runs many. :class:`LeaseHeartbeat` keeps the process's live claims in a
table; every third of a lease it renews all of them with
:meth:`jobs.core.store.JobStore.renew_leases`, and tells each claim missing from the
answer that its lease is lost (the handler then stops at its next step, writing nothing).
A database error skips one beat: the lease still has two thirds left.

The same thread writes a step's record that waited too long for the job's next write
(:meth:`JobContext.step` defers it so that the last step is recorded with the outcome):
handler code that runs long between two steps does not leave the earlier step unrecorded
for more than about twice ``flush_after`` seconds (the thread looks that often).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jobs.core.errors import LeaseLost

if TYPE_CHECKING:
    from jobs.core.records import Claim
    from jobs.core.store import JobStore

log = logging.getLogger("jobs.heartbeat")

OnLost = Callable[[LeaseLost], None]
FLUSH_AFTER_SECONDS = 0.05


@dataclass(frozen=True)
class _Watched:
    claim: Claim
    on_lost: OnLost


class LeaseHeartbeat:
    """The process's lease renewer. ``watch(claim, on_lost)`` when a run starts,
    ``unwatch(claim)`` when it ends; the thread starts on the first watch."""

    def __init__(
        self, store: JobStore, lease_seconds: float, flush_after: float = FLUSH_AFTER_SECONDS
    ) -> None:
        self.store = store
        self.lease_seconds = lease_seconds
        self.flush_after = flush_after
        self._watched: dict[tuple[str, int], _Watched] = {}
        self._flushes: dict[int, tuple[float, Callable[[], None]]] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stopped = False
        self._thread: threading.Thread | None = None

    @property
    def interval(self) -> float:
        return self.lease_seconds / 3

    def watch(self, claim: Claim, on_lost: OnLost) -> None:
        with self._lock:
            self._watched[(claim.job_id, claim.fence)] = _Watched(claim, on_lost)
            self._start()

    def _start(self) -> None:
        if self._thread is None and not self._stopped:
            self._thread = threading.Thread(target=self._run, name="jobs-heartbeat", daemon=True)
            self._thread.start()

    def flush_later(self, key: int, flush: Callable[[], None]) -> None:
        """Call ``flush()`` from this thread in ``flush_after`` seconds unless
        :meth:`cancel_flush` comes first (the job's own next write took the steps)."""
        with self._lock:
            if key not in self._flushes:
                # No notify: the thread looks every ``flush_after`` seconds anyway, and waking
                # it at each step would cost the handler's thread a GIL hand-over per step.
                self._flushes[key] = (time.monotonic() + self.flush_after, flush)
                self._start()

    def cancel_flush(self, key: int) -> None:
        with self._lock:
            self._flushes.pop(key, None)

    def unwatch(self, claim: Claim) -> None:
        with self._lock:
            self._watched.pop((claim.job_id, claim.fence), None)

    def watching(self) -> list[Claim]:
        with self._lock:
            return [entry.claim for entry in self._watched.values()]

    def stop(self) -> None:
        """Stop the thread (at process exit, or before the runtime object is replaced)."""
        with self._lock:
            self._stopped = True
            thread = self._thread
            self._changed.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def beat(self) -> None:
        """Renew every watched lease now; tell the owners of those refused."""
        with self._lock:
            entries = list(self._watched.values())
        by_owner: dict[str, list[_Watched]] = {}
        for entry in entries:
            by_owner.setdefault(entry.claim.owner, []).append(entry)
        for owner, owned in by_owner.items():
            renewed = self.store.renew_leases(
                owner,
                [(entry.claim.job_id, entry.claim.fence) for entry in owned],
                self.lease_seconds,
            )
            for entry in owned:
                if entry.claim.job_id in renewed:
                    continue
                with self._lock:
                    still_watched = self._watched.pop((entry.claim.job_id, entry.claim.fence), None)
                if still_watched is None:
                    continue  # the run ended (and wrote its outcome) while we renewed
                lost = LeaseLost(
                    entry.claim.job_id,
                    owner,
                    entry.claim.fence,
                    "the lease could not be renewed (expired, taken over or cancelled)",
                )
                log.warning("%s", lost)
                entry.on_lost(lost)

    def _run(self) -> None:
        next_beat = time.monotonic() + self.interval
        while True:
            with self._lock:
                while not self._stopped:
                    now = time.monotonic()
                    due = [key for key, (at, _) in self._flushes.items() if at <= now]
                    if due or now >= next_beat:
                        break
                    self._changed.wait(min(next_beat - now, self.flush_after))
                if self._stopped:
                    return
                flushes = [self._flushes.pop(key)[1] for key in due]
            for flush in flushes:
                try:
                    flush()
                except Exception:  # the job's next write will try again, or learn the lease
                    log.exception("writing a waiting step record failed")
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + self.interval
                try:
                    self.beat()
                except Exception:  # a database blip: the leases still have two thirds left
                    log.exception("lease renewal failed; will retry at the next beat")
