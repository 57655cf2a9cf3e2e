"""``jobctl explain ID``: why a job is where it is, and what an operator can do about it.

Reads only: the job row, its history and steps, its kind's limits, pauses and running count, the
settings (lease, ring-again delay) and, for a RUNNING job, whether its owner is alive
(PostgreSQL: the owner's liveness lock is held; SQLite: the owner's process exists). All
instants are the database's, like every decision the system takes about the job.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import shlex
from collections.abc import Sequence
from typing import Any

from jobs._config.database_urls import mask_url
from jobs._config.settings import Settings
from jobs._core.interrupts import wake_at_of
from jobs._core.progress import progress_text
from jobs._core.records import Job, Transition
from jobs._core.states import State
from jobs._core.validate import check_lookup_id, printable
from jobs._doorbell.queues import kind_task_name, queue_for
from jobs._store import JobStore
from jobs._store.pause_clauses import KIND, holding
from jobs._worker import liveness
from jobs._worker.live_workers import WorkerSeen


@dataclasses.dataclass(frozen=True)
class Explanation:
    """One job's situation: a short ``reason`` code, a paragraph, and what to do."""

    job_id: str
    state: State
    reason: str
    paragraph: str
    actions: tuple[str, ...]
    # The job's latest ``ctx.progress`` (``{"done", "total", "message"}``), if any.
    progress: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (``jobctl explain --json``)."""
        return {
            "id": self.job_id,
            "state": self.state.value,
            "reason": self.reason,
            "explanation": self.paragraph,
            "actions": list(self.actions),
            "progress": self.progress,
        }


def _at(instant: dt.datetime | None) -> str:
    return "-" if instant is None else instant.isoformat(timespec="seconds")


def _span(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


# The reason the store writes when a parent parks (jobs/_store/workflows.py):
# "waiting for <unfinished> of <asked> children".
_PARKED_FOR = re.compile(r"^waiting for \d+ of (\d+) children$")


#: Step names ``explain`` lists before it counts the rest.
SHOWN_STEP_NAMES = 30


def _names(steps: Sequence[str], total: int) -> str:
    shown = ", ".join(steps[:SHOWN_STEP_NAMES])
    more = total - len(steps[:SHOWN_STEP_NAMES])
    return f"{shown} and {more} more" if more > 0 else shown


def _children_of_wait(store: JobStore, job: Job, history: Sequence[Transition]) -> int:
    """How many children the current wait asked for: from the park's own line in the
    history, else (no such line) every child the job has."""
    park = _last_move_to(list(history), State.WAITING)
    asked = _PARKED_FOR.match(park.reason or "") if park is not None else None
    return int(asked.group(1)) if asked else store.pages.children_page(job.id, 0, 1).total


def _waiting(
    store: JobStore, job: Job, now: dt.datetime, quoted: str, history: Sequence[Transition]
) -> tuple[str, str, tuple[str, ...]]:
    """A job parked WAITING: for its children (how many of the current wait's), or for an
    event (until when)."""
    if job.wait_event is not None:
        until = (
            "with no deadline"
            if job.wait_deadline is None
            else f"until {_at(job.wait_deadline)} (in "
            f"{_span(max(0.0, (job.wait_deadline - now).total_seconds()))})"
        )
        text = (
            f"It is waiting for event {printable(job.wait_event)!r} {until}. It holds no "
            "worker, lease or message; the event queues it again (an event sent earlier "
            "would have been consumed already), the deadline ends the wait with EventTimedOut."
        )
        name = shlex.quote(job.wait_event)
        return (
            "waiting_event",
            text,
            (f"jobctl send-event {quoted} {name}", f"jobctl cancel {quoted}"),
        )
    asked = _children_of_wait(store, job, history)
    text = (
        f"It is waiting for {job.children_pending} of {asked} children. It holds no "
        "worker, lease or message; the last of them to finish queues it again."
    )
    return "waiting_children", text, (f"jobctl show {quoted}", f"jobctl cancel {quoted}")


def _last_move_to(history: list[Transition], state: State) -> Transition | None:
    for move in reversed(history):
        if move.to_state is state:
            return move
    return None


def owner_alive(store: JobStore, liveness_key: int | None) -> bool | None:
    """True/False when the owner's liveness can be told, None when it cannot."""
    if liveness_key is None:
        return None
    if store.engine.dialect.name == "postgresql":
        return liveness_key in liveness.held_keys(store.engine)
    if store.engine.dialect.name == "sqlite":
        pid = liveness.pid_of_key(liveness_key)  # None: another host or PID namespace
        return None if pid is None else liveness.process_alive(pid)
    return None


def explain(
    store: JobStore,
    settings: Settings,
    job_id: str,
    workers: Sequence[WorkerSeen] | None = None,
) -> Explanation:
    """Explain one job (raises :class:`jobs.UnknownJob` for an unknown ID). Stored text
    (errors, reasons, owners) is shown escaped (:func:`printable`) and the IDs in suggested
    commands are quoted for a shell. ``workers``, the live workers as they answered
    (:func:`jobs._worker.live_workers.live_workers`; ``None``: not asked), tells a QUEUED job
    whether any of them consumes its queue and knows its kind."""
    check_lookup_id(job_id)
    job = store.reads.get(job_id)
    quoted = shlex.quote(job.id)
    now = store.reads.now()
    # Bounded however long the job ran: its last moves, its first step names and its last
    # steps (a 100,000-step job's explain read them all: 8 s and 83 MiB per Flower page).
    history = store.pages.recent_history(job_id)
    recorded = store.pages.step_names(job_id, first=SHOWN_STEP_NAMES)
    timers = {
        wake_at_of(json.loads(small) if small else None): name for name, small in recorded.recent
    }
    origin = _origin(job)
    done = (
        f"Recorded steps: {_names(recorded.first, recorded.total)}."
        if recorded.total
        else "No step is recorded yet."
    )
    attempts = f"attempt {job.attempts} of {job.max_attempts}"
    if job.state is State.QUEUED:
        reason, text, actions = _queued(store, settings, job, now, timers, workers)
    elif job.state is State.RUNNING:
        reason, text, actions = _running(store, settings, job, now, attempts)
    elif job.state is State.WAITING_APPROVAL:
        since = _last_move_to(history, State.WAITING_APPROVAL)
        why = printable(since.reason) if since is not None and since.reason else "no reason given"
        when = since.at if since is not None else job.updated_at
        reason = "waiting_approval"
        text = (
            f"It is waiting for approval since {_at(when)} ({_span((now - when).total_seconds())} "
            f"ago): {why}. It holds no worker, lease or message; approval records step "
            f"{job.waiting_for!r} and queues it again, to resume past its recorded steps."
        )
        actions = (f"jobctl approve {quoted} --by NAME", f"jobctl cancel {quoted}")
    elif job.state is State.WAITING:
        reason, text, actions = _waiting(store, job, now, quoted, history)
    elif job.state is State.COMPLETED:
        reason = "completed"
        text = f"It completed at {_at(job.finished_at)} on {attempts}."
        actions = (f"jobctl show {quoted}",)
    elif job.state is State.FAILED:
        reason = "failed"
        text = (
            f"It failed at {_at(job.finished_at)} after {job.attempts} of {job.max_attempts} "
            f"attempts, with: {printable(job.last_error or 'no error recorded')}. "
            "Nothing runs it again until an operator retries it."
        )
        actions = (
            f"jobctl show {quoted} (the history has every attempt's error)",
            f"jobctl retry {quoted} once the cause is fixed (resumes at the failed step; "
            "--from-start runs every step again)",
        )
    else:
        moved = _last_move_to(history, State.CANCELLED)
        reason = "cancelled"
        text = (
            f"It was cancelled at {_at(job.finished_at)}"
            f"{': ' + printable(moved.reason) if moved is not None and moved.reason else ''}."
        )
        actions = (f"jobctl show {quoted}", f"jobctl retry {quoted} to run it after all")
    progress = progress_text(job.progress)
    if progress is not None:
        done = f"{done} Progress: {progress}."
    if job.code_version is not None:
        done = f"{done} Code version {printable(job.code_version)}, recorded at first claim."
    paragraph = f"Job {job.id} ({job.kind}{origin}) is {job.state.value}. {text} {done}"
    return Explanation(job.id, job.state, reason, paragraph, tuple(actions), job.progress)


def _origin(job: Job) -> str:
    name, _, tick = job.id.rpartition("@")
    return (
        f", submitted by schedule {name!r} for tick {tick}" if name and tick.endswith("Z") else ""
    )


def _queued(
    store: JobStore,
    settings: Settings,
    job: Job,
    now: dt.datetime,
    timers: dict[dt.datetime | None, str],
    workers: Sequence[WorkerSeen] | None = None,
) -> tuple[str, str, tuple[str, ...]]:
    after_error = f" after an error ({printable(job.last_error)})" if job.last_error else ""
    quoted, kind = shlex.quote(job.id), shlex.quote(job.kind)
    queue = queue_for(settings, job.priority, job.queue)
    timer = timers.get(job.run_after)
    pause = holding(store.reads.pauses(), job.kind, job.queue)
    if pause is not None:
        what = (
            shlex.quote(pause.name) if pause.scope == KIND else f"--queue {shlex.quote(pause.name)}"
        )
        due = (
            f"It is due since {_at(job.run_after)}"
            if job.run_after <= now
            else f"It is due at {_at(job.run_after)}"
        )
        return (
            "paused",
            f"{due}, but it is held: {pause.describe()}. No worker claims it until the "
            "pause is lifted. It holds no worker or lease; a message that arrives meanwhile is "
            "dropped, and the resume rings it again.",
            (f"jobctl resume {what} to run it", f"jobctl cancel {quoted} to stop it"),
        )
    if job.run_after > now and timer is not None:
        wait = _span((job.run_after - now).total_seconds())
        return (
            "sleeping",
            f"It is sleeping until {_at(job.run_after)} (timer {timer!r}), in {wait}. It "
            "holds no worker, lease or message; the sweeper sends its message when the timer "
            "is due, and it resumes past its recorded steps without sleeping again.",
            (f"jobctl wake {quoted} to run it now", f"jobctl cancel {quoted} to stop it"),
        )
    if job.run_after > now:
        wait = _span((job.run_after - now).total_seconds())
        return (
            "not_due",
            f"It is not due until {_at(job.run_after)} (in {wait}){after_error}; the "
            "sweeper sends its message then. It holds no worker meanwhile.",
            (f"jobctl wake {quoted} to run it now", f"jobctl cancel {quoted} to stop it"),
        )
    limits = store.reads.limits().get(job.kind)
    rated = limits is not None and (limits.rate_limit or limits.rate_limit_per_key)
    waiting = store.depth.next_start(job.kind, job.concurrency_key) if rated else None
    if waiting is not None:
        rate, seconds = waiting
        return (
            "waiting_for_rate",
            f"It is due but held back by its kind's {printable(rate)}: next start allowed "
            f"in {seconds:.1f} s. One delivery waits for each start; a start rings the "
            "next held job.",
            (f"jobctl limits set {kind} --rate N/m to allow more",),
        )
    per_key = None if limits is None else limits.max_running_per_key
    if per_key is not None and job.concurrency_key is not None:
        key = job.concurrency_key
        of_key = store.depth.running_per_key(job.kind, [key])[key]
        if of_key >= per_key:
            return (
                "waiting_for_key_slot",
                f"It is due but waiting for a slot of key {printable(key)}: {of_key} of "
                f"{per_key} running (max_running_per_key of {printable(job.kind)!r}); a "
                "finishing job of the key passes its slot on.",
                (f"jobctl limits set {kind} --per-key N to allow more",),
            )
    running = store.depth.counts().get((job.kind, State.RUNNING.value), 0)
    if limits is not None and limits.max_running is not None and running >= limits.max_running:
        return (
            "waiting_for_slot",
            f"It is due but waiting for a slot of its kind: {running} of "
            f"{limits.max_running} allowed are running; a finishing job passes its slot on.",
            (f"jobctl limits set {kind} --max-running N to allow more",),
        )
    unserved = _unserved(job, queue, workers)
    if unserved is not None:
        return unserved
    rung_at = job.dispatched_at
    if rung_at is None:
        return (
            "not_sent",
            f"It is due since {_at(job.run_after)}{after_error} and its message is not sent "
            "yet (a failed publish or an ended backoff); the next sweep sends it.",
            ("check that a sweeper runs: jobctl sweeper",),
        )
    sent_ago = (now - rung_at).total_seconds()
    on_the_broker = (
        f"is the worker on the same broker? This process sends to {mask_url(settings.broker_url)} "
        f"(database {mask_url(settings.database_url)}); a worker logs its own at start-up "
        "('worker: broker …')"
    )
    if sent_ago >= settings.ring_again_after_seconds and job.code_version is not None:
        version = f"version {printable(job.code_version)} of kind {printable(job.kind)!r}"
        return (
            "waiting_for_version",
            f"It is waiting for a worker that runs {version}: it was recorded under that "
            f"version at its first claim, and its message, sent at {_at(rung_at)} "
            f"({_span(sent_ago)} ago), was not claimed. A worker that runs another version "
            "of the kind leaves it QUEUED, and the next sweep sends its message again"
            f"{_who_runs(job, queue, workers, on_the_broker)}",
            (
                f"keep a worker of {version} running until its jobs are done",
                f"or let the new code run it: @jobs.job({printable(job.kind)!r}, "
                f"runs_versions=(…, {printable(job.code_version)!r})) or "
                f"JOBS_RUN_VERSIONS={kind}={shlex.quote(job.code_version)},… once it "
                "replays them (jobctl replay-check)",
            ),
        )
    if sent_ago >= settings.ring_again_after_seconds:
        return (
            "message_lost",
            f"Its message was sent at {_at(rung_at)}: rung {_span(sent_ago)} ago and "
            f"not claimed: {on_the_broker}. It counts as lost, and the next sweep sends it again.",
            (
                "check that a sweeper runs: jobctl sweeper",
                f"check that workers consume queue {queue!r} on the same broker and know "
                f"kind {job.kind!r}",
            ),
        )
    due_for = (now - job.run_after).total_seconds()
    nothing_running = not any(
        state == State.RUNNING.value for (_, state), count in store.depth.counts().items() if count
    )
    if due_for >= settings.ring_again_after_seconds and nothing_running:
        return (
            "not_claimed",
            f"It has been due for {_span(due_for)}; its message was sent again at "
            f"{_at(rung_at)}, yet no worker claimed it and no job is running anywhere: "
            f"rung {_span(due_for)} ago and not claimed: {on_the_broker}.",
            (
                f"check that workers consume queue {queue!r} on the same broker and know "
                f"kind {job.kind!r}",
                "compare the 'worker: broker …' line of a worker's log with this one",
            ),
        )
    ahead = store.depth.oldest_queued()
    backlog = "" if ahead is None else f" The oldest due job has waited {_span(ahead[1])}."
    return (
        "waiting_for_worker",
        f"It is due{after_error}; its message (priority {job.priority}) was sent at "
        f"{_at(rung_at)} ({_span(sent_ago)} ago) and waits for a free worker on queue "
        f"{queue!r}, behind any of higher priority.{backlog}",
        (f"add workers on queue {queue!r} if the queue keeps growing (jobctl stats)",),
    )


def _who_runs(
    job: Job, queue: str, workers: Sequence[WorkerSeen] | None, on_the_broker: str
) -> str:
    """The end of ``waiting_for_version``'s paragraph: which live workers of the job's queue
    run its recorded version, as they answered (the workers not asked, or none telling: if
    such a worker runs, the message was lost)."""
    task, version = kind_task_name(job.kind), job.code_version or ""
    told = [
        worker
        for worker in workers or ()
        if queue in worker.queues and worker.runs(task, version) is not None
    ]
    if not told:
        return f" (if such a worker runs, the message was lost: {on_the_broker})."
    running = [worker.name for worker in told if worker.runs(task, version)]
    if running:
        return (
            f". Live workers that run it: {printable(', '.join(running[:5]))}; each message "
            "reaches one worker of the queue, so it may take a few sends to reach one."
        )
    others = "; ".join(
        f"{worker.name} runs {', '.join(sorted(worker.versions[task]))}" for worker in told[:5]
    )
    return (
        f". No live worker of queue {queue!r} runs that version ({printable(others)}): it "
        "waits until one starts."
    )


def _unserved(
    job: Job, queue: str, workers: Sequence[WorkerSeen] | None
) -> tuple[str, str, tuple[str, ...]] | None:
    """A due job that no live worker can run: none consumes its queue, or those that do
    do not know its kind (they leave it QUEUED). ``None`` when one can, or when the workers
    were not asked."""
    if workers is None:
        return None
    serving = [worker for worker in workers if queue in worker.queues]
    if not serving:
        return (
            "no_worker_on_queue",
            f"It waits on queue {queue!r}, and no live worker consumes it"
            f" ({len(workers)} answered). It runs once a worker consumes that queue.",
            (
                f"start one: jobctl worker --queues {shlex.quote(queue)}"
                f" (or celery -A <your app> worker -Q {shlex.quote(queue)})",
            ),
        )
    if not any(kind_task_name(job.kind) in worker.tasks for worker in serving):
        names = ", ".join(worker.name for worker in serving)
        return (
            "kind_unknown_to_workers",
            f"It waits on queue {queue!r}, whose live workers ({printable(names)}) do not know "
            f"kind {job.kind!r}: they leave it QUEUED for a worker that does.",
            (
                f"import the module that defines {job.kind!r} in those workers (JOBS_IMPORTS, "
                "or the Celery app's include)",
            ),
        )
    return None


def _running(
    store: JobStore, settings: Settings, job: Job, now: dt.datetime, attempts: str
) -> tuple[str, str, tuple[str, ...]]:
    lease = job.lease_until
    owner = printable(job.owner or "-")
    alive = owner_alive(store, store.reads.liveness_key_of(job.id))
    state_of_owner = {True: "alive", False: "gone", None: "of unknown liveness"}[alive]
    if lease is not None and lease <= now:
        return (
            "lease_expired",
            f"It was running under owner {owner} ({attempts}), whose lease ended at "
            f"{_at(lease)} ({_span((now - lease).total_seconds())} ago); the owner is "
            f"{state_of_owner}. The next sweep re-queues it (or fails it when no attempt "
            "is left) and a new owner resumes past the recorded steps.",
            ("check that a sweeper runs: jobctl sweeper",),
        )
    if alive is False:
        return (
            "owner_dead",
            f"It is running under owner {owner} ({attempts}), which is gone; its lease "
            f"ends at {_at(lease)}. The next sweep re-queues it now, without waiting for the "
            "lease.",
            ("check that a sweeper runs: jobctl sweeper",),
        )
    left = "-" if lease is None else _span((lease - now).total_seconds())
    return (
        "running",
        f"It is running under owner {owner} ({attempts}), which is {state_of_owner}; "
        f"its lease ends at {_at(lease)} (in {left}) and is renewed while the handler runs.",
        (f"jobctl cancel {shlex.quote(job.id)} (the owner stops at its next step)",),
    )
