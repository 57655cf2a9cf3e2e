"""``jobctl demo``: the seed story told with real processes.

Job T-42 (kind ``check_order``) is submitted; worker A claims it, records the read-only
lookup, and is killed with SIGKILL in the middle of the next step; worker B takes the job
over, replays the lookup from the record instead of running it again, and completes it.
On the embedded default the killed worker's message is lost with it (a server-less
transport cannot redeliver), so recovery comes from the database: the sweeper sees that
A's process is gone, re-queues the job and re-sends it. With JOBS_DATABASE_URL and
JOBS_BROKER_URL set, the same story runs on PostgreSQL and RabbitMQ, where the dead
worker's liveness lock tells the same thing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import jobs
from jobs._config.database_urls import mask_url
from jobs._core.errors import UnknownJob
from jobs._core.states import State
from jobs._store import Job, JobStore, Transition
from jobs._store.schema import upgrade
from jobs.application import default_app

Echo = Callable[[str], None]
KIND_MODULE = "jobs.examples.check_order"


def _short(owner: str | None) -> str:
    return (owner or "-").split("@")[0]


def story_path(history: list[Transition]) -> str:
    """QUEUED → RUNNING (A) → [worker crash] → RUNNING (B) → COMPLETED, from the history."""
    parts: list[str] = []
    for move in history:
        if move.to_state is State.RUNNING:
            if move.from_state is State.RUNNING:
                parts.append("[worker crash]")
            parts.append(f"RUNNING ({_short(move.owner)})")
        elif move.from_state is State.RUNNING and move.to_state is State.QUEUED:
            reason = move.reason or ""
            if "expired" in reason or "died" in reason:
                parts.append("[worker crash]")
            else:
                parts.append("QUEUED")
        else:
            parts.append(move.to_state.value)
    return " → ".join(parts)


class Processes:
    """Child processes of the demo, all stopped on exit however the demo ends."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.children: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{name}.log").open("ab") as out:
            child = subprocess.Popen(
                [sys.executable, "-m", "jobs", *args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.children[name] = child
        return child

    def stop_all(self) -> None:
        for child in self.children.values():
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for child in self.children.values():
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                child.wait()


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    default_app().reset_settings()
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        default_app().reset_settings()


def _wait_for(check: Callable[[], Job | None], timeout: float, what: str) -> Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = check()
        if job is not None:
            return job
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def _free_id(store: JobStore, wanted: str) -> str:
    """``wanted``, or ``wanted-2``, ``wanted-3`` … when an earlier demo on a shared
    database already used it (job IDs are never reused)."""
    candidate, n = wanted, 1
    while True:
        try:
            store.reads.get(candidate)
        except UnknownJob:
            return candidate
        n += 1
        candidate = f"{wanted}-{n}"


def run_demo(job_id: str = "T-42", timeout: float = 90.0, echo: Echo = print) -> bool:
    base = default_app().settings
    embedded = not base.database_url.startswith("postgresql")
    data_dir = base.data_dir / "demo"
    shutil.rmtree(data_dir, ignore_errors=True)  # logs and effects of an earlier run
    overrides = {
        "JOBS_DATA_DIR": str(data_dir),
        "JOBS_IMPORTS": KIND_MODULE,
        "JOBS_SWEEP_INTERVAL_SECONDS": "0.5",
        "JOBS_QUEUE": "jobs-demo",
    }
    if embedded:
        # A short lease, so that even a hung (not dead) worker would be recovered quickly.
        overrides["JOBS_LEASE_SECONDS"] = "3"
    with _environment(overrides):
        jobs.reset()
        settings = default_app().settings
        env = dict(os.environ)
        if not embedded:
            upgrade(default_app().runtime.engine)  # the demo may be the first thing run
        store = default_app().runtime.store
        job_id = _free_id(store, job_id)
        echo(f"database: {store.engine.url.render_as_string(hide_password=True)}")
        echo(f"broker:   {mask_url(settings.broker_url)}   lease: {settings.lease_seconds:g}s")
        procs = Processes(env, data_dir / "logs")
        try:
            return _tell(store, procs, job_id, timeout, echo, data_dir)
        finally:
            procs.stop_all()
            jobs.reset()


def _tell(
    store: JobStore, procs: Processes, job_id: str, timeout: float, echo: Echo, data_dir: Path
) -> bool:
    procs.start("sweeper", "sweeper")
    worker_a = procs.start("worker-A", "worker", "--pool", "solo", "--hostname", "A@%h")
    job_id = jobs.submit("check_order", {"order_id": 42, "check_seconds": 3.0}, job_id=job_id)
    echo(f"submitted {job_id} (check_order, order 42): QUEUED")

    def a_is_in_second_step() -> Job | None:
        job = store.reads.get(job_id)
        names = {step.name for step in store.reads.steps(job_id)}
        started = "check_payment:start" in _effects(data_dir, job_id)
        return job if job.owner and "lookup_order" in names and started else None

    job = _wait_for(a_is_in_second_step, timeout, "worker A to record the lookup")
    echo(
        f"worker A ({job.owner}) claimed {job_id} (fence {job.fence}), recorded lookup_order, "
        "and is now inside check_payment"
    )
    os.kill(worker_a.pid, signal.SIGKILL)
    killed_at = time.time()
    worker_a.wait()
    echo(f"SIGKILL worker A (pid {worker_a.pid}) in the middle of check_payment")

    procs.start("worker-B", "worker", "--pool", "solo", "--hostname", "B@%h")
    echo("worker B started")

    def taken_over() -> Job | None:
        job = store.reads.get(job_id)
        return job if job.owner and job.owner.startswith("B@") else None

    job = _wait_for(taken_over, timeout, "worker B to take the job over")
    claim_at = next(
        move.at for move in reversed(store.reads.history(job_id)) if move.to_state is State.RUNNING
    )
    echo(
        f"worker B ({job.owner}) claimed {job_id} (fence {job.fence}) "
        f"{claim_at.timestamp() - killed_at:.1f}s after the kill"
    )

    def finished() -> Job | None:
        job = store.reads.get(job_id)
        return job if job.state in (State.COMPLETED, State.FAILED, State.CANCELLED) else None

    job = _wait_for(finished, timeout, "the job to finish")
    echo(f"{job_id} {job.state.value}: {json.dumps(job.result)}")
    return _report(store, job, data_dir, echo)


def _effects(data_dir: Path, job_id: str) -> list[str]:
    path = data_dir / "effects.log"
    if not path.exists():
        return []
    return [line.split()[1] for line in path.read_text().splitlines() if line.split()[0] == job_id]


def _report(store: JobStore, job: Job, data_dir: Path, echo: Echo) -> bool:
    history = store.reads.history(job.id)
    effects = _effects(data_dir, job.id)
    echo("")
    echo("history:")
    for move in history:
        source = move.from_state.value if move.from_state else "(new)"
        echo(
            f"  {move.at.isoformat(timespec='milliseconds')}  {source:>16} -> "
            f"{move.to_state.value:<16} owner={_short(move.owner):<2} fence={move.fence} "
            f"{move.reason or ''}"
        )
    echo("steps:")
    for step in store.reads.steps(job.id):
        echo(f"  {step.name:<14} recorded by {_short(step.owner)} (fence {step.fence})")
    lookups = effects.count("lookup_order")
    checks = effects.count("check_payment:start")
    echo(
        f"lookup_order ran {lookups} time(s); check_payment started {checks} time(s) "
        "(the step A was killed in had no record, so B ran it again)"
    )
    echo("")
    echo(f"{job.id}: {story_path(history)}")
    owners = [_short(m.owner) for m in history if m.to_state is State.RUNNING]
    ok = job.state is State.COMPLETED and lookups == 1 and owners[:1] == ["A"] and owners[-1] == "B"
    echo(
        "the job outlived its worker" if ok else f"UNEXPECTED: see the logs in {data_dir / 'logs'}"
    )
    return ok
