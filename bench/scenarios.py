"""One backend's measurements: durable jobs and plain Celery side by side, interleaved.

Both sides get a real ``celery worker`` each (same concurrency, same configuration, own
queue on the same broker); the durable side also gets a sweeper, as deployed. Every
repeat measures both sides back to back, so a ratio compares figures taken seconds apart
on the same (noisy, shared) machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import random
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from celery import Celery
from sqlalchemy import func, select

import jobs
from bench import kinds, marks, plain_app
from bench.procs import Child, Processes
from bench.services import clock_offset, delete_queues, pg_database
from bench.stats import percentile
from jobs._config.settings import from_env
from jobs._core.states import State
from jobs._store import JobStore
from jobs._store.schema import upgrade
from jobs._store.tables import JobsTable
from jobs.application import default_app

Say = Callable[[str], None]
REPO = Path(__file__).resolve().parent.parent
PG_RABBITMQ = "pg-rabbitmq"
EMBEDDED = "embedded"
BACKENDS = (PG_RABBITMQ, EMBEDDED)
ENDED = (State.FAILED.value, State.CANCELLED.value)


@dataclasses.dataclass(frozen=True)
class Options:
    jobs: int = 200
    embedded_jobs: int = 10
    repeat: int = 3
    concurrency: int = 2
    samples: int = 30
    embedded_samples: int = 6
    sweep_interval: float = 2.0
    loglevel: str = "INFO"
    recovery_samples: int = 5
    drain_jobs: int = 2000
    embedded_drain_jobs: int = 300
    submit_jobs: int = 1000
    profile_jobs: int = 300
    pg_url: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672//"
    recovery: bool = True
    fanout_children: int = 1000
    redis_url: str = "redis://127.0.0.1:6379/7"
    scenarios: tuple[str, ...] = (
        "drain",
        "peer",
        "native",
        "throughput",
        "latency",
        "recovery",
        "fanout",
        "pools",
        "async",
    )


@dataclasses.dataclass
class Series:
    """One metric of one backend: a value per repeat for each side."""

    backend: str
    metric: str
    unit: str
    durable: list[float] = dataclasses.field(default_factory=list)
    plain: list[float] = dataclasses.field(default_factory=list)

    def add(self, durable: float, plain: float) -> None:
        self.durable.append(durable)
        self.plain.append(plain)


class Timeout(RuntimeError):
    pass


def _wait(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise Timeout(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """This process's JOBS_* settings for one backend (jobs.submit reads them)."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("JOBS_")}
    for key in saved:
        del os.environ[key]
    os.environ.update(values)
    default_app().reset_settings()
    jobs.reset()
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith("JOBS_")]:
            del os.environ[key]
        os.environ.update(saved)
        default_app().reset_settings()
        jobs.reset()


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBS_", "BENCH_", "CELERY_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


