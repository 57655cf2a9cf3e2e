"""The drain on each Celery pool, durable jobs against plain Celery with the same pool,
concurrency and settings, back to back in the same run.

- **agent-shaped**: jobs of a 100 ms model call, a 50 ms tool call and a small write, three
  recorded steps each (``bench.kinds.agent``), against a plain task that sleeps the same
  in one body (``bench.plain_app.agent``): the I/O-bound work threads and gevent pools are
  run for. Its ceiling is concurrency / 150 ms.
- **no-op**: one-step jobs against a no-op task, as the main drain (``bench.drain``), on
  the same pools.

Each drain is measured as the main one is: the queue filled while no worker of that side
runs, then a fresh worker of the pool started, and the rate timed from the 20th
completion to the last (the durable side's ``finished_at``, the plain side's marks).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import partial

from sqlalchemy import select

import jobs
from bench import kinds, plain_app
from bench.drain import FILL_BATCH, Drain, steady_rate
from bench.procs import Child
from bench.scenarios import PG_RABBITMQ, BackendRun, _base_env, _wait
from jobs._store.tables import JobsTable

# (pool, concurrency, agent-shaped jobs, no-op jobs) per drain. Celery's gevent pool with
# a prefetch of one per greenlet takes about 10-20 deliveries a second here, plain
# Celery's as ours: fewer jobs there keep the scenario within minutes.
POOLS: tuple[tuple[str, int, int, int], ...] = (
    ("threads", 50, 1000, 1000),
    ("gevent", 100, 300, 300),
    ("prefork", 20, 600, 1000),
)


class PoolDrains:
    """The pool drains of one backend run (PostgreSQL and RabbitMQ)."""

    def __init__(self, run: BackendRun) -> None:
        self.run = run
        self._started = 0

    def _worker(self, side: str, pool: str, concurrency: int) -> Child:
        run = self.run
        self._started += 1
        name = f"bench-{run.run_id}-{side}{pool}{self._started}"
        if side == "d":
            app, queue, env = (
                "jobs.celery_app",
                run.durable_queue,
                {**_base_env(), **run.durable_env},
            )
        else:
            app, queue, env = plain_app.__name__, run.plain_queue, run.plain_env
        worker = run.procs.start_worker(
            name, app, queue, concurrency, env, run.opts.loglevel, pool=pool
        )
        run.procs.wait_ready(worker)
        return worker

    def durable(self, kind: str, n: int, pool: str, concurrency: int) -> float:
        """Fill the durable queue with ``n`` jobs of ``kind``, drain them with a fresh
        worker of ``pool``; jobs/s."""
        run = self.run
        tag = f"pl{uuid.uuid4().hex[:10]}"
        for start in range(0, n, FILL_BATCH):
            count = min(FILL_BATCH, n - start)
            ids = [f"{tag}-{i:06d}" for i in range(start, start + count)]
            jobs.submit_many(kind, [{}] * count, job_ids=ids)
        worker = self._worker("d", pool, concurrency)
        try:

            def drained() -> bool:
                done, bad, _last = run._batch_state(tag)
                if bad:
                    raise RuntimeError(f"{bad} jobs of drain {tag} ended FAILED/CANCELLED")
                return done >= n

            _wait(drained, 120 + n * 0.5, f"{n} {kind} jobs to drain on {pool}", interval=0.2)
        finally:
            run.procs.stop_many([worker])
        with run.store.engine.connect() as conn:
            finished = [
                run._db_time(at)
                for at in conn.execute(
                    select(JobsTable.finished_at).where(JobsTable.id.like(f"{tag}-%"))
                ).scalars()
            ]
        return steady_rate(finished)

    def plain(self, task: str, n: int, pool: str, concurrency: int) -> float:
        """Send ``n`` plain ``task`` messages, drain them with a fresh plain worker of
        ``pool``; tasks/s."""
        run = self.run
        client = run.plain_client
        assert client is not None
        tag = f"pp{uuid.uuid4().hex[:10]}"
        with client.producer_or_acquire() as producer:
            for _ in range(n):
                client.send_task(task, args=(tag,), queue=run.plain_queue, producer=producer)
        worker = self._worker("p", pool, concurrency)
        try:

            def drained() -> bool:
                run.reader.poll()
                return len(run.reader.marks(tag, "done")) >= n

            _wait(drained, 120 + n * 0.5, f"{n} plain {task} tasks on {pool}", interval=0.2)
        finally:
            run.procs.stop_many([worker])
        return steady_rate([mark.at for mark in run.reader.marks(tag, "done")])

    def measure(self, repeat: int) -> None:
        """Every pool's agent-shaped and no-op drains, each side back to back (the order
        alternates by repeat)."""
        run = self.run
        Drain(run)._stop_workers()  # each drain's queue is consumed by its own fresh worker
        for pool, concurrency, agents, noops in POOLS:
            for label, kind, task, n in (
                ("agent-shaped", kinds.AGENT, plain_app.AGENT, agents),
                ("no-op", kinds.STEP, plain_app.NOOP, noops),
            ):
                sides: list[tuple[str, Callable[[], float]]] = [
                    ("d", partial(self.durable, kind, n, pool, concurrency)),
                    ("p", partial(self.plain, task, n, pool, concurrency)),
                ]
                if repeat % 2:
                    sides.reverse()
                rates = {side: measure() for side, measure in sides}
                metric = f"drain {label}, {pool} x{concurrency} (jobs/s)"
                run._series(metric, "jobs/s").add(rates["d"], rates["p"])
                run.say(
                    f"  {run.backend} repeat {repeat + 1}: {label} drain of {n} on {pool} "
                    f"x{concurrency}: durable {rates['d']:.0f}/s vs plain {rates['p']:.0f}/s "
                    f"({rates['d'] / rates['p']:.2f})"
                )
        # The other scenarios run on the default workers again.
        run.durable_worker = run._start_worker("d")
        run.plain_worker = run._start_worker("p")
        run.procs.wait_ready(run.durable_worker)
        run.procs.wait_ready(run.plain_worker)


def measure_pools(run: BackendRun, repeat: int) -> None:
    """The pools scenario on PostgreSQL and RabbitMQ (the embedded broker has no pools to
    compare that are worth a figure)."""
    if run.backend == PG_RABBITMQ:
        PoolDrains(run).measure(repeat)


__all__ = ["POOLS", "PoolDrains", "measure_pools"]
