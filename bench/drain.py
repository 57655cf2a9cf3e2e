"""The steady-state drain: how fast a worker empties a full queue, durable vs plain Celery.

Measured as a user meets it: the queue is filled while its workers are stopped (durable:
``jobs.submit_many``, doorbells published; plain: ``send_task`` of a no-op task), then a
fresh worker with the same settings and concurrency starts, and the rate is timed from
the 20th completion to the last, so neither the fill nor the worker's start-up counts.
After the drain the worker's memory (main process and pool children) is read, and on
PostgreSQL the write transactions each job cost.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence

from sqlalchemy import func, select, text

import jobs
from bench import plain_app
from bench.procs import Child
from bench.scenarios import PG_RABBITMQ, BackendRun, _wait
from jobs._store.tables import JobsTable
from jobs.application import default_app

SKIP = 20  # completions before the timing starts: the worker is up and warm by then
FILL_BATCH = 1000


def steady_rate(finished: Sequence[float]) -> float:
    """Completions per second from the ``SKIP``-th completion to the last."""
    times = sorted(finished)
    if len(times) <= SKIP + 1:
        raise ValueError(f"a drain needs more than {SKIP + 1} completions, got {len(times)}")
    span = times[-1] - times[SKIP - 1]
    return (len(times) - SKIP) / span if span > 0 else float("inf")


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listing:
            return [int(child) for child in listing.read().split()]
    except OSError:
        return []


def _memory_kib(pid: int, field: str) -> int:
    """``VmRSS`` from /proc/PID/status or ``Pss`` from /proc/PID/smaps_rollup, in KiB."""
    path = f"/proc/{pid}/status" if field == "VmRSS" else f"/proc/{pid}/smaps_rollup"
    try:
        with open(path) as info:
            for line in info:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def worker_memory_mib(worker: Child) -> tuple[float, float]:
    """(RSS, PSS) in MiB of a worker's main process and its pool children together. RSS
    counts pages shared after the fork once per process, PSS shares them out."""
    pids = [worker.pid, *_children(worker.pid)]
    rss = sum(_memory_kib(pid, "VmRSS") for pid in pids)
    pss = sum(_memory_kib(pid, "Pss") for pid in pids)
    return rss / 1024, pss / 1024


def transaction_id_horizon(run: BackendRun) -> int:
    """PostgreSQL's next transaction ID (cluster-wide: other databases' writes count too)."""
    with run.store.engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
            ).scalar_one()
        )


def writers_per_job(run: BackendRun, tag: str) -> float:
    """Distinct transaction IDs stamped on the batch's history and step rows, per job:
    exact for this database (a lease renewal, which writes no such row, is not counted)."""
    with run.store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT count(DISTINCT x) FROM (SELECT xmin::text AS x FROM job_transitions "
                "WHERE job_id LIKE :tag UNION ALL SELECT xmin::text FROM job_steps "
                "WHERE job_id LIKE :tag) AS writers"
            ),
            {"tag": f"{tag}-%"},
        ).scalar_one()
        jobs_in_batch = conn.execute(
            select(func.count()).select_from(JobsTable).where(JobsTable.id.like(f"{tag}-%"))
        ).scalar_one()
    return int(rows) / max(1, int(jobs_in_batch))


class Drain:
    """The drain measurements of one backend run."""

    def __init__(self, run: BackendRun) -> None:
        self.run = run

    def _restart(self, side: str) -> Child:
        worker = self.run._start_worker(side)
        self.run.procs.wait_ready(worker)
        return worker

    def _stop_workers(self) -> None:
        """Stop both sides' workers: a drain's queue is consumed by its own fresh one only."""
        run = self.run
        running = [w for w in (run.durable_worker, run.plain_worker) if w is not None]
        run.procs.stop_many(running)
        run.durable_worker = run.plain_worker = None

    def durable(self, kind: str, n: int, side: str = "d") -> dict[str, float]:
        """Fill the durable queue with ``n`` jobs, then time a fresh worker of ``side``
        (``d``: ``jobs.celery_app``; ``u``: a user's app with durable jobs installed)."""
        run = self.run
        old = run.durable_worker
        if old is not None:
            run.procs.stop_many([old])
        if side != "d" and run.plain_worker is not None:
            self._stop_workers()
        tag = f"dr{uuid.uuid4().hex[:10]}"
        xid_before = transaction_id_horizon(run) if run.backend == PG_RABBITMQ else 0
        for start in range(0, n, FILL_BATCH):
            count = min(FILL_BATCH, n - start)
            jobs.submit_many(
                kind, [{}] * count, job_ids=[f"{tag}-{i:06d}" for i in range(start, start + count)]
            )
        run.durable_worker = self._restart(side)
        finished: list[float] = []

        def drained() -> bool:
            done, bad, _last = run._batch_state(tag)
            if bad:
                raise RuntimeError(f"{bad} jobs of drain {tag} ended FAILED/CANCELLED")
            return done >= n

        _wait(drained, 60 + n * 0.2, f"{n} {kind} jobs to drain", interval=0.2)
        J = JobsTable
        with run.store.engine.connect() as conn:
            finished = [
                run._db_time(at)
                for at in conn.execute(select(J.finished_at).where(J.id.like(f"{tag}-%"))).scalars()
            ]
        result = {"rate": steady_rate(finished)}
        rss, pss = worker_memory_mib(run.durable_worker)
        result.update(rss=rss, pss=pss)
        if run.backend == PG_RABBITMQ:
            result["xids"] = (transaction_id_horizon(run) - xid_before) / n
            result["writers"] = writers_per_job(run, tag)
        return result

    def plain(self, n: int, side: str = "p") -> dict[str, float]:
        """Fill the plain queue with ``n`` no-op tasks, then time a fresh worker of ``side``
        (``p``: the plain app; ``m``: a user's app with durable jobs, also consuming the
        durable queue)."""
        run = self.run
        assert run.plain_client is not None
        if side == "m":
            self._stop_workers()
        old = run.plain_worker
        if old is not None:
            run.procs.stop_many([old])
        tag = f"drain{uuid.uuid4().hex[:10]}"
        with run.plain_client.producer_or_acquire() as producer:
            for _ in range(n):
                run.plain_client.send_task(
                    plain_app.NOOP, args=(tag,), queue=run.plain_queue, producer=producer
                )
        run.plain_worker = self._restart(side)

        def drained() -> bool:
            run.reader.poll()
            return len(run.reader.marks(tag, "done")) >= n

        _wait(drained, 60 + n * 0.2, f"{n} plain tasks to drain", interval=0.2)
        result = {"rate": steady_rate([m.at for m in run.reader.marks(tag, "done")])}
        rss, pss = worker_memory_mib(run.plain_worker)
        result.update(rss=rss, pss=pss)
        return result


SUBMIT_MODES = ("single", "single, confirms awaited", "bulk")


def _submit_durable(mode: str, ids: list[str]) -> float:
    """Submits/s of ``ids`` through ``jobs.submit`` (one by one) or ``jobs.submit_many``;
    "confirms awaited" runs with ``JOBS_DOORBELL_CONFIRMS=wait`` (each submit returns once
    RabbitMQ confirmed its doorbell), the others with the default (read in the background;
    the time includes reading the last ones)."""
    saved = os.environ.get("JOBS_DOORBELL_CONFIRMS")
    os.environ["JOBS_DOORBELL_CONFIRMS"] = "wait" if "awaited" in mode else "background"
    default_app().reset_settings()
    default_app().reset()
    try:
        started = time.perf_counter()
        if mode == "bulk":
            jobs.submit_many("bench_zero", [{}] * len(ids), job_ids=ids)
        else:
            for job_id in ids:
                jobs.submit("bench_zero", job_id=job_id)
        flush = getattr(default_app().runtime.ringer, "flush", None)
        if callable(flush):
            flush()
        return len(ids) / (time.perf_counter() - started)
    finally:
        if saved is None:
            os.environ.pop("JOBS_DOORBELL_CONFIRMS", None)
        else:
            os.environ["JOBS_DOORBELL_CONFIRMS"] = saved
        default_app().reset_settings()
        default_app().reset()


def submit_rates(run: BackendRun, n: int) -> dict[str, tuple[float, float]]:
    """(durable, plain) submits/s, doorbells published, with the workers running:
    ``n`` single ``jobs.submit`` (doorbell confirmations read in the background, the
    default, and awaited one by one) vs ``n`` single ``send_task`` (confirmed), and one
    ``jobs.submit_many`` of ``n`` vs ``n`` publishes on one producer. Each batch drains
    before the next."""
    assert run.plain_client is not None
    client = run.plain_client
    rates: dict[str, tuple[float, float]] = {}
    for mode in SUBMIT_MODES:
        tag = f"sub{uuid.uuid4().hex[:10]}"
        ids = [f"{tag}-{i:06d}" for i in range(n)]
        durable = _submit_durable(mode, ids)
        plain_tag = f"noop{uuid.uuid4().hex[:10]}"
        started = time.perf_counter()
        if mode != "bulk":
            for _ in range(n):
                client.send_task(plain_app.NOOP, args=(plain_tag,), queue=run.plain_queue)
        else:
            with client.producer_or_acquire() as producer:
                for _ in range(n):
                    client.send_task(
                        plain_app.NOOP,
                        args=(plain_tag,),
                        queue=run.plain_queue,
                        producer=producer,
                    )
        plain = n / (time.perf_counter() - started)
        rates[mode] = (durable, plain)

        def drained(tag: str = tag, plain_tag: str = plain_tag) -> bool:
            run.reader.poll()
            return run._batch_state(tag)[0] >= n and len(run.reader.marks(plain_tag, "done")) >= n

        _wait(drained, 60 + n * 0.2, f"{n} submitted jobs and tasks to run", interval=0.2)
    return rates


__all__ = ["Drain", "steady_rate", "submit_rates", "worker_memory_mib"]