class BackendRun:
    """The processes, publishers and readers of one backend, and its measurements."""

    def __init__(
        self,
        backend: str,
        opts: Options,
        root: Path,
        procs: Processes,
        say: Say,
        database_url: str,
        broker_url: str,
    ) -> None:
        self.backend = backend
        self.opts = opts
        self.root = root
        self.procs = procs
        self.say = say
        self.run_id = uuid.uuid4().hex[:8]
        self.durable_queue = f"bench-{self.run_id}-durable"
        self.plain_queue = f"bench-{self.run_id}-plain"
        self.releases = root / "releases"
        self.releases.mkdir(parents=True, exist_ok=True)
        self.durable_env = {
            **kinds.worker_env(database_url, broker_url, root / "durable", self.durable_queue),
            "JOBS_SWEEP_INTERVAL_SECONDS": str(opts.sweep_interval),
        }
        self.marks_path = root / "plain-marks.log"
        self.reader = marks.MarkReader(self.marks_path)
        self.offset = 0.0
        self._workers: dict[str, int] = {"d": 0, "p": 0, "u": 0, "m": 0}
        self.durable_worker: Child | None = None
        self.plain_worker: Child | None = None
        self.plain_client: Celery | None = None
        self.plain_env: dict[str, str] = {}
        self.series: dict[str, Series] = {}
        self._holds: list[Path] = []
        self.recoveries: list[tuple[float, float]] = []
        embedded = backend == EMBEDDED
        self.samples = opts.embedded_samples if embedded else opts.samples
        self.jobs = opts.embedded_jobs if embedded else opts.jobs

    # -- set-up ----------------------------------------------------------------------

    @property
    def store(self) -> JobStore:
        return default_app().runtime.store

    def _plain_setup(self) -> None:
        from jobs._worker.celery_setup import celery_config  # noqa: PLC0415 - after JOBS_* are set

        settings = from_env(
            {
                "JOBS_DATA_DIR": str(self.root / "plain"),
                "JOBS_BROKER_URL": self.durable_env["JOBS_BROKER_URL"],
                "JOBS_QUEUE": self.plain_queue,
            }
        )
        config = celery_config(settings)  # exactly the durable side's settings
        self.plain_env = {
            **_base_env(),
            plain_app.CONFIG_ENV: json.dumps(plain_app.as_json(config)),
            marks.ENV: str(self.marks_path),
        }
        client = Celery("bench_plain_client", set_as_current=False)
        client.conf.update(config)
        self.plain_client = client

    def _start_worker(self, side: str) -> Child:
        """A worker of one side: ``d`` durable (``jobs.celery_app``), ``p`` plain, ``u`` the
        durable queue on a user's app with durable jobs installed (``bench.user_app``), ``m``
        that app as a mixed worker on the plain queue and the durable one."""
        self._workers[side] += 1
        name = f"bench-{self.run_id}-{side}{self._workers[side]}"
        if side in ("u", "m"):
            queues = (
                self.durable_queue if side == "u" else f"{self.plain_queue},{self.durable_queue}"
            )
            return self.procs.start_worker(
                name,
                "bench.user_app",
                queues,
                self.opts.concurrency,
                {**self.plain_env, **self.durable_env},
                self.opts.loglevel,
            )
        if side == "d":
            env = {**_base_env(), **self.durable_env}
            return self.procs.start_worker(
                name,
                "jobs.celery_app",
                self.durable_queue,
                self.opts.concurrency,
                env,
                self.opts.loglevel,
            )
        return self.procs.start_worker(
            name,
            plain_app.__name__,
            self.plain_queue,
            self.opts.concurrency,
            self.plain_env,
            self.opts.loglevel,
        )

    def start(self) -> None:
        if self.backend == PG_RABBITMQ:
            from jobs._store.db import make_engine  # noqa: PLC0415

            upgrade(make_engine(self.durable_env["JOBS_DATABASE_URL"]))
        self.offset = clock_offset(self.store.engine)
        self.say(
            f"{self.backend}: database clock - local clock = {self.offset * 1e3:+.2f} ms "
            "(subtracted from database times)"
        )
        self._plain_setup()
        self.procs.start(
            f"bench-{self.run_id}-sweeper",
            [sys.executable, "-m", "jobs", "sweeper"],
            {**_base_env(), **self.durable_env},
        )
        self.durable_worker = self._start_worker("d")
        self.plain_worker = self._start_worker("p")
        self.procs.wait_ready(self.durable_worker)
        self.procs.wait_ready(self.plain_worker)

    def _release(self) -> Path:
        """A file whose creation ends a hold job or task (all are created at the end)."""
        path = self.releases / uuid.uuid4().hex
        self._holds.append(path)
        return path

    def stop(self) -> None:
        for path in self._holds:
            path.touch()
        self.procs.stop_many([c for c in self.procs.children if self.run_id in c.name])
        if self.backend == PG_RABBITMQ and self.plain_client is not None:
            with contextlib.suppress(Exception):
                delete_queues(self.plain_client, [self.durable_queue, self.plain_queue])
        if self.plain_client is not None:
            self.plain_client.close()
        with contextlib.suppress(Exception):
            from jobs.application import default_app  # noqa: PLC0415

            default_app().celery.close()

    # -- helpers ---------------------------------------------------------------------

    def _series(self, metric: str, unit: str) -> Series:
        if metric not in self.series:
            self.series[metric] = Series(self.backend, metric, unit)
        return self.series[metric]

    def _db_time(self, instant: dt.datetime | None) -> float:
        """A database instant as this host's ``time.time()``."""
        assert instant is not None
        return instant.timestamp() - self.offset

    def _batch_state(self, tag: str) -> tuple[int, int, float | None]:
        """(completed, ended otherwise, last finished_at) of the jobs whose IDs start with tag."""
        J = JobsTable
        with self.store.engine.connect() as conn:
            rows = conn.execute(
                select(J.state, func.count(), func.max(J.finished_at))
                .where(J.id.like(f"{tag}-%"))
                .group_by(J.state)
            ).all()
        done, bad, last = 0, 0, None
        for state, count, finished in rows:
            if state == State.COMPLETED.value:
                done, last = int(count), finished
            elif state in ENDED:
                bad += int(count)
        if isinstance(last, str):  # SQLite aggregates lose the column type
            last = dt.datetime.fromisoformat(last).replace(tzinfo=dt.UTC)
        return done, bad, (None if last is None else self._db_time(last))

    def _timeout(self, n: int) -> float:
        return 60.0 + n * 0.5

    # -- durable side ----------------------------------------------------------------

    def durable_batch(self, kind: str, n: int) -> tuple[float, list[float]]:
        """Submit n jobs through jobs.submit; (jobs/s until the last is COMPLETED, submit
        latencies in seconds)."""
        tag = f"{kind.replace('_', '')}{uuid.uuid4().hex[:10]}"
        latencies = []
        start = time.time()
        for i in range(n):
            t = time.perf_counter()
            jobs.submit(kind, job_id=f"{tag}-{i:06d}")
            latencies.append(time.perf_counter() - t)
        state: list[tuple[int, int, float | None]] = []

        def finished() -> bool:
            state[:] = [self._batch_state(tag)]
            done, bad, _ = state[0]
            if bad:
                raise RuntimeError(f"{bad} {kind} job(s) of batch {tag} ended FAILED/CANCELLED")
            return done >= n

        _wait(finished, self._timeout(n), f"{n} {kind} jobs to complete")
        last = state[0][2]
        assert last is not None
        return n / (last - start), latencies

    def durable_e2e(self, kind: str) -> tuple[float, float]:
        """One job alone: (submit seconds, submit → COMPLETED seconds)."""
        job_id = f"e2e{uuid.uuid4().hex}"
        start = time.time()
        t = time.perf_counter()
        jobs.submit(kind, job_id=job_id)
        submit = time.perf_counter() - t
        job: list[jobs.Job] = []

        def completed() -> bool:
            job[:] = [self.store.reads.get(job_id)]
            if job[0].state.value in ENDED:
                raise RuntimeError(f"job {job_id} ended {job[0].state.value}")
            return job[0].state is State.COMPLETED

        _wait(completed, 60, f"job {job_id} to complete", interval=0.005)
        return submit, self._db_time(job[0].finished_at) - start

    # -- plain side ------------------------------------------------------------------

    def plain_batch(self, n: int) -> tuple[float, list[float]]:
        assert self.plain_client is not None
        tag = f"noop{uuid.uuid4().hex[:10]}"
        latencies = []
        start = time.time()
        for _ in range(n):
            t = time.perf_counter()
            self.plain_client.send_task(plain_app.NOOP, args=(tag,), queue=self.plain_queue)
            latencies.append(time.perf_counter() - t)

        def finished() -> bool:
            self.reader.poll()
            return len(self.reader.marks(tag, "done")) >= n

        _wait(finished, self._timeout(n), f"{n} plain tasks to run")
        last = max(m.at for m in self.reader.marks(tag, "done"))
        return n / (last - start), latencies

    def plain_e2e(self) -> tuple[float, float]:
        assert self.plain_client is not None
        tag = f"e2e{uuid.uuid4().hex[:12]}"
        start = time.time()
        t = time.perf_counter()
        self.plain_client.send_task(plain_app.NOOP, args=(tag,), queue=self.plain_queue)
        submit = time.perf_counter() - t

        def ran() -> bool:
            self.reader.poll()
            return bool(self.reader.marks(tag, "done"))

        _wait(ran, 60, f"plain task {tag} to run", interval=0.005)
        return submit, self.reader.marks(tag, "done")[0].at - start

    # -- the measurements ------------------------------------------------------------

    def warm_up(self) -> None:
        """Fill every pool process's caches and connections before anything is timed."""
        # The filesystem transport hands a worker `concurrency` messages per 1 s poll.
        n = self.opts.concurrency * (1 if self.backend == EMBEDDED else 8)
        self.durable_batch(kinds.STEP, n)
        self.durable_batch(kinds.ZERO, n)
        self.plain_batch(n)
        self.durable_e2e(kinds.STEP)
        self.plain_e2e()

    def throughput(self, repeat: int) -> None:
        n = self.jobs
        results: dict[str, tuple[float, list[float]]] = {}
        rounds: list[tuple[str, Callable[[], tuple[float, list[float]]]]] = [
            ("plain", lambda: self.plain_batch(n)),
            ("step", lambda: self.durable_batch(kinds.STEP, n)),
            ("zero", lambda: self.durable_batch(kinds.ZERO, n)),
        ]
        if repeat % 2:
            rounds.reverse()
        for name, measure in rounds:
            time.sleep(0.3)  # let the previous round's acks and events drain
            results[name] = measure()
        plain_rate, plain_lat = results["plain"]
        step_rate, step_lat = results["step"]
        zero_rate, zero_lat = results["zero"]
        self._series("throughput 1-step (jobs/s)", "jobs/s").add(step_rate, plain_rate)
        self._series("throughput 0-step (jobs/s)", "jobs/s").add(zero_rate, plain_rate)
        busy = step_lat + zero_lat
        self._series("submit p50, busy (ms)", "ms").add(
            percentile(busy, 50) * 1e3, percentile(plain_lat, 50) * 1e3
        )
        self.say(
            f"  {self.backend} repeat {repeat + 1}: {n} jobs: plain {plain_rate:.1f}/s, "
            f"1-step {step_rate:.1f}/s, 0-step {zero_rate:.1f}/s"
        )

    def drain(self, repeat: int) -> None:
        """The steady-state drain (bench.drain) of 1-step and 3-step jobs vs a no-op task,
        then (PostgreSQL) submit rates and the in-process profile of a job's time."""
        from bench.drain import Drain, submit_rates  # noqa: PLC0415
        from bench.profile import profile_jobs  # noqa: PLC0415

        embedded = self.backend == EMBEDDED
        n = self.opts.embedded_drain_jobs if embedded else self.opts.drain_jobs
        drain = Drain(self)
        plain = drain.plain(n)
        for kind, label in ((kinds.STEP, "1-step"), (kinds.THREE, "3-step")):
            durable = drain.durable(kind, n)
            self._series(f"drain {label} (jobs/s)", "jobs/s").add(durable["rate"], plain["rate"])
            self.say(
                f"  {self.backend} repeat {repeat + 1}: drain of {n} {label} jobs "
                f"{durable['rate']:.0f}/s vs plain {plain['rate']:.0f}/s"
            )
            if label == "1-step":
                self._series("worker memory RSS (MiB)", "MiB").add(durable["rss"], plain["rss"])
                self._series("worker memory PSS (MiB)", "MiB").add(durable["pss"], plain["pss"])
            if "xids" in durable:
                nan = float("nan")
                self._series(f"write txns/job {label}", "n").add(durable["writers"], nan)
                self._series(f"xids/job {label} (cluster)", "n").add(durable["xids"], nan)
        if embedded:
            return
        rates = submit_rates(self, self.opts.submit_jobs)
        self._series("submit single (jobs/s)", "jobs/s").add(*rates["single"])
        self._series("submit single, confirmed", "jobs/s").add(*rates["single, confirms awaited"])
        self._series("submit bulk (jobs/s)", "jobs/s").add(*rates["bulk"])
        # Where a job's time goes: a worker process's time per job in the drain (durable)
        # or per task (plain: Celery itself), then the in-process run split by store call.
        profile = profile_jobs(
            self.durable_env["JOBS_DATABASE_URL"], kinds.STEP, self.opts.profile_jobs
        )
        nan = float("nan")
        per_job = self.opts.concurrency / self.series["drain 1-step (jobs/s)"].durable[-1] * 1e3
        per_task = self.opts.concurrency / plain["rate"] * 1e3
        self._series("per job: worker time (ms)", "ms").add(per_job, per_task)
        self._series("round trips/job 1-step", "n").add(profile["round trips"], nan)
        for part in ("claim", "record_steps", "complete", "runner python"):
            self._series(f"per job: {part} (ms)", "ms").add(profile[f"{part} ms"], nan)

    def peer(self, repeat: int) -> None:
        """Our 1-step drain back to back with procrastinate's (:mod:`bench.peer`): the same
        number of one-step jobs, the same number of worker processes, the same PostgreSQL
        server (procrastinate in a database of its own); the order alternates by repeat."""
        from bench import peer  # noqa: PLC0415
        from bench.drain import Drain  # noqa: PLC0415

        if self.backend != PG_RABBITMQ:
            return
        n = self.opts.drain_jobs
        drain = Drain(self)
        rates: dict[str, float] = {}
        sides: list[tuple[str, Callable[[], dict[str, float]]]] = [
            ("ours", lambda: drain.durable(kinds.STEP, n)),
            ("peer", lambda: peer.drain(self, n)),
        ]
        if repeat % 2:
            sides.reverse()
        for side, measure in sides:
            rates[side] = measure()["rate"]
        self._series("drain 1-step ÷ procrastinate", "jobs/s").add(rates["ours"], rates["peer"])
        self.say(
            f"  {self.backend} repeat {repeat + 1}: drain of {n} 1-step jobs "
            f"{rates['ours']:.0f}/s vs procrastinate {rates['peer']:.0f}/s "
            f"({rates['ours'] / rates['peer']:.2f})"
        )

    def native(self, repeat: int) -> None:
        """Durable jobs installed on a user's own Celery app (issue 14), back to back with
        the same drains on the dedicated app: the 1-step drain on ``bench.user_app`` against
        ``jobs.celery_app``, and plain no-op tasks on a mixed worker (the user's app
        consuming the plain queue and the durable one) against the plain worker."""
        from bench.drain import Drain  # noqa: PLC0415

        if self.backend != PG_RABBITMQ:
            return
        n = self.opts.drain_jobs
        drain = Drain(self)
        own = drain.durable(kinds.STEP, n)
        installed = drain.durable(kinds.STEP, n, side="u")
        self._series("drain 1-step, user's app ÷ jobs.celery_app", "jobs/s").add(
            installed["rate"], own["rate"]
        )
        plain = drain.plain(n)
        mixed = drain.plain(n, side="m")
        self._series("plain tasks, mixed worker ÷ plain worker", "tasks/s").add(
            mixed["rate"], plain["rate"]
        )
        # The other scenarios run on the dedicated apps' workers again.
        drain._stop_workers()
        self.durable_worker = self._start_worker("d")
        self.plain_worker = self._start_worker("p")
        self.procs.wait_ready(self.durable_worker)
        self.procs.wait_ready(self.plain_worker)
        self.say(
            f"  {self.backend} repeat {repeat + 1}: 1-step drain {installed['rate']:.0f}/s on a "
            f"user's app vs {own['rate']:.0f}/s; plain tasks {mixed['rate']:.0f}/s on a mixed "
            f"worker vs {plain['rate']:.0f}/s"
        )

    def fanout(self, repeat: int) -> None:
        """A parent mapping N one-step children vs a chord of N no-op tasks (bench.fanout;
        PostgreSQL and RabbitMQ only: the chord needs its Redis result backend)."""
        from bench.fanout import FanOut  # noqa: PLC0415

        if self.backend != PG_RABBITMQ:
            return
        n = self.opts.fanout_children
        got = FanOut(self, self.opts.redis_url).measure(n, repeat)
        nan = float("nan")
        self._series(f"fan-out {n} children (s)", "s").add(got["seconds"], got["plain"])
        self._series("fan-out write txns/child", "n").add(got["writes"], nan)
        self._series("fan-out polls while parked", "n").add(got["polls"], nan)
        self.say(
            f"  {self.backend} repeat {repeat + 1}: fan-out of {n}: durable "
            f"{got['seconds']:.2f} s vs chord {got['plain']:.2f} s; "
            f"{got['writes']:.2f} write txns/child; parent claimed {got['claims']:.0f} times, "
            f"touched {got['polls']:.0f} times while parked"
        )

    def pools(self, repeat: int) -> None:
        """The drain on each Celery pool against plain Celery's (bench.pools)."""
        from bench.pools import measure_pools  # noqa: PLC0415 - it imports this module

        measure_pools(self, repeat)

    def async_(self, repeat: int) -> None:
        """The async one-step job's drain against the sync one's (bench.async_drain)."""
        from bench.async_drain import measure_async  # noqa: PLC0415 - it imports this module

        measure_async(self, repeat)

    def latency(self, repeat: int) -> None:
        d_sub: list[float] = []
        d_e2e: list[float] = []
        p_sub: list[float] = []
        p_e2e: list[float] = []
        for i in range(self.samples):
            pair: list[tuple[str, Callable[[], tuple[float, float]]]] = [
                ("d", lambda: self.durable_e2e(kinds.STEP)),
                ("p", self.plain_e2e),
            ]
            if (i + repeat) % 2:
                pair.reverse()
            for side, measure in pair:
                if self.backend == EMBEDDED:
                    # The filesystem transport polls the folder: start every sample at a
                    # random phase of the polls, or a sample sent right after the other
                    # side's completion locks onto that worker's poll phase.
                    time.sleep(random.uniform(0, 1.0))
                submit, e2e = measure()
                (d_sub if side == "d" else p_sub).append(submit)
                (d_e2e if side == "d" else p_e2e).append(e2e)
        for q in (50, 95):
            self._series(f"submit p{q} (ms)", "ms").add(
                percentile(d_sub, q) * 1e3, percentile(p_sub, q) * 1e3
            )
        for q in (50, 95):
            self._series(f"end-to-end p{q} (ms)", "ms").add(
                percentile(d_e2e, q) * 1e3, percentile(p_e2e, q) * 1e3
            )
        self.say(
            f"  {self.backend} repeat {repeat + 1}: {self.samples} single jobs: end-to-end "
            f"p50 durable {percentile(d_e2e, 50) * 1e3:.1f} ms, "
            f"plain {percentile(p_e2e, 50) * 1e3:.1f} ms"
        )

    def recovery(self, repeat: int) -> None:
        order = [self._durable_recovery, self._plain_recovery]
        if repeat % 2:
            order.reverse()
        values = {}
        for measure in order:
            side, seconds = measure()
            values[side] = seconds
        self._series("recovery after SIGKILL (s)", "s").add(values["d"], values["p"])
        self.recoveries.append((values["d"], values["p"]))
        self.say(
            f"  {self.backend} repeat {repeat + 1}: recovery durable {values['d']:.3f} s, "
            f"plain {values['p']:.3f} s"
        )

    def _durable_recovery(self) -> tuple[str, float]:
        """Kill the worker running a job; time until another worker's claim (RUNNING)."""
        victim = self.durable_worker
        assert victim is not None
        release = self._release()
        job_id = jobs.submit(kinds.HOLD, {"release": str(release)})

        def running_on(worker: Child) -> Callable[[], bool]:
            def check() -> bool:
                job = self.store.reads.get(job_id)
                return job.state is State.RUNNING and (job.owner or "").startswith(
                    f"{worker.hostname}@"
                )

            return check

        _wait(running_on(victim), 60, f"job {job_id} to run on {victim.name}")
        rescuer = self._start_worker("d")
        self.procs.wait_ready(rescuer)
        killed = self.procs.kill(victim)
        limit = self.store.reads.get(job_id).lease_until
        _wait(
            running_on(rescuer),
            self.opts.sweep_interval + 90,
            f"job {job_id} to run on {rescuer.name} (lease until {limit})",
        )
        claimed = next(
            move.at for move in reversed(jobs.history(job_id)) if move.to_state is State.RUNNING
        )
        release.touch()
        _wait(
            lambda: self.store.reads.get(job_id).state is State.COMPLETED,
            60,
            f"job {job_id} to complete",
        )
        self.durable_worker = rescuer
        return "d", self._db_time(claimed) - killed

    def _plain_recovery(self) -> tuple[str, float]:
        """Kill the worker running a task; time until it starts again on another worker."""
        assert self.plain_client is not None
        victim = self.plain_worker
        assert victim is not None
        release = self._release()
        tag = f"hold{uuid.uuid4().hex[:12]}"
        self.plain_client.send_task(
            plain_app.HOLD, args=(tag, str(release)), queue=self.plain_queue
        )

        def started_on(worker: Child) -> Callable[[], bool]:
            def check() -> bool:
                self.reader.poll()
                return any(
                    m.host.startswith(f"{worker.hostname}@")
                    for m in self.reader.marks(tag, "start")
                )

            return check

        _wait(started_on(victim), 60, f"plain task {tag} to start on {victim.name}")
        rescuer = self._start_worker("p")
        self.procs.wait_ready(rescuer)
        killed = self.procs.kill(victim)
        _wait(started_on(rescuer), 90, f"plain task {tag} to start again on {rescuer.name}")
        started = next(
            m.at
            for m in self.reader.marks(tag, "start")
            if m.host.startswith(f"{rescuer.hostname}@")
        )
        release.touch()

        def done() -> bool:
            self.reader.poll()
            return bool(self.reader.marks(tag, "done"))

        _wait(done, 60, f"plain task {tag} to finish")
        self.plain_worker = rescuer
        return "p", started - killed


