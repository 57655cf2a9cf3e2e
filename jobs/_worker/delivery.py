"""What one delivery of a doorbell does in a worker: claim the job, run it, and say what
happened in one log line. Imported by the task on its first delivery, so a worker's main
process (which only consumes and hands messages to the pool) never loads SQLAlchemy."""

from __future__ import annotations

import contextlib
import logging
import random
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator

from jobs._core.outage import OUTAGES, is_disconnect
from jobs._core.records import Batch
from jobs._store import JobStore
from jobs._store.deferred import hold_completions
from jobs._store.flights import share_flights
from jobs._worker.process import ProcessRuntime
from jobs._worker.run_results import Outcome, RunResult
from jobs._worker.runner import Runner
from jobs._worker.unclaimed import RATE_WAITS, Unclaimed, wait_for_rate, why_not_claimed

log = logging.getLogger("jobs.worker")

# A delivery that cannot reach the database waits this long before its doorbell goes back
# to the queue, so that a worker does not spin through the queue during an outage.
REQUEUE_PAUSE_SECONDS = 1.0


class DatabaseUnreachable(Exception):
    """A delivery could not reach the database (:func:`jobs._core.outage.is_disconnect`):
    nothing was claimed or written, and the doorbell must go back to the queue, not be
    acknowledged as done. Raised after :data:`REQUEUE_PAUSE_SECONDS`; the Celery task turns
    it into a requeue. The outage itself is logged once per process, not per delivery."""


# The stores of this process's deliveries: a completion held is sent before the process
# exits, and how completions went is logged.
_stores: weakref.WeakSet[JobStore] = weakref.WeakSet()


def deliver(
    runtime: ProcessRuntime,
    job_id: str,
    hostname: str | None,
    stopping: Callable[[], bool],
    *,
    kind: str | None = None,
) -> tuple[RunResult, str]:
    """Run the job a doorbell names, if it is this worker's to run; returns the run's
    result and a one-line summary. Raises :class:`DatabaseUnreachable` (after a pause) when
    the database cannot be reached; a write held through an outage by the run itself
    (:class:`jobs._core.outage.LeaseHold`) does not end up here. ``kind``: the kind the
    doorbell names, a hint for the claim (a kind with a concurrency key claims per key
    first). In a process that runs one job at a time, a plain job's completion is held and
    carried by the next claim's flight (:mod:`jobs._store.deferred`), or sent alone on a
    short deadline; where jobs share the process, the claim, the step records and the
    completion each commit before they return, in flights shared with the writes of the
    jobs beside them (:mod:`jobs._store.flights`)."""
    with _requeued_when_unreachable(job_id):
        settings = runtime.settings
        if runs_one_job_at_a_time():
            # Through an outage a held completion is tried again for half a lease: the lease
            # was renewed at most a third of a lease before the run ended, and the fence decides.
            hold_completions(
                runtime.store.statements,
                settings.hold_completion_seconds,
                settings.lease_seconds / 2,
            )
        else:
            share_flights(runtime.store.statements)
        _stores.add(runtime.store)
        runner = make_runner(runtime, hostname, stopping)
        result = runner.run(job_id, kind=kind)
        # What a claim that took nothing reads of the job, once, when first asked (after
        # the claim): the rate's wait and the log line's reason share it.
        seen = Unclaimed(runner.store.reads, job_id)
        waits = 0
        while result.outcome is Outcome.NOT_CLAIMED and wait_for_rate(runner, seen, stopping):
            seen = Unclaimed(runner.store.reads, job_id)  # the wait moved on: read anew
            if waits == RATE_WAITS:  # other deliveries took the starts: held for the rate
                runner.store.doorbells.mark_unrung([job_id])
                break
            waits += 1
            result = runner.run(job_id, kind=kind)
        if result.outcome is Outcome.NOT_CLAIMED:
            why, held, other_version = why_not_claimed(runner, seen)
            if other_version:  # rung again at a random point before the usual delay
                runner.store.doorbells.ring_again_sooner(
                    job_id, settings.ring_again_after_seconds * random.uniform(0.0, 0.5)
                )
            if held is not None and not runner.store.doorbells.hold_for_key(job_id):
                # The key's slot freed meanwhile: its finisher may not have seen this job.
                runtime.ring_batch(Batch.of(held))
            log.info("job %s: delivery dropped, %s", job_id, why)
            return result, f"{job_id}: dropped ({why})"
        ran = result.job_id  # a fair kind's claim may take another job than the doorbell's
        if result.outcome is Outcome.HANDED_BACK:
            job = result.job
            runtime.ring_batch(Batch((ran,)) if job is None else Batch.of(job))
        _pass_on_slot(runtime, runner, result)
        swapped = "" if ran == job_id else f"for the doorbell of {job_id}"
        log.info(
            "job %s: %s (ran %s, replayed %s%s)",
            ran,
            result.outcome.value,
            list(result.ran_steps),
            list(result.replayed_steps),
            f", {swapped}" if swapped else "",
        )
        return result, f"{ran}: {result.outcome.value}" + (f" ({swapped})" if swapped else "")


