"""The replay check: run the code as deployed against what live jobs recorded, in dry mode.

Before a deploy (or in a test), each job that would resume under the new code is replayed:
its handler runs from the top with a context that returns the recorded outputs and stops
at the first call that would run or write something new. Nothing unrecorded runs (no
step's function is called that had not finished before) and nothing is written. A job
whose handler asks, at some place, for a step other than the one recorded there (or
returns while recorded steps were never asked for) is reported as it would end in
production: :class:`jobs.NonDeterministic`, naming the job, the place, the recorded step
and the one the code asked for. ``jobctl replay-check`` exits non-zero then, a gate for CI.

Code outside steps runs as it would on a resume (it should be cheap and free of side
effects anyway: it runs again on every resume). An ``async def`` handler is replayed the
same way, awaited on this thread's event loop with the async context over the replaying
one (:class:`jobs._core.async_context.AsyncJobContext`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import Any

from jobs._core.async_context import AsyncJobContext, is_async_handler
from jobs._core.context import JobContext
from jobs._core.errors import InvalidInput, NonDeterministic, UnknownKind
from jobs._core.interrupts import Diverged, JobInterrupt
from jobs._core.kind_versions import KindVersions, RunVersions
from jobs._core.progress import check_progress
from jobs._core.records import Claim
from jobs._core.registry import Registry
from jobs._core.states import State
from jobs._core.validate import clip
from jobs._store import JobStore
from jobs._store.replay_reads import RecordedJob
from jobs._worker.runner import EVENT_LOOPS

#: The states whose jobs can resume under the deployed code: those a worker will run again.
LIVE_STATES = (State.QUEUED, State.RUNNING, State.WAITING, State.WAITING_APPROVAL)

#: Who a replay's context says holds the claim (nothing is ever written under it).
REPLAY_OWNER = "replay-check"

#: How long an error message in a verdict may be.
DETAIL_LENGTH = 300


class ReachedNewCode(JobInterrupt):
    """The replay got to a call with nothing recorded: what follows is new for this job."""


class ReplayingContext(JobContext):
    """A context that replays what its job recorded and stops, before anything runs or is
    written, at the first call with nothing recorded: every such path checks the lease
    first (:meth:`JobContext.check_lease`), and here that check ends the replay.
    ``ctx.progress`` is checked and dropped."""

    def check_lease(self) -> None:
        """End the replay: the handler reached a call this job has not recorded."""
        raise ReachedNewCode()

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Check the value as a run would, and write nothing."""
        check_progress(done, total, message)


@dataclasses.dataclass(frozen=True)
class ReplayVerdict:
    """What replaying one job found.

    ``verdict`` is ``ok`` (the replay reached new code, or the handler's end, with every
    recorded step asked for at its place), ``diverged`` (it would end
    :class:`jobs.NonDeterministic`: :attr:`error`), ``raised`` (the handler raised while
    replaying, as it would on a resume: :attr:`detail`), ``unknown kind`` (no code for the
    kind is deployed: it would fail) or ``other version`` (recorded at its first claim under
    a version of its kind this code does not run: only a worker of that version claims it,
    so this code never meets it; not replayed). ``replayed`` counts the recorded steps it
    walked past."""

    job_id: str
    kind: str
    state: State
    verdict: str
    replayed: int
    detail: str = ""
    error: NonDeterministic | None = None

    @property
    def blocks_deploy(self) -> bool:
        """Whether this job would fail under the deployed code for the code's reason (it
        diverged, or its kind is gone): what makes ``jobctl replay-check`` exit non-zero."""
        return self.verdict in ("diverged", "unknown kind")

    def as_dict(self) -> dict[str, Any]:
        """The verdict as JSON for scripts (``jobctl replay-check --json``)."""
        found: dict[str, Any] = {
            "job_id": self.job_id,
            "kind": self.kind,
            "state": self.state.value,
            "verdict": self.verdict,
            "replayed": self.replayed,
            "detail": self.detail,
        }
        if self.error is not None:
            found["position"] = self.error.position
            found["recorded"] = self.error.recorded
            found["asked"] = self.error.asked
        return found