def run_backend(
    backend: str, opts: Options, root: Path, procs: Processes, say: Say
) -> list[Series]:
    """Measure one backend; every process it started is stopped and its database dropped
    before this returns or raises."""
    with contextlib.ExitStack() as stack:
        if backend == PG_RABBITMQ:
            database_url = stack.enter_context(pg_database(opts.pg_url))
            broker_url = opts.amqp_url
        else:
            database_url = f"sqlite:///{root / 'durable' / 'jobs.sqlite3'}"
            broker_url = "filesystem://"
        run = BackendRun(backend, opts, root, procs, say, database_url, broker_url)
        stack.enter_context(_environ(run.durable_env))
        stack.callback(run.stop)
        say(
            f"{backend}: starting workers (durable: jobs.celery_app + bench.kinds + sweeper; "
            f"plain: bench.plain_app), concurrency {opts.concurrency}, {run.jobs} jobs per "
            f"batch, {run.samples} single jobs per repeat"
        )
        run.start()
        run.warm_up()
        repeated = ("drain", "peer", "native", "throughput", "latency", "fanout", "pools", "async")
        for r in range(opts.repeat):
            for scenario in repeated:
                if scenario in opts.scenarios:
                    getattr(run, "async_" if scenario == "async" else scenario)(r)
        if opts.recovery and "recovery" in opts.scenarios and backend == PG_RABBITMQ:
            for r in range(max(opts.repeat, opts.recovery_samples)):
                run.recovery(r)
            for q in (50, 99):
                run._series(f"recovery p{q} (s)", "s").add(
                    percentile([d for d, _ in run.recoveries], q),
                    percentile([p for _, p in run.recoveries], q),
                )
        return list(run.series.values())
    raise AssertionError("unreachable")  # pragma: no cover - the with block returns


def describe(series: list[Series]) -> list[dict[str, Any]]:
    from bench.stats import median, ratio  # noqa: PLC0415

    rows = []
    for s in series:
        ratios = [ratio(d, p) for d, p in zip(s.durable, s.plain, strict=True)]
        rows.append(
            {
                "backend": s.backend,
                "metric": s.metric,
                "unit": s.unit,
                "durable": median(s.durable),
                "plain": median(s.plain),
                "ratio": median(ratios),
                "durable_runs": s.durable,
                "plain_runs": s.plain,
                "ratio_runs": ratios,
            }
        )
    return rows
