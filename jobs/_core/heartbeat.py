"""One heartbeat per process: renews the leases of every job the process runs, in one
statement per beat.

A thread per job (started and joined around each run) costs a thread start and a
statement per job per beat; a worker process runs one job at a time per pool slot, and a
threaded pool runs many. :class:`LeaseHeartbeat` keeps the process's live claims in a
table; every third of a lease it renews all of them with
:meth:`jobs._store.leases.Leases.renew_leases`, and tells each claim missing from the
answer that its lease is lost (the handler then stops at its next step, writing nothing).
A database error skips one beat: the lease still has two thirds left. When the database
cannot be reached at all (:func:`jobs._core.outage.is_disconnect`), the thread tries again
every :data:`OUTAGE_RETRY_SECONDS` instead of a third of a lease, so the leases are renewed
as soon as the database answers, and the outage is logged once
(:data:`jobs._core.outage.OUTAGES`), not with a traceback per beat.

The same thread writes a step's record that waited too long for the job's next write
(:meth:`JobContext.step` defers it so that the last step is recorded with the outcome):
handler code that runs long between two steps does not leave the earlier step unrecorded
for more than about twice ``flush_after`` seconds (the thread looks that often).

**Cancels.** A renewal refused because an operator cancelled the job (the refused are
explained in one read beside the renewal, none when all were renewed) is handed to the
run's ``on_lost`` as :class:`jobs.JobCancelled`: the context sets ``ctx.cancelled`` and
calls its ``on_cancel`` callbacks from this thread. A run still in its handler
``cancel_grace`` seconds later has its process ended with ``stop_process``, as at a time
limit (a prefork child; elsewhere nothing can end the thread, and the step runs to its
end, its output refused). The cancel itself publishes nothing: within one beat, a third
of the lease, the process learns it from the database.

**Time limits.** A run watched with a ``timeout`` (``@jobs.job(timeout=…)``) and a step
started with one (``ctx.step(…, timeout=…)``) have deadlines here. Past one, the thread
stops renewing that lease, hands the reason to the run's ``on_timeout`` (the runner writes
the fenced retry or failure, attempt counted), and, if the run is still inside its
handler, calls ``stop_process``: in a prefork pool child that ends the process, as
Celery's hard time limit does (a thread cannot interrupt a step stuck in a C call), and
the pool starts a new child. Without ``stop_process`` (in-process runs, thread pools) the
handler stops at its next step, writing nothing. A step holding the GIL in C code (a
runaway regular expression) keeps this thread from running at all; for that a process may
also give a ``backstop``, armed with the seconds to the earliest deadline plus one lease
(a prefork child arms the kernel's interval timer: SIGALRM ends the process with no Python
code running).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jobs._core.errors import JobCancelled, LeaseLost
from jobs._core.outage import OUTAGES, is_disconnect

if TYPE_CHECKING:
    from jobs._core.records import Claim
    from jobs._store import JobStore

log = logging.getLogger("jobs.heartbeat")

OnLost = Callable[[LeaseLost], None]
OnTimeout = Callable[[str], None]
StopProcess = Callable[[str], None]
Backstop = Callable[[float | None], None]
Renewed = Callable[[float], None]
FLUSH_AFTER_SECONDS = 0.05
# How long a cancelled run may take to return on its own (``ctx.cancelled``, ``ctx.on_cancel``)
# before a process that ends stuck runs ends it.
CANCEL_GRACE_SECONDS = 0.5
# How often renewals are tried while the database is unreachable.
OUTAGE_RETRY_SECONDS = 0.25


@dataclass
class _Watched:
    claim: Claim
    on_lost: OnLost
    on_timeout: OnTimeout | None = None
    # Told the monotonic instant a successful renewal was sent (the run's LeaseHold).
    renewed: Renewed | None = None
    # (monotonic deadline, why) of the run as a whole and of the step running now.
    run_deadline: tuple[float, str] | None = None
    step_deadline: tuple[float, str] | None = None

    def running_step(self, deadline: float | None, why: str = "") -> None:
        """A step with ``deadline`` (monotonic) runs now; ``None``: no step runs."""
        self.step_deadline = None if deadline is None else (deadline, why)

    def overdue(self, now: float) -> str | None:
        """Why this run is past a deadline at ``now`` (the earlier one), or None."""
        passed = [limit for limit in (self.run_deadline, self.step_deadline) if limit]
        passed = [limit for limit in passed if limit[0] <= now]
        return min(passed)[1] if passed else None


class LeaseHeartbeat:
    """The process's lease renewer. ``watch(claim, on_lost)`` when a run starts,
    ``unwatch(claim)`` when it ends; the thread starts on the first watch."""

    def __init__(
        self,
        store: JobStore,
        lease_seconds: float,
        flush_after: float = FLUSH_AFTER_SECONDS,
        *,
        stop_process: StopProcess | None = None,
        backstop: Backstop | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        cancel_grace: float = CANCEL_GRACE_SECONDS,
    ) -> None:
        self.store = store
        self.lease_seconds = lease_seconds
        self.flush_after = flush_after
        # Called with the reason when a run passed its time limit and is still in its
        # handler after its outcome was written (a prefork child exits; see the module).
        self.stop_process = stop_process
        # Armed with seconds to the earliest deadline plus a lease (None: disarm), for the
        # process to end itself even when this thread cannot run (see the module).
        self.backstop = backstop
        self._backstop_armed = False
        # Deadlines are read on this clock (tests pass a logical one).
        self.monotonic = monotonic
        self._watched: dict[tuple[str, int], _Watched] = {}
        # Runs past a time limit whose handler has not returned yet.
        self._timed_out: set[tuple[str, int]] = set()
        # Cancelled runs whose handler has not returned yet: the instant (monotonic) their
        # process is ended if they are still there (see beat).
        self._cancelled: dict[tuple[str, int], float] = {}
        self.cancel_grace = cancel_grace
        self._flushes: dict[int, tuple[float, Callable[[], None]]] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stopped = False
        self._thread: threading.Thread | None = None

    def end_stuck_runs_with(
        self, stop_process: StopProcess | None, backstop: Backstop | None
    ) -> None:
        """From now on, end the process with ``stop_process`` when a run passed its time
        limit and is still in its handler, and arm ``backstop`` for the earliest deadline
        (``None``: end nothing, arm nothing); what the constructor's arguments of the same
        names set, for a process that learns how late (a prefork pool child, once forked)."""
        with self._lock:
            self.stop_process = stop_process
            self.backstop = backstop

    @property
    def interval(self) -> float:
        """Seconds between renewals: a third of the lease, so two may fail before it ends."""
        return self.lease_seconds / 3

    def watch(
        self,
        claim: Claim,
        on_lost: OnLost,
        *,
        timeout: float | None = None,
        on_timeout: OnTimeout | None = None,
        renewed: Renewed | None = None,
    ) -> None:
        """Renew ``claim``'s lease until :meth:`unwatch`; past ``timeout`` seconds (the
        run's time limit) stop renewing it and call ``on_timeout`` with the reason.
        ``renewed`` is told when each successful renewal was sent (monotonic seconds)."""
        run_deadline = None
        if timeout is not None:
            run_deadline = (
                self.monotonic() + timeout,
                f"the job passed its timeout of {timeout:g} s",
            )
        entry = _Watched(claim, on_lost, on_timeout, renewed, run_deadline)
        with self._lock:
            self._watched[(claim.job_id, claim.fence)] = entry
            self._start()
            if timeout is not None:
                self._arm_backstop()

    def step_started(self, claim: Claim, name: str, timeout: float) -> None:
        """Step ``name`` of a watched run starts now and may take ``timeout`` seconds."""
        with self._lock:
            entry = self._watched.get((claim.job_id, claim.fence))
            if entry is not None:
                entry.running_step(
                    self.monotonic() + timeout, f"step {name!r} passed its timeout of {timeout:g} s"
                )
                self._arm_backstop()

    def step_ended(self, claim: Claim) -> None:
        """The step started by :meth:`step_started` returned (or raised)."""
        with self._lock:
            entry = self._watched.get((claim.job_id, claim.fence))
            if entry is not None:
                entry.running_step(None)
                self._arm_backstop()

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
        """Forget a pending-step flush asked for by :meth:`flush_later` (the handler's own
        thread wrote the step first)."""
        with self._lock:
            self._flushes.pop(key, None)

    def unwatch(self, claim: Claim) -> None:
        """Stop renewing ``claim`` (its run ended: outcome written, handed back or lost)."""
        with self._lock:
            self._watched.pop((claim.job_id, claim.fence), None)
            self._timed_out.discard((claim.job_id, claim.fence))
            self._cancelled.pop((claim.job_id, claim.fence), None)
            self._arm_backstop()

    def _arm_backstop(self) -> None:
        """(Under the lock.) Arm the backstop for the earliest deadline plus one lease, or
        disarm it when no deadline is left; no call at all for runs without time limits."""
        if self.backstop is None:
            return
        deadline = self._next_deadline()
        if deadline is None:
            if self._backstop_armed:
                self.backstop(None)
                self._backstop_armed = False
            return
        self.backstop(max(0.0, deadline - self.monotonic()) + self.lease_seconds)
        self._backstop_armed = True

    def watching(self) -> list[Claim]:
        """The claims renewed now (what this process is running)."""
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
        """Renew every watched lease now; tell the owners of those refused. The refused
        are explained in one read beside the renewal (none when all were renewed): a run
        whose job was cancelled hears :class:`JobCancelled`, and a process that ends stuck
        runs (``stop_process``) ends this one if it is still in its handler
        ``cancel_grace`` seconds later."""
        with self._lock:
            entries = list(self._watched.values())
        by_owner: dict[str, list[_Watched]] = {}
        for entry in entries:
            by_owner.setdefault(entry.claim.owner, []).append(entry)
        for owner, owned in by_owner.items():
            sent = time.monotonic()
            renewed = self.store.leases.renew_leases(
                owner,
                [(entry.claim.job_id, entry.claim.fence) for entry in owned],
                self.lease_seconds,
            )
            refused = []
            for entry in owned:
                if entry.claim.job_id in renewed:
                    if entry.renewed is not None:
                        entry.renewed(sent)
                    continue
                with self._lock:
                    still_watched = self._watched.pop((entry.claim.job_id, entry.claim.fence), None)
                if still_watched is not None:  # else the run ended (and wrote) while we renewed
                    refused.append(entry)
            if refused:
                self._tell_refused(owner, refused)

    def _tell_refused(self, owner: str, refused: list[_Watched]) -> None:
        """Tell each refused run why, read from the database in one go."""
        try:  # the database's answer: cancelled, or who holds the job now, under which fence
            why = self.store.leases.why_lost_many([entry.claim for entry in refused])
        except Exception:
            why = {}
        for entry in refused:
            claim = entry.claim
            lost = why.get(claim.job_id) or LeaseLost(
                claim.job_id,
                owner,
                claim.fence,
                "the lease could not be renewed (expired, taken over or cancelled)",
            )
            key = (claim.job_id, claim.fence)
            if isinstance(lost, JobCancelled):
                log.warning("job %s (fence %d) was cancelled; stopping the run", *key)
                with self._lock:
                    self._cancelled[key] = self.monotonic() + self.cancel_grace
            else:
                log.warning("renewal refused by the database: %s", lost)
            try:
                entry.on_lost(lost)
            except Exception:  # the run is told again by its next fenced write
                log.exception("job %s: telling the run its lease was lost failed", key[0])

    def end_cancelled_runs(self) -> list[str]:
        """End the process (``stop_process``) for each cancelled run still in its handler
        ``cancel_grace`` seconds after the cancel was noticed; returns their job IDs. Runs
        that returned meanwhile were unwatched, and are not in the list."""
        now = self.monotonic()
        with self._lock:
            due = [key for key, at in self._cancelled.items() if at <= now]
            for key in due:
                del self._cancelled[key]
            stop = self.stop_process
        if stop is not None:
            for job_id, _fence in due:
                stop(f"job {job_id}: the job was cancelled")
        return [job_id for job_id, _fence in due]

    def check_deadlines(self) -> list[str]:
        """Time out every watched run past a deadline now: its lease is no longer renewed,
        its ``on_timeout`` writes the outcome, and a run still in its handler afterwards
        has its process stopped (``stop_process``). Returns the timed-out job IDs."""
        now = self.monotonic()
        with self._lock:
            overdue = []
            for key, entry in list(self._watched.items()):
                why = entry.overdue(now)
                if why is not None:
                    del self._watched[key]  # no more renewals
                    self._timed_out.add(key)
                    overdue.append((key, entry, why))
        for key, entry, why in overdue:
            log.warning("job %s (fence %d): %s; stopping the run", key[0], key[1], why)
            if entry.on_timeout is not None:
                try:
                    entry.on_timeout(why)
                except LeaseLost as lost:  # someone else moved the job first: nothing to write
                    log.warning("job %s: time-out not written: %s", key[0], lost)
                except Exception:  # the lease, no longer renewed, runs out: the sweeper acts
                    log.exception("job %s: writing the time-out outcome failed", key[0])
            with self._lock:
                still_running = key in self._timed_out
                self._timed_out.discard(key)
            if still_running and self.stop_process is not None:
                self.stop_process(f"job {key[0]}: {why}")
        return [key[0] for key, _entry, _why in overdue]

    def _next_deadline(self) -> float | None:
        limits = [
            limit[0]
            for entry in self._watched.values()
            for limit in (entry.run_deadline, entry.step_deadline)
            if limit is not None
        ]
        return min(limits) if limits else None

    def _run(self) -> None:
        next_beat = time.monotonic() + self.interval
        while True:
            with self._lock:
                while not self._stopped:
                    now = time.monotonic()
                    due = [key for key, (at, _) in self._flushes.items() if at <= now]
                    deadline = self._next_deadline()
                    if self._cancelled:
                        ending = min(self._cancelled.values())
                        deadline = ending if deadline is None else min(deadline, ending)
                    if (
                        due
                        or now >= next_beat
                        or (deadline is not None and self.monotonic() >= deadline)
                    ):
                        break
                    self._changed.wait(min(next_beat - now, self.flush_after))
                if self._stopped:
                    return
                flushes = [self._flushes.pop(key)[1] for key in due]
            for flush in flushes:
                try:
                    flush()
                except LeaseLost as lost:  # the handler was told (JobContext.flush)
                    log.warning("step record refused by the database: %s", lost)
                except Exception as err:  # the job's next write tries again, or learns the lease
                    if is_disconnect(err):
                        OUTAGES.unreachable(err)
                    else:
                        log.exception("writing a waiting step record failed")
            self.check_deadlines()
            self.end_cancelled_runs()
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + self._beat_logged()

    def _beat_logged(self) -> float:
        """One beat from the thread; returns the seconds to the next. A database blip costs
        a beat (the leases still have two thirds left); an outage is logged once, and
        renewals are tried often until the database answers."""
        try:
            self.beat()
        except Exception as err:
            if is_disconnect(err):
                OUTAGES.unreachable(err)
                return min(self.interval, OUTAGE_RETRY_SECONDS)
            log.exception("lease renewal failed; will retry at the next beat")
        else:
            if OUTAGES.down:
                OUTAGES.reachable()
        return self.interval