@contextlib.contextmanager
def _requeued_when_unreachable(job_id: str) -> Iterator[None]:
    """Around one delivery: an error that says the database cannot be reached
    (:func:`jobs._core.outage.is_disconnect`) is logged once per outage and raised as
    :class:`DatabaseUnreachable` after :data:`REQUEUE_PAUSE_SECONDS`; a delivery that
    reached it ends the outage in the log."""
    try:
        yield
    except Exception as err:
        if not is_disconnect(err):
            raise
        OUTAGES.unreachable(err)
        time.sleep(REQUEUE_PAUSE_SECONDS)
        raise DatabaseUnreachable(f"{job_id}: database unreachable; doorbell requeued") from None
    if OUTAGES.down:
        OUTAGES.reachable()


def runs_one_job_at_a_time() -> bool:
    """Whether this process runs one job at a time, so that a completion may wait in its one
    slot for the next claim: the delivery runs on the process's main thread (a prefork pool
    child, the solo pool) and no green-thread library has patched ``threading``. A threads
    pool runs its deliveries on threads of its own, gevent and eventlet on greenlets: there
    several jobs share the process, and their completions share flights instead."""
    gevent_monkey = sys.modules.get("gevent.monkey")
    if gevent_monkey is not None and gevent_monkey.is_module_patched("threading"):
        return False
    eventlet_patcher = sys.modules.get("eventlet.patcher")
    if eventlet_patcher is not None and eventlet_patcher.is_monkey_patched("thread"):
        return False
    return threading.current_thread() is threading.main_thread()


def send_held_completions() -> None:
    """A process stopping (a prefork pool child at a warm shutdown or at its max tasks per
    child; a solo worker's main process at the end of its shutdown) sends the completion
    it holds rather than leave its job to be recovered and its last step run again. Called
    from the worker's signals, which installing durable jobs on an app connects
    (:func:`jobs._worker.celery_setup.connect_worker_signals`)."""
    for store in list(_stores):
        held, flights = store.statements.held, store.statements.flights
        if flights is not None:
            log.info(
                "writes: %d committed in %d shared flights (at most %d in one)",
                flights.sent,
                flights.flights,
                flights.largest,
            )
        if held is not None:
            log.info(
                "completions: %d held and carried by the next claim, %d held and sent alone, "
                "%d written at once (idle)",
                held.carried,
                held.alone,
                held.at_once,
            )
        try:
            store.flush_held()
        except Exception as err:  # the process is ending; the job recovers from the database
            log.warning("held completion not sent at exit: %s", type(err).__name__)


def make_runner(
    runtime: ProcessRuntime, hostname: str | None, stopping: Callable[[], bool]
) -> Runner:
    """A runner for this process: its store, owner name, liveness key, heartbeat, and the
    process's ring for the doorbells its runs' writes owe (a parent queued by its last
    child's end, a spawn's children), rung after each of those writes committed."""
    settings = runtime.settings
    return Runner.from_settings(
        runtime.store,
        runtime.owner_name(hostname),
        settings,
        registry=runtime.registry,
        liveness_key=runtime.liveness_key(),
        heartbeat=runtime.heartbeat,
        budget_seconds=settings.delivery_budget_seconds,
        stopping=stopping,
        ring=runtime.ring,
        event_loops=runtime.event_loops,
    )


def _pass_on_slot(runtime: ProcessRuntime, runner: Runner, result: RunResult) -> None:
    """A run of a kind with a running limit ended: ring for the next waiting job of that kind
    now, rather than leaving it to the sweeper's ring-again; a run that held a slot of its
    concurrency key rings the next waiting job of that key. (The claim saw the limits, so
    unlimited kinds cost no extra query here.)"""
    job = result.job
    if job is None:
        return
    depth = runner.store.depth
    keyed = result.max_running_per_key is not None and job.concurrency_key is not None
    # A completion read the key's next held job in its own flight and rang it already.
    if keyed and result.outcome is not Outcome.COMPLETED:
        runtime.ring(depth.next_due_doorbells(job.kind, 1, concurrency_key=job.concurrency_key))
    if result.max_running is not None:
        runtime.ring(depth.next_due_doorbells(job.kind, 1))
