"""Every error the job system raises on purpose, each with a message a user can act on.

They share :class:`JobError` so the CLI can print one clear line for any of them
instead of a traceback.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobs._core.states import State


class JobError(Exception):
    """Base of every deliberate error; ``str(err)`` is the one line shown to users."""


class SettingsError(JobError):
    """A ``JOBS_*`` setting (or a ``settings.JOBS`` / ``app.config`` entry) is wrong: the
    message names it and what is allowed; the password of a URL is masked."""


class UnknownJob(JobError):
    """No job has this ID (never submitted, or pruned by retention)."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"unknown job id {job_id!r}")
        self.job_id = job_id


class UnknownKind(JobError):
    """No handler is registered for this kind in this process: the message lists the known
    kinds; a worker missing one usually lacks the module in ``JOBS_IMPORTS``."""

    #: At most this many known kinds are named, and this much of the unknown name shown.
    MAX_NAMED = 20
    MAX_NAME_CHARS = 100

    def __init__(self, kind: str, known: list[str]) -> None:
        named = sorted(known)[: self.MAX_NAMED]
        hint = ", ".join(name[: self.MAX_NAME_CHARS] for name in named)
        hint = hint or "none registered; check JOBS_IMPORTS"
        if len(known) > len(named):
            hint += f", and {len(known) - len(named)} more"
        shown = repr(kind[: self.MAX_NAME_CHARS])
        if len(kind) > self.MAX_NAME_CHARS:
            shown += f"… ({len(kind)} characters)"
        super().__init__(f"unknown job kind {shown} (known kinds: {hint})")
        self.kind = kind


class InvalidInput(JobError):
    """A value that can never be stored or run (inputs, outputs, names, numbers): refused
    before anything is written, with the reason."""


class DuplicateJob(JobError):
    """A caller-chosen job ID already names a job of another kind or with other inputs; the
    same kind and inputs return the existing job instead (idempotent submit)."""

    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"job id {job_id!r} already exists with a different kind or inputs; "
            "choose another id or submit the same inputs to get the existing job"
        )
        self.job_id = job_id


class IllegalTransition(JobError):
    """The job's state does not allow this move (approving a job that is not waiting,
    cancelling a finished one); the state table is :data:`jobs._core.states.TRANSITIONS`."""

    def __init__(self, source: State | None, target: State, job_id: str | None = None) -> None:
        where = f"job {job_id!r}: " if job_id else ""
        src = source.value if source is not None else "(new)"
        super().__init__(f"{where}illegal transition {src} -> {target.value}")
        self.source = source
        self.target = target
        self.job_id = job_id


class NothingToWake(JobError):
    """An operator's wake of a job that is not QUEUED waiting on a timer (it is running,
    waiting for approval, ended, or already due): nothing was changed."""

    def __init__(self, job_id: str, state: State) -> None:
        why = (
            "is QUEUED and due already: nothing to wake"
            if state.value == "QUEUED"
            else f"is {state.value}: only a QUEUED job waiting on a timer can be woken"
        )
        super().__init__(f"job {job_id!r} {why}")
        self.job_id = job_id
        self.state = state


class LeaseLost(JobError):
    """The worker no longer owns the job: its lease expired, a newer claim fenced it out,
    or an operator cancelled the job. The handler must stop and write nothing more."""

    def __init__(self, job_id: str, owner: str, fence: int, why: str = "") -> None:
        detail = f": {why}" if why else ""
        super().__init__(f"job {job_id!r}: lease lost by {owner!r} (fence {fence}){detail}")
        self.job_id = job_id
        self.owner = owner
        self.fence = fence


class JobCancelled(LeaseLost):
    """The :class:`LeaseLost` of a run whose job was cancelled (``jobs.cancel``, ``jobctl
    cancel``) while it ran: the job is CANCELLED already, with the cancel's reason in its
    history, and the run writes nothing more. Raised by the run's next step (or wait,
    or timer); the heartbeat has set ``ctx.cancelled`` and called ``ctx.on_cancel``'s
    callbacks by then."""

    def __init__(self, job_id: str, owner: str, fence: int) -> None:
        super().__init__(job_id, owner, fence, "the job was cancelled")


class StepError(JobError):
    """A step was used wrongly by a handler (the same step name twice in one run)."""


class AdmissionRefused(JobError):
    """The system is at its admission limit; nothing was written. Retry after ``retry_after``."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(f"{message}; retry in {retry_after:.0f}s")
        self.retry_after = retry_after


class ChildFailed(JobError):
    """Raised by ``ctx.wait_for``/``ctx.map`` in a parent when a child it waits for ended
    FAILED or CANCELLED: names the child and its error. The parent may catch it; if it
    does not, the parent's attempt fails like any handler error."""

    def __init__(self, child_id: str, state: str, error: str | None) -> None:
        super().__init__(f"child job {child_id!r} ended {state}: {error or 'no error recorded'}")
        self.child_id = child_id
        self.state = state
        self.error = error


class EventTimedOut(JobError):
    """Raised by ``ctx.wait_for_event`` (and ``ctx.wait_for_approval`` with a ``timeout``)
    when the wait's deadline passed, on the database clock, before the event (or the
    approval) came. The handler may catch it and escalate."""

    def __init__(self, job_id: str, waited_for: str) -> None:
        super().__init__(f"job {job_id!r}: {waited_for} did not come before its deadline")
        self.job_id = job_id
        self.waited_for = waited_for


class NonDeterministic(JobError):
    """A resumed run's handler did not make the calls its job recorded: at ``position`` in
    its sequence of calls (0 first) it asked for step ``asked`` where step ``recorded`` is
    recorded (a step renamed, added, removed or moved by a deploy), or it returned
    (``asked`` is ``None``) without asking for ``recorded``. The job is FAILED at once,
    not retried, with its recorded steps kept: deploy code that makes the recorded calls
    (guard new code with ``ctx.patched``) and retry it (``jobctl retry``) to resume."""

    def __init__(
        self,
        job_id: str,
        position: int,
        recorded: str | None,
        asked: str | None,
        detail: str = "",
    ) -> None:
        if asked is None:
            what = f"the handler returned without asking for step {recorded!r}, recorded"
        elif recorded is None:
            what = f"the code asked for step {asked!r} at position {position}, where nothing"
            what += f" is recorded ({detail})" if detail else " is recorded"
        else:
            what = f"the code asked for step {asked!r} where step {recorded!r} is recorded"
        place = "" if recorded is None and asked is not None else f" at position {position}"
        super().__init__(
            f"job {job_id!r}: {what}{place}; the handler no longer makes the calls this job "
            "recorded (a step renamed, added, removed or moved?). Its recorded steps are "
            "kept: deploy code that replays them (guard changes with ctx.patched) and "
            f"retry it (jobctl retry {job_id})"
        )
        self.job_id = job_id
        self.position = position
        self.recorded = recorded
        self.asked = asked