def replay_job(
    store: JobStore,
    registry: Registry,
    recorded: RecordedJob,
    default_max_attempts: int = 5,
    versions: KindVersions | None = None,
) -> ReplayVerdict:
    """Replay one job's handler against what it recorded (see the module's docstring);
    with ``versions`` (this code's, :meth:`Registry.versions`), a job recorded under a
    version this code does not run is ``other version``, not replayed."""
    job = recorded.job
    if versions is not None and not versions.runs(job.kind, job.code_version):
        versioned = versions.of(job.kind)
        runs = "" if versioned is None else ", ".join(versioned.runs)
        detail = (
            f"recorded under version {job.code_version} at its first claim; this code runs "
            f"{runs}, so only a worker of version {job.code_version} resumes it"
        )
        return ReplayVerdict(job.id, job.kind, job.state, "other version", 0, detail)

    def verdict(
        name: str, detail: str = "", error: NonDeterministic | None = None
    ) -> ReplayVerdict:
        return ReplayVerdict(
            job.id, job.kind, job.state, name, len(ctx.replay.replayed), detail, error
        )

    try:
        kind = registry.get(job.kind)
    except UnknownKind as err:
        return ReplayVerdict(job.id, job.kind, job.state, "unknown kind", 0, str(err))
    ctx = ReplayingContext(
        store,
        Claim(job, REPLAY_OWNER, job.fence),
        dict(recorded.outputs),
        registry=registry,
        default_max_attempts=default_max_attempts,
        positions=recorded.positions,
    )
    try:
        kind.check_inputs(job.inputs)
        if is_async_handler(kind.handler):
            EVENT_LOOPS.run(AsyncJobContext(ctx).run(kind.handler, job.inputs))
        else:
            kind.handler(ctx, **job.inputs)
        ctx.replay.check_all_asked()
    except ReachedNewCode:
        pass
    except Diverged as diverged:
        return verdict("diverged", str(diverged.error), diverged.error)
    except (Exception, JobInterrupt) as err:  # the handler's own error, as a resume meets it
        return verdict("raised", clip(f"{type(err).__name__}: {err}", DETAIL_LENGTH))
    return verdict("ok")


@dataclasses.dataclass
class ReplayReport:
    """A replay check's verdicts (only the ones not ``ok``, :attr:`findings`) and counts."""

    checked: int = 0
    ok: int = 0
    findings: list[ReplayVerdict] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    @property
    def blocks_deploy(self) -> bool:
        """Whether any job would fail under the deployed code for the code's reason."""
        return any(found.blocks_deploy for found in self.findings)

    def counts(self) -> dict[str, int]:
        """How many jobs got each verdict."""
        counted = {"ok": self.ok}
        for found in self.findings:
            counted[found.verdict] = counted.get(found.verdict, 0) + 1
        return counted


def replay_check(
    store: JobStore,
    registry: Registry,
    states: Sequence[State] = LIVE_STATES,
    kind: str | None = None,
    *,
    batch: int = 500,
    default_max_attempts: int = 5,
    run_versions: RunVersions = (),
) -> ReplayReport:
    """Replay every job in ``states`` (of ``kind``, if given), ``batch`` at a time; a job
    recorded under a version of its kind this code does not run (with ``run_versions``,
    ``JOBS_RUN_VERSIONS``) is reported ``other version``, not replayed."""
    if batch < 1:
        raise InvalidInput(f"batch must be at least 1, got {batch}")
    started = time.monotonic()
    versions = registry.versions(run_versions)
    checked = ok = 0
    findings: list[ReplayVerdict] = []
    for found in _verdicts(store, registry, states, kind, batch, default_max_attempts, versions):
        checked += 1
        if found.verdict == "ok":
            ok += 1
        else:
            findings.append(found)
    return ReplayReport(checked, ok, findings, time.monotonic() - started)


def _verdicts(
    store: JobStore,
    registry: Registry,
    states: Sequence[State],
    kind: str | None,
    batch: int,
    default_max_attempts: int,
    versions: KindVersions,
) -> Iterator[ReplayVerdict]:
    after: str | None = None
    while True:
        jobs = store.replays.batch(states, kind, after, batch)
        for recorded in jobs:
            yield replay_job(store, registry, recorded, default_max_attempts, versions)
        if len(jobs) < batch:
            return
        after = jobs[-1].job.id


__all__ = [
    "LIVE_STATES",
    "ReplayReport",
    "ReplayVerdict",
    "ReplayingContext",
    "replay_check",
    "replay_job",
]
