"""An ``async def`` one-step job's drain against the sync one-step job's, on prefork and
at concurrency 50 in one process (the threads pool), back to back in the same run.

Both kinds do no work in one recorded step (``bench.kinds.STEP``, ``bench.kinds.ASYNC_STEP``),
so the difference is what the async path costs a job: its loop, and the store's calls made
in a thread of the loop's executor. Each drain is measured as the pools scenario measures
its durable side (``bench.pools.PoolDrains.durable``): the queue filled, a fresh worker of
the pool started, the rate timed from the 20th completion to the last. In the table the
"durable" column is the async kind and "plain-celery" the sync one: the ratio is async ÷
sync. (gevent is left out: Celery's gevent pool with late acknowledgement takes about 14
deliveries a second here whatever the job, see docs/benchmarks.md.)

    python -m bench --backend pg-rabbitmq --only async --repeat 3
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from bench import kinds
from bench.drain import Drain
from bench.pools import PoolDrains
from bench.scenarios import PG_RABBITMQ, BackendRun

# (pool, concurrency, jobs per drain).
POOLS: tuple[tuple[str, int, int], ...] = (
    ("prefork", 20, 1000),
    ("threads", 50, 1000),
)


def measure_async(run: BackendRun, repeat: int) -> None:
    """Each pool's async and sync one-step drains, back to back (the order alternates by
    repeat); on PostgreSQL and RabbitMQ only."""
    if run.backend != PG_RABBITMQ:
        return
    drains = PoolDrains(run)
    Drain(run)._stop_workers()  # each drain's queue is consumed by its own fresh worker
    for pool, concurrency, n in POOLS:
        sides: list[tuple[str, Callable[[], float]]] = [
            ("async", partial(drains.durable, kinds.ASYNC_STEP, n, pool, concurrency)),
            ("sync", partial(drains.durable, kinds.STEP, n, pool, concurrency)),
        ]
        if repeat % 2:
            sides.reverse()
        rates = {side: measure() for side, measure in sides}
        metric = f"drain 1-step async vs sync, {pool} x{concurrency} (jobs/s)"
        run._series(metric, "jobs/s").add(rates["async"], rates["sync"])
        run.say(
            f"  {run.backend} repeat {repeat + 1}: 1-step drain of {n} on {pool} "
            f"x{concurrency}: async {rates['async']:.0f}/s vs sync {rates['sync']:.0f}/s "
            f"(async/sync {rates['async'] / rates['sync']:.2f})"
        )
    run.durable_worker = run._start_worker("d")
    run.plain_worker = run._start_worker("p")
    run.procs.wait_ready(run.durable_worker)
    run.procs.wait_ready(run.plain_worker)


__all__ = ["POOLS", "measure_async"]
