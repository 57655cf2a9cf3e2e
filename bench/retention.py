"""``python -m bench.retention``: how long retention holds its locks, and whether a claim
waits on it.

Fills a throwaway database with N finished one-step jobs (each with a step and three
history rows) plus live QUEUED jobs, then prunes them in the sweeper's batches while
another thread claims the live jobs one by one. Pruning runs as the sweeper runs it: a
pass of up to ``PRUNE_BATCHES_PER_PASS`` batches, then a pause (the sweep interval,
shortened to ``--pause``). Prints, per backend, the time of one batch's transaction
(median and max) and the claims' latency while pruning.

    python -m bench.retention --jobs 20000     # PostgreSQL (JOBS_TEST_POSTGRES_URL), SQLite
    python -m bench.retention --jobs 5000 --backend sqlite
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from sqlalchemy import Engine, insert

from bench.services import pg_database
from jobs._store import JobStore
from jobs._store.clock import LogicalClock
from jobs._store.db import make_engine
from jobs._store.schema import upgrade
from jobs._store.tables import JobsTable, StepsTable, TransitionsTable
from jobs._sweeper.sweeper import PRUNE_BATCH_SIZE, PRUNE_BATCHES_PER_PASS

DAY = 86400.0


def fill(engine: Engine, clock: LogicalClock, jobs: int, live: int) -> None:
    """Bulk rows, as the store would have left them (faster than running every job)."""
    old = clock.instant()
    rows, steps, moves = [], [], []
    for n in range(jobs):
        job_id = f"done-{n}"
        rows.append(
            {
                "id": job_id,
                "kind": "k",
                "state": "COMPLETED",
                "inputs": {"n": n},
                "result": "ok",
                "fence": 1,
                "attempts": 1,
                "max_attempts": 3,
                "run_after": old,
                "created_at": old,
                "updated_at": old,
                "finished_at": old,
            }
        )
        steps.append(
            {
                "job_id": job_id,
                "name": "s",
                "output": n,
                "recorded_at": old,
                "owner": "w",
                "fence": 1,
            }
        )
        for source, target in ((None, "QUEUED"), ("QUEUED", "RUNNING"), ("RUNNING", "COMPLETED")):
            moves.append({"job_id": job_id, "from_state": source, "to_state": target, "at": old})
    with engine.begin() as conn:
        for start in range(0, jobs, 5000):
            conn.execute(insert(JobsTable), rows[start : start + 5000])
            conn.execute(insert(StepsTable), steps[start : start + 5000])
            conn.execute(insert(TransitionsTable), moves[start * 3 : (start + 5000) * 3])
    store = JobStore(engine, clock=clock)
    for n in range(live):
        store.submissions.create("k", {}, job_id=f"live-{n}", max_attempts=3)


def measure(engine: Engine, jobs: int, pause: float) -> dict[str, float]:
    clock = LogicalClock()
    upgrade(engine)
    fill(engine, clock, jobs, live=2000)
    clock.advance(15 * DAY)
    store = JobStore(engine, clock=clock)
    claims: list[float] = []
    done = threading.Event()

    def claimer() -> None:
        n = 0
        while not done.is_set() and n < 2000:
            began = time.perf_counter()
            store.ownership.claim(f"live-{n}", "w", 30)
            claims.append(time.perf_counter() - began)
            n += 1

    thread = threading.Thread(target=claimer)
    thread.start()
    batches: list[float] = []
    finished = False
    while not finished:
        for _ in range(PRUNE_BATCHES_PER_PASS):
            began = time.perf_counter()
            deleted = store.schedules.prune_finished(14 * DAY, PRUNE_BATCH_SIZE)
            batches.append(time.perf_counter() - began)
            if len(deleted) < PRUNE_BATCH_SIZE:
                finished = True
                break
        time.sleep(pause)
    done.set()
    thread.join()
    return {
        "batches": len(batches),
        "batch_median_ms": statistics.median(batches) * 1000,
        "batch_max_ms": max(batches) * 1000,
        "claims_during": len(claims),
        "claim_median_ms": statistics.median(claims) * 1000 if claims else 0.0,
        "claim_max_ms": max(claims) * 1000 if claims else 0.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.retention")
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--backend", choices=["both", "postgres", "sqlite"], default="both")
    parser.add_argument("--pause", type=float, default=0.2, help="Seconds between passes.")
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    if args.backend in ("both", "sqlite"):
        with tempfile.TemporaryDirectory() as folder:
            engine = make_engine(f"sqlite:///{Path(folder) / 'retention.db'}")
            results["sqlite"] = measure(engine, args.jobs, args.pause)
            engine.dispose()
    if args.backend in ("both", "postgres"):
        admin = os.environ.get(
            "JOBS_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
        )
        with pg_database(admin) as url:
            engine = make_engine(url)
            results["postgres"] = measure(engine, args.jobs, args.pause)
            engine.dispose()
    print(
        f"{args.jobs} finished jobs; passes of {PRUNE_BATCHES_PER_PASS} batches of "
        f"{PRUNE_BATCH_SIZE}, {args.pause:g} s apart; a claim loop running alongside"
    )
    for backend, figures in results.items():
        print(
            f"{backend:<9} {figures['batches']:.0f} batches: "
            f"median {figures['batch_median_ms']:.1f} ms, max {figures['batch_max_ms']:.1f} ms; "
            f"{figures['claims_during']:.0f} claims meanwhile: "
            f"median {figures['claim_median_ms']:.1f} ms, max {figures['claim_max_ms']:.1f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
