"""Real processes that meet at a barrier before each move, for the claim and admission races.

Spawned (not forked) so each process builds its own engine from nothing, as separate
workers would; the barrier makes every round a true race instead of a queue.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import multiprocessing.synchronize
from collections.abc import Iterator
from contextlib import contextmanager

PROCESSES = 8

_barrier: multiprocessing.synchronize.Barrier | None = None


def _init(barrier: multiprocessing.synchronize.Barrier) -> None:
    global _barrier  # noqa: PLW0603 - one barrier per pool process
    _barrier = barrier


def meet() -> None:
    """Wait until every process of the pool is here."""
    assert _barrier is not None, "call from a racing_pool() process"
    _barrier.wait(timeout=60)


@contextmanager
def racing_pool(processes: int = PROCESSES) -> Iterator[multiprocessing.pool.Pool]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    with ctx.Pool(processes, initializer=_init, initargs=(barrier,)) as workers:
        yield workers
        workers.close()
        workers.join()
