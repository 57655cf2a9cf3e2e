"""Run one job: claim it, replay its recorded steps, run the handler, record the outcome.

Used unchanged by the Celery task, by ``jobs.testing`` and by the in-process drain, so
the rules are the same whichever way a job reaches a worker. The process's heartbeat
(:class:`jobs._core.heartbeat.LeaseHeartbeat`) renews the lease while the handler runs;
when a renewal is refused the handler is stopped at its next step and nothing more is
written.

A job's writes, for a one-step job: the claim (which also says whether recorded steps
exist, so a first run reads none), and the outcome, which records the last step's
output in the same statement. A step's record is written with the job's next write: the
start of the next step, or the outcome.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import traceback
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from jobs._config.settings import Settings
from jobs._core import tracing
from jobs._core.async_context import AsyncJobContext, is_async_handler
from jobs._core.context import JobContext
from jobs._core.errors import InvalidInput, LeaseLost, NonDeterministic, UnknownKind
from jobs._core.heartbeat import LeaseHeartbeat
from jobs._core.interrupts import (
    Diverged,
    HandBack,
    Sleeping,
    TimedOut,
    Unstorable,
    WaitingForApproval,
    WaitingForChildren,
    WaitingForEvent,
)
from jobs._core.kind_versions import RunVersions
from jobs._core.outage import LeaseHold
from jobs._core.records import Moved, Ring
from jobs._core.registry import REGISTRY, Registry
from jobs._core.states import State
from jobs._core.validate import check_loaded, clip
from jobs._store import Claim, ClaimTerms, Job, JobStore, PendingStep
from jobs._worker.event_loops import EventLoops
from jobs._worker.run_results import Outcome, RunResult, trace_outcome

log = logging.getLogger("jobs.runner")

#: The loops of a runner given none (``jobs.testing``): one per thread of this process.
EVENT_LOOPS = EventLoops()


def backoff_seconds(attempt: int, base: float, cap: float) -> float:
    """Exponential backoff: base, 2·base, 4·base … capped."""
    return float(min(cap, base * (2 ** max(0, attempt - 1))))


class Runner:
    """Runs claimed jobs in this process: claim, replay the recorded steps, run the handler,
    write the outcome (fenced), hand back on shutdown. The Celery task and
    ``jobs.testing`` both drive one; ``owner`` names this process in every claim."""

    def __init__(
        self,
        store: JobStore,
        owner: str,
        *,
        lease_seconds: float = 30.0,
        registry: Registry = REGISTRY,
        heartbeat: LeaseHeartbeat | None = None,
        liveness_key: int | None = None,
        budget_seconds: float | None = None,
        retry_backoff_seconds: float = 1.0,
        retry_backoff_max_seconds: float = 300.0,
        stopping: Callable[[], bool] | None = None,
        default_max_attempts: int = 5,
        ring: Ring | None = None,
        event_loops: EventLoops | None = None,
        run_versions: RunVersions = (),
        drain: bool = False,
    ) -> None:
        self.store = store
        # Where ``async def`` handlers run: this thread's loop of the process's runtime.
        self.event_loops = EVENT_LOOPS if event_loops is None else event_loops
        # Rings the doorbells a run's writes owe after they committed: a parent queued by
        # its last child's end, a spawn's new children. None rings nothing: the writes then
        # leave such a parent unrung, for the sweeper.
        self.ring = ring
        # A child spawned without max_attempts, of a kind without one, gets this.
        self.default_max_attempts = default_max_attempts
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.registry = registry
        # None runs without renewals (deterministic tests): the lease must outlast the run.
        self.heartbeat = heartbeat
        self.liveness_key = liveness_key
        self.budget_seconds = budget_seconds
        self.retry_backoff_seconds = retry_backoff_seconds
        self.retry_backoff_max_seconds = retry_backoff_max_seconds
        # Asked before each step not yet recorded: True hands the job back to the queue
        # (a worker's warm shutdown), so the job moves on elsewhere instead of waiting.
        self.stopping = stopping
        # JOBS_RUN_VERSIONS and JOBS_DRAIN: which recorded versions of its kinds it claims.
        self.run_versions = run_versions
        self.drain = drain

    @classmethod
    def from_settings(
        cls, store: JobStore, owner: str, settings: Settings, **options: Any
    ) -> Runner:
        """A runner with the lease and retry backoff of ``settings``; ``options`` add the
        rest (liveness key, delivery budget, heartbeat, stop flag)."""
        return cls(
            store,
            owner,
            lease_seconds=settings.lease_seconds,
            retry_backoff_seconds=settings.retry_backoff_seconds,
            retry_backoff_max_seconds=settings.retry_backoff_max_seconds,
            default_max_attempts=settings.default_max_attempts,
            run_versions=settings.run_versions,
            drain=settings.drain,
            **options,
        )

    def run(self, job_id: str, *, kind: str | None = None) -> RunResult:
        """Claim ``job_id`` and run its handler to an outcome; ``NOT_CLAIMED`` when the job
        is not due, not QUEUED, held under a live lease, or of a kind this process does not
        know (the doorbell is then dropped; a job of an unknown kind stays QUEUED for a
        process that knows it). ``kind``: the kind the doorbell names, if known: one that
        declares a concurrency key is claimed per key first (one round trip fewer); one
        that is ``fair`` claims the next job of its least recently served key instead of
        ``job_id`` (:mod:`jobs._store.fair_claims`)."""
        sent = time.monotonic()  # the lease runs from no earlier than this, on any clock

        terms = ClaimTerms(
            self.owner,
            self.lease_seconds,
            liveness_key=self.liveness_key,
            kinds=self.registry.names(),
            keyed_first=kind is not None and self.registry.declares_key(kind),
            versions=self.registry.versions(self.run_versions, self.drain),
        )
        claim: Claim | None
        if kind is not None and self.registry.is_fair(kind):  # claims the fair pick
            claim = self.store.fairness.claim(job_id, kind, terms, self.ring)
        else:
            claim = self.store.ownership.claim_on(job_id, terms)
        if claim is None:
            return RunResult(job_id, Outcome.NOT_CLAIMED)
        if claim.rate_buckets and self.ring is not None:
            # The next job its rate holds waits for the next start (jobs._store.rate_limits).
            self.ring(self.store.doorbells.next_for_rate(claim))
        if tracing.ENABLED:
            result = self._run_traced(claim, sent)
        else:
            result = self._run_guarded(claim, sent)
        if claim.max_running is None and claim.max_running_per_key is None:
            return result
        return dataclasses.replace(
            result,
            max_running=claim.max_running,
            max_running_per_key=claim.max_running_per_key,
        )

    def _run_guarded(self, claim: Claim, sent: float) -> RunResult:
        try:
            return self._run_claimed(claim, sent)
        except LeaseLost as lost:
            log.warning("%s; stopped without writing", lost)
            return RunResult(claim.job_id, Outcome.LEASE_LOST, error=str(lost))

    def _run_traced(self, claim: Claim, sent: float) -> RunResult:
        """:meth:`_run_guarded` inside the run's span, in the trace its submit recorded
        (:mod:`jobs._core.tracing`): the steps' spans are its children; its outcome, and
        the wait or retry it ended in, are set on it."""
        job = claim.job
        with tracing.run_span(
            job.trace_context,
            job_id=job.id,
            kind=job.kind,
            attempt=job.attempts,
            owner=claim.owner,
            fence=claim.fence,
        ) as span:
            result = self._run_guarded(claim, sent)
            trace_outcome(span, result)
        return result

    def _run_claimed(self, claim: Claim, sent: float) -> RunResult:
        job = claim.job
        hold = LeaseHold(
            claim,
            self.lease_seconds,
            sent,
            renew=lambda: self.store.leases.renew(claim, self.lease_seconds),
        )
        try:
            kind = self.registry.get(job.kind)
            check_loaded(job.inputs, "inputs")
            kind.check_inputs(job.inputs)
            steps = self.store.reads.steps(job.id) if claim.has_steps else []
            recorded = {step.name: step.output for step in steps}
            positions = {step.name: step.position for step in steps}
            check_loaded(recorded, "a recorded step output")
        except (UnknownKind, InvalidInput) as err:
            # Not transient: no retry would help. Fail with the reason instead of looping.
            failed = self._rung(self.store.ownership.fail(claim, str(err), rings=self.rings))
            return RunResult(job.id, Outcome.FAILED, failed, error=str(err))
        started = time.monotonic()
        deadline = None if self.budget_seconds is None else started + self.budget_seconds
        run_deadline = None
        if kind.timeout is not None:
            run_deadline = (
                started + kind.timeout,
                f"the job passed its timeout of {kind.timeout:g} s",
            )
        ctx = JobContext(
            self.store,
            claim,
            recorded,
            deadline=deadline,
            stopping=self.stopping,
            heartbeat=self.heartbeat,
            run_deadline=run_deadline,
            hold=hold,
            registry=self.registry,  # children take their kinds' defaults
            default_max_attempts=self.default_max_attempts,
            ring=self.ring,
            positions=positions,
        )
        # An ``async def`` handler gets the awaitable context; a lost lease also cancels
        # its running step (or the handler where it awaits).
        awaited = AsyncJobContext(ctx) if is_async_handler(kind.handler) else None
        lost = ctx.lease_lost if awaited is None else awaited.lease_lost
        if self.heartbeat is not None:

            def timed_out(why: str) -> None:
                """From the heartbeat's thread: the attempt ends now, retried or FAILED,
                and then the handler is stopped at its next step (writing nothing). The
                outcome is written first, so a run that returns once stopped finds it
                written; a write the handler makes meanwhile is refused by its fence."""
                try:
                    self._retry_or_fail(claim, why, ctx)
                finally:
                    lost(LeaseLost(job.id, claim.owner, claim.fence, why))

            self.heartbeat.watch(
                claim,
                lost,
                timeout=kind.timeout,
                on_timeout=timed_out,
                renewed=hold.renewed,
            )
        try:
            return self._run_handler(claim, kind.handler, ctx, awaited)
        finally:
            if self.heartbeat is not None:
                self.heartbeat.unwatch(claim)

    def _run_handler(
        self,
        claim: Claim,
        handler: Callable[..., Any],
        ctx: JobContext,
        awaited: AsyncJobContext | None = None,
    ) -> RunResult:
        job = claim.job
        try:
            with self.registry.job_scope():
                if awaited is None:
                    result = handler(ctx, **job.inputs)
                else:  # on this thread's loop, reused by the thread's next async job
                    result = self.event_loops.run(awaited.run(handler, job.inputs))
        except WaitingForApproval as wait:
            approval = partial(self.store.ownership.wait_for_approval, claim, wait.reason)
            waits = partial(approval, wait.step_name, timeout=wait.timeout, position=wait.position)
            return self._held_as(Outcome.WAITING_APPROVAL, ctx, waits)
        except WaitingForChildren as children:
            parked = self.store.workflows.wait_for_children(
                claim, children.child_ids, children.step_name, steps=ctx.take_pending()
            )
            return self._result(parked, self._parked_or_back(parked), ctx)
        except WaitingForEvent as event:
            parked = self.store.workflows.wait_for_event(
                claim,
                event.name,
                event.step_name,
                event.timeout,
                steps=ctx.take_pending(),
                position=event.position,
            )
            return self._result(parked, self._parked_or_back(parked), ctx)
        except Sleeping as sleep:
            timer = partial(self.store.ownership.sleep, claim, sleep.name, sleep.wake_at)
            return self._held_as(Outcome.SLEEPING, ctx, partial(timer, position=sleep.position))
        except HandBack as hand_back:
            release = partial(self.store.ownership.release, claim, str(hand_back))
            return self._held_as(Outcome.HANDED_BACK, ctx, release)
        except Diverged as diverged:
            return self._diverged(claim, ctx, diverged.error)
        except Unstorable as unstorable:
            return self._failed(ctx, str(unstorable))
        except TimedOut as timed_out:
            ctx.check_lease()  # the heartbeat timed the run out first and wrote the outcome
            log.warning("job %s attempt %d: %s", job.id, job.attempts, timed_out)
            moved, outcome = self._retry_or_fail(claim, str(timed_out), ctx)
            return self._result(moved, outcome, ctx, str(timed_out))
        except LeaseLost:
            raise
        except Exception as err:
            return self._handler_failed(claim, ctx, err)
        return self._complete(claim, ctx, result)

    def _handler_failed(self, claim: Claim, ctx: JobContext, err: Exception) -> RunResult:
        """The handler raised: the attempt failed, retried or FAILED. A handler that
        caught the context's :class:`Diverged` and raised on still fails as diverged."""
        if ctx.replay.diverged is not None:
            return self._diverged(claim, ctx, ctx.replay.diverged)
        job = claim.job
        error = clip(f"{type(err).__name__}: {err}")
        log.info(
            "job %s attempt %d failed: %s\n%s",
            job.id,
            job.attempts,
            error,
            traceback.format_exc(),
        )
        moved, outcome = self._retry_or_fail(claim, error, ctx)
        return self._result(moved, outcome, ctx, error)

    def _complete(self, claim: Claim, ctx: JobContext, result: Any) -> RunResult:
        """The handler returned: COMPLETED with its result, unless a recorded step was
        never asked for (:class:`Diverged`) or the result cannot be stored (FAILED)."""
        ctx.check_lease()
        try:
            ctx.replay.check_all_asked()
        except Diverged as diverged:
            return self._diverged(claim, ctx, diverged.error)
        pending = ctx.take_pending()
        try:
            completed = self._held(
                ctx,
                partial(self.store.ownership.complete, claim, result, rings=self.rings),
                pending,
            )
        except InvalidInput as err:
            # The return value cannot be stored (not JSON, too big): no retry would change it,
            # and letting it escape would leave the job RUNNING until its lease ran out.
            return self._failed(ctx, str(err), pending)
        return self._result(completed, Outcome.COMPLETED, ctx)

    def _diverged(self, claim: Claim, ctx: JobContext, error: NonDeterministic) -> RunResult:
        """The code no longer makes the calls this job recorded: FAILED now, whatever its
        attempts (no retry of the same code could pass), through the owner's fenced write;
        its recorded steps are kept for ``jobctl retry`` once the code is fixed. The steps
        that ran before the mismatch are recorded with the move."""
        text = clip(f"{type(error).__name__}: {error}")
        log.error("job %s attempt %d: %s", claim.job_id, claim.job.attempts, text)
        return self._failed(ctx, text)

    def _failed(
        self, ctx: JobContext, error: str, steps: Sequence[PendingStep] | None = None
    ) -> RunResult:
        """The run ends FAILED with ``error``, through the owner's fenced write (held
        through an outage, :meth:`_held`) with the pending ``steps`` (``ctx``'s unless
        given)."""
        fail = partial(self.store.ownership.fail, ctx.claim, error, rings=self.rings)
        return self._result(self._held(ctx, fail, steps), Outcome.FAILED, ctx, error)

    def _retry_or_fail(self, claim: Claim, error: str, ctx: JobContext) -> tuple[Job, Outcome]:
        """End a failed attempt: back to QUEUED after the backoff while attempts remain,
        else FAILED; the steps that ran before the failure are recorded with it."""
        job = claim.job
        if job.attempts < job.max_attempts:
            delay = backoff_seconds(
                job.attempts, self.retry_backoff_seconds, self.retry_backoff_max_seconds
            )
            retried = self._held(ctx, partial(self.store.ownership.retry, claim, error, delay))
            return retried, Outcome.RETRYING
        failed = self._held(ctx, partial(self.store.ownership.fail, claim, error, rings=self.rings))
        return failed, Outcome.FAILED

    @property
    def rings(self) -> bool:
        """Whether this runner rings the doorbells its writes owe (it has a ring)."""
        return self.ring is not None

    def _rung(self, moved: Moved) -> Job:
        """Ring the doorbells ``moved``'s write owes, now that it committed; its job."""
        if moved.doorbells and self.ring is not None:
            self.ring(moved.doorbells)
        return moved.job

    def _held(
        self,
        ctx: JobContext,
        write: Callable[..., Job | Moved],
        steps: Sequence[PendingStep] | None = None,
    ) -> Job:
        """``write(steps=…)``, an outcome write with the run's pending steps (taken from
        ``ctx`` unless given), held through a database outage while the lease can be live
        (:class:`jobs._core.outage.LeaseHold`): the outcome is kept, not re-rolled; one
        whose acknowledgement was lost is found in the job's history, not raised. The
        doorbells a write owes ring after it committed (:meth:`_rung`); one found in the
        history owes none: its doorbells were lost with its answer, for the sweeper."""
        pending = ctx.take_pending() if steps is None else steps
        claim = ctx.claim
        written = (
            write(steps=pending)
            if ctx.hold is None
            else ctx.hold.write(
                partial(write, steps=pending),
                landed=lambda: ctx.store.reads.moved_by(claim.job_id, claim.owner, claim.fence),
            )
        )
        return self._rung(written) if isinstance(written, Moved) else written

    def _held_as(
        self, outcome: Outcome, ctx: JobContext, write: Callable[..., Job | Moved]
    ) -> RunResult:
        """The run's result as ``outcome``, once ``write`` is written (:meth:`_held`)."""
        return self._result(self._held(ctx, write), outcome, ctx)

    @staticmethod
    def _parked_or_back(job: Job) -> Outcome:
        """WAITING, or HANDED_BACK when the wait ended as it began (its children ended, or
        its event came, meanwhile): the job is QUEUED, due now, for its doorbell to ring."""
        return Outcome.WAITING if job.state is State.WAITING else Outcome.HANDED_BACK

    @staticmethod
    def _result(job: Job, outcome: Outcome, ctx: JobContext, error: str | None = None) -> RunResult:
        return RunResult(
            job.id, outcome, job, tuple(ctx.replay.ran), tuple(ctx.replay.replayed), error
        )
