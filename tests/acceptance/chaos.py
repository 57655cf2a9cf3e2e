"""Chaos: a seeded fault injector and a checker that reads the ledger and the side-effect log.

Used by ``tests/acceptance/test_chaos.py`` (a short run in the test-suite, a long one with
``make chaos``) on the shared acceptance harness: a :class:`Stack` on a throwaway PostgreSQL
server and a private one-node RabbitMQ (so either can be restarted).

The injector picks faults from a ``random.Random(seed)``: SIGKILL of a worker's main process
or of a pool child mid-step, SIGSTOP past the lease then SIGCONT, a PostgreSQL restart, a
PostgreSQL outage timed to end steps inside it (stopped just before an in-flight step ends,
started again 0.2 to 1.2 s later: the step's record is written while the server is down), a
RabbitMQ crash (SIGKILL of the node) and restart,
duplicated doorbells, lost doorbells (jobs submitted with the doorbell off, left to the
sweeper), and garbage messages. Which process a fault hits, and when, follow the seed; the
machine's timing does not, so a failing seed reproduces the same faults in the same order.

The checker prints the figures of issue 8: jobs, faults by kind, jobs lost, illegal
transitions, stale writes accepted, recorded steps run twice, step bodies re-run (each must
be a step whose worker died or was fenced out between running it and recording it), and
recovery-time percentiles (fault to the next claim of each job the fault hit).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import random
import signal
import statistics
import time
from typing import Any

import psutil

import jobs
from jobs._core.records import Batch
from jobs._core.states import State, is_legal
from jobs.application import default_app
from tests.acceptance.conftest import PrivatePostgres, Proc, Stack, owner_pid
from tests.acceptance.rabbit_cluster import RabbitCluster

KIND = "sleep_steps"
# How long the steps of the run's jobs take (test_chaos.py submits them with these), by the
# effect each step writes to effects.log as it starts: a KIND step, a fan-out child's
# ``work`` step, a fan-out parent's ``pause-<n>`` step.
STEP_SECONDS = 0.4
CHILD_SECONDS = 0.3
SPAWN_PAUSE = 0.2
STEP_STARTS = {"sleep-": STEP_SECONDS, "work:start": CHILD_SECONDS, "pause-": SPAWN_PAUSE}


@dataclasses.dataclass
class Fault:
    kind: str
    at: float  # wall clock (time.time)
    jobs: tuple[str, ...]  # jobs the fault's process owned when it struck
    detail: str = ""


@dataclasses.dataclass
class Chaos:
    """Workers, sweepers and a fault schedule over one stack."""

    stack: Stack
    database: PrivatePostgres
    seed: int
    rabbit: RabbitCluster | None = None  # a private node: restarted as a fault too
    workers: int = 3
    lease_seconds: float = 3.0
    kinds: tuple[str, ...] = ()  # only these faults (CHAOS_FAULTS), or every kind
    faults: list[Fault] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.random = random.Random(self.seed)
        self.stack.configure(
            JOBS_LEASE_SECONDS=self.lease_seconds,
            JOBS_SWEEP_INTERVAL_SECONDS=0.5,
            JOBS_RING_AGAIN_AFTER_SECONDS=2,
        )
        self.pool: list[Proc] = []
        self._names = 0

    # -- processes ----------------------------------------------------------------------

    def start_worker(self) -> Proc:
        self._names += 1
        worker = self.stack.worker(f"W{self._names}", pool="prefork", concurrency=2, wait=False)
        self.pool.append(worker)
        return worker

    def start(self) -> None:
        for _ in range(self.workers):
            self.start_worker()
        for worker in self.pool:
            worker.wait_ready()
        for _ in range(2):
            self.stack.sweeper()

    def owned_by(self, pids: set[int]) -> tuple[str, ...]:
        return tuple(
            job.id
            for job in self.stack.store.reads.list(State.RUNNING, limit=1000)
            if job.owner and owner_pid(job.owner) in pids
        )

    # -- faults ---------------------------------------------------------------------------

    def inject(self, submitted: list[str]) -> Fault:
        weights = {
            "kill_worker": 3,
            "kill_child": 3,
            "stop_past_lease": 2,
            "restart_postgres": 1,
            "outage_at_step_end": 1,
            "restart_rabbitmq": 1 if self.rabbit is not None else 0,
            "duplicate": 2,
            "garbage": 1,
        }
        if self.kinds:
            weights = {kind: weight for kind, weight in weights.items() if kind in self.kinds}
        kind = self.random.choices(list(weights), list(weights.values()))[0]
        live = [worker for worker in self.pool if worker.alive()]
        victim = live[self.random.randrange(len(live))] if live else None
        if kind == "kill_worker" and victim is not None:
            pids = {victim.pid, *victim.pool_children()}
            owned = self.owned_by(pids)
            fault = Fault(kind, victim.kill(signal.SIGKILL), owned, victim.name)
            victim.kill_group()
            self.pool.remove(victim)
            self.start_worker()
            return self._record(fault)
        if kind == "kill_child" and victim is not None and victim.pool_children():
            children = sorted(victim.pool_children())
            child = children[self.random.randrange(len(children))]
            owned = self.owned_by({child})
            at = time.time()
            psutil.Process(child).kill()
            return self._record(Fault(kind, at, owned, f"{victim.name} child {child}"))
        if kind == "stop_past_lease" and victim is not None:
            pids = {victim.pid, *victim.pool_children()}
            owned = self.owned_by(pids)
            at = time.time()
            # A pool child may exit between the listing and the signal, and one resumed
            # before the others may be replaced by its main process: both are fine.
            for pid in pids:
                with contextlib.suppress(psutil.NoSuchProcess):
                    psutil.Process(pid).suspend()
            time.sleep(self.lease_seconds + 1.5)
            for pid in pids:
                with contextlib.suppress(psutil.NoSuchProcess):
                    psutil.Process(pid).resume()
            return self._record(Fault(kind, at, owned, victim.name))
        if kind == "restart_postgres":
            owned = self.owned_by({p for w in self.pool for p in (w.pid, *w.pool_children())})
            at = time.time()
            self.database.restart()
            jobs.reset()  # this process's pooled connections died with the server
            return self._record(Fault(kind, at, (), f"{len(owned)} jobs running"))
        if kind == "outage_at_step_end":
            return self._record(self.outage_at_step_end(self.random.uniform(0.2, 1.2)))
        if kind == "restart_rabbitmq" and self.rabbit is not None:
            owned = self.owned_by({p for w in self.pool for p in (w.pid, *w.pool_children())})
            node = self.rabbit.nodes[0]
            at = time.time()
            self.rabbit.stop_node(node)  # SIGKILL: a crash, not a shutdown
            time.sleep(self.random.uniform(0.5, 2.0))
            self.rabbit.restart_node(node)  # waits until it serves again
            return self._record(
                Fault(kind, at, (), f"down {time.time() - at:.1f}s, {len(owned)} jobs running")
            )
        if kind == "duplicate" and submitted:
            job_id = submitted[self.random.randrange(len(submitted))]
            default_app().runtime.ring_batch(
                Batch(
                    (
                        job_id,
                        job_id,
                    )
                )
            )
            return self._record(Fault(kind, time.time(), (), job_id))
        from tests.acceptance.test_delivery import hostile_messages, publish_raw  # noqa: PLC0415

        messages = hostile_messages()
        chosen = [messages[self.random.randrange(len(messages))] for _ in range(3)]
        publish_raw(self.stack, chosen)
        return self._record(Fault("garbage", time.time(), (), f"{len(chosen)} messages"))

    def steps_in_flight(self) -> dict[str, float]:
        """The steps running now: job ID -> the wall-clock instant its step ends (each step
        writes its start to ``effects.log``, then sleeps; see STEP_STARTS)."""
        path = self.stack.data_dir / "effects.log"
        now = time.time()
        ending: dict[str, float] = {}
        lines = path.read_text().splitlines() if path.exists() else []
        for line in lines[-400:]:
            parts = line.split()
            if len(parts) != 4:
                continue
            took = next((s for start, s in STEP_STARTS.items() if parts[1].startswith(start)), 0)
            end = float(parts[3].removeprefix("at=")) + took
            if took and end > now + 0.05:
                ending[parts[0]] = end
        return ending

    def outage_at_step_end(self, down_seconds: float) -> Fault:
        """Stop PostgreSQL (immediate, as a crash) just before the next in-flight step ends,
        so its record is written while the server is down, and start it ``down_seconds``
        later. The steps ending inside the outage must be recorded once (the write is held
        while the lease can be live) and never run again, unless their lease ran out."""
        ending: dict[str, float] = {}
        deadline = time.monotonic() + 5
        while not ending and time.monotonic() < deadline:
            ending = self.steps_in_flight()
            if not ending:
                time.sleep(0.02)
        if ending:
            time.sleep(max(0.0, min(ending.values()) - 0.05 - time.time()))
        at = time.time()
        self.database.stop()
        inside = tuple(job_id for job_id, end in ending.items() if end <= at + down_seconds)
        try:
            time.sleep(down_seconds)
        finally:
            self.database.start_if_stopped()
        jobs.reset()  # this process's pooled connections died with the server
        return Fault(
            "outage_at_step_end",
            at,
            inside,
            f"down {time.time() - at:.1f}s, {len(inside)} steps ending inside",
        )

    def _record(self, fault: Fault) -> Fault:
        self.faults.append(fault)
        return fault


# -- the checker ----------------------------------------------------------------------------


@dataclasses.dataclass
class Report:
    jobs: int
    faults: dict[str, int]
    lost: list[str]
    failed: list[str]
    illegal: list[str]
    stale_writes: list[str]
    recorded_reruns: list[str]
    body_reruns: int
    unexplained_reruns: list[str]
    recovery: list[float]
    # Steps that ended inside an outage_at_step_end outage, and how many of their jobs were
    # then taken from their worker (the outage outlasted what the lease allows a held
    # write: the step ran again under a new claim, as after a crash).
    ended_in_outage: int = 0
    taken_over_after_outage: int = 0

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.illegal
            or self.stale_writes
            or self.recorded_reruns
            or self.unexplained_reruns
        )

    def lines(self, seed: int) -> list[str]:
        def pct(share: float) -> str:
            if not self.recovery:
                return "-"
            ordered = sorted(self.recovery)
            return f"{ordered[min(len(ordered) - 1, int(share * len(ordered)))]:.2f}s"

        faults = ", ".join(f"{kind} {count}" for kind, count in sorted(self.faults.items()))
        return [
            f"seed {seed}",
            f"jobs {self.jobs}",
            f"faults {sum(self.faults.values())}: {faults or '-'}",
            f"jobs lost {len(self.lost)}",
            f"jobs FAILED after using up their attempts {len(self.failed)}",
            f"illegal transitions {len(self.illegal)}",
            f"stale writes accepted {len(self.stale_writes)}",
            f"recorded steps run twice {len(self.recorded_reruns)}",
            f"step bodies re-run {self.body_reruns} "
            f"(unexplained by a dead or fenced-out worker: {len(self.unexplained_reruns)})",
            f"recovery after a fault: n={len(self.recovery)} p50 {pct(0.5)} p95 {pct(0.95)} "
            f"max {pct(1.0)}"
            + (f" mean {statistics.mean(self.recovery):.2f}s" if self.recovery else ""),
            f"steps ended inside a database outage {self.ended_in_outage}, their jobs taken "
            f"over after the lease ran out {self.taken_over_after_outage}",
        ]


def check(stack: Stack, job_ids: list[str], faults: list[Fault]) -> Report:
    """Read every job's history, steps and side effects; count what must never happen."""
    lost, failed, illegal, stale, recorded_reruns, unexplained = [], [], [], [], [], []
    body_reruns = 0
    recovery: list[float] = []
    for job_id in job_ids:
        job = stack.job(job_id)
        if job.state is State.FAILED and job.attempts >= job.max_attempts:
            failed.append(f"{job_id}: {job.last_error}")
        elif job.state is not State.COMPLETED:
            lost.append(f"{job_id} {job.state.value}")
        history = stack.history(job_id)
        for move in history:
            if not is_legal(move.from_state, move.to_state):
                illegal.append(f"{job_id}: {move.from_state} -> {move.to_state}")
        claims = [t for t in history if t.to_state is State.RUNNING]
        # A write by (owner, fence) after a claim with a higher fence was made is stale.
        writes: list[tuple[str, int | None, Any]] = [
            (f"step {s.name}", s.fence, s.recorded_at) for s in stack.steps(job_id)
        ]
        writes += [
            (f"move {t.from_state}->{t.to_state}", t.fence, t.at)
            for t in history
            if t.to_state is not State.RUNNING
            and t.owner
            and t.fence is not None
            and t.reason not in ("lease expired",)
            and "died" not in (t.reason or "")
        ]
        for what, fence, at in writes:
            if fence is None:
                continue
            later = [c for c in claims if c.fence is not None and c.fence > fence and c.at < at]
            if later:
                stale.append(f"{job_id}: {what} by fence {fence} after claim {later[0].fence}")
        # Side effects: each step body's runs (process, instant) against the step's record.
        runs: dict[str, list[tuple[int, float]]] = collections.defaultdict(list)
        for effect, pid, at in stack.timed_effects(job_id):
            runs[effect].append((pid, at))
        for step in stack.steps(job_id):
            started = runs.get(step.name, [])
            recorded_at = step.recorded_at.timestamp()
            after = [pid for pid, at in started if at > recorded_at + 0.01]
            if after:
                recorded_reruns.append(f"{job_id}: {step.name} ran after its record by {after}")
            pids = [pid for pid, _at in started]
            extra = len(pids) - 1
            body_reruns += max(0, extra)
            if extra > len(claims) - 1:
                unexplained.append(f"{job_id}: {step.name} ran {len(pids)}x, {len(claims)} claims")
    for fault in faults:
        for job_id in fault.jobs:
            after = [
                t.at.timestamp()
                for t in stack.history(job_id)
                if t.to_state is State.RUNNING and t.at.timestamp() > fault.at
            ]
            if after:
                recovery.append(min(after) - fault.at)
    ended_in_outage = taken_over = 0
    for fault in faults:
        if fault.kind != "outage_at_step_end":
            continue
        ended_in_outage += len(fault.jobs)
        for job_id in fault.jobs:
            taken_over += any(
                t.at.timestamp() > fault.at
                and (t.reason == "lease expired" or "died" in (t.reason or ""))
                for t in stack.history(job_id)
            )
    counts = collections.Counter(fault.kind for fault in faults)
    return Report(
        len(job_ids),
        dict(counts),
        lost,
        failed,
        illegal,
        stale,
        recorded_reruns,
        body_reruns,
        unexplained,
        recovery,
        ended_in_outage,
        taken_over,
    )
