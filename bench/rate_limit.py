"""What global rate limits cost and how close they keep to the rate (issue 27 part 2),
measured in one run:

1. the claim of a kind with no rate limit, before the feature (the branch's base commit,
   exported to a scratch folder) and after it, back to back, each side in a process of
   its own on a fresh database, taking turns over several rounds (as bench/per_key.py, with
   bench/claim_cost.py's loop);
2. the accuracy of ``rate_limit="20/s"`` on 2 real prefork workers: 300 one-step jobs
   queued at once, the starts read from their history (the claims, on the database's
   clock), and the starts per second over every 5 s window of the drain (slid by 0.5 s).

    python -m bench.rate_limit [--claims 2000] [--rounds 3] [--rate 20/s] [--jobs 300]
        [--workers 2] [--concurrency 4] [--base 3bf43d4] [--pg-url …] [--amqp-url …]

A server is needed (PostgreSQL and RabbitMQ; each database made here is dropped at the end).
"""

from __future__ import annotations

import argparse
import math
import tempfile
import uuid
from pathlib import Path

from sqlalchemy import select

import jobs
from bench import kinds
from bench.claim_cost import (
    AFTER,
    BEFORE,
    bench_app,
    bench_parser,
    compare_claims,
    start_workers,
)
from bench.procs import Processes
from bench.scenarios import REPO, _wait
from bench.services import pg_database
from bench.stats import median
from jobs._core.rate_syntax import parse_rate
from jobs._core.states import State
from jobs._store.tables import JobsTable, TransitionsTable

#: The window the accuracy is read over, and the step it slides by (seconds).
WINDOW = 5.0
SLIDE = 0.5


def window_rates(starts: list[float], window: float = WINDOW) -> list[float]:
    """Starts per second in each ``window`` of the drain, slid by :data:`SLIDE` from the
    first start to the last start less a window."""
    rates: list[float] = []
    begin = starts[0]
    while begin + window <= starts[-1]:
        inside = sum(1 for at in starts if begin <= at < begin + window)
        rates.append(inside / window)
        begin += SLIDE
    return rates


def rated_drain(
    procs: Processes, database_url: str, amqp_url: str, root: Path, args: argparse.Namespace
) -> list[float]:
    """The starts (seconds, database clock) of ``args.jobs`` one-step jobs of a kind with
    ``rate_limit=args.rate`` drained by fresh prefork workers."""
    queue = f"bench-rate-{uuid.uuid4().hex[:8]}"
    env = kinds.worker_env(database_url, amqp_url, root / "durable", queue)
    with bench_app(database_url, env) as store:
        store.submissions.set_limits(
            kinds.STEP, max_running=None, max_queued=None, rate_limit=args.rate
        )
        started = start_workers(procs, queue, args.workers, args.concurrency, env)
        tag = f"rl{uuid.uuid4().hex[:8]}"
        jobs.submit_many(
            kinds.STEP,
            [{} for _ in range(args.jobs)],
            job_ids=[f"{tag}-{n:06d}" for n in range(args.jobs)],
        )
        mine = JobsTable.id.like(f"{tag}-%")

        def drained() -> bool:
            with store.engine.connect() as conn:
                done = conn.execute(
                    select(JobsTable.id).where(mine, JobsTable.state == State.COMPLETED.value)
                ).all()
            return len(done) >= args.jobs

        interval = parse_rate(args.rate).interval
        _wait(drained, 60 + args.jobs * interval * 3, "the rated jobs to drain", interval=0.2)
        with store.engine.connect() as conn:
            starts = sorted(
                at.timestamp()
                for at in conn.execute(
                    select(TransitionsTable.at).where(
                        TransitionsTable.job_id.like(f"{tag}-%"),
                        TransitionsTable.to_state == State.RUNNING.value,
                    )
                ).scalars()
            )
        procs.stop_many(started)
        return starts


def accuracy(starts: list[float], rate: str, workers: int, concurrency: int) -> str:
    """The line the drain's accuracy is read from: its starts, their span and overall rate,
    and the least, median and most starts per second over its :data:`WINDOW` windows; a
    drain too short for one window says so (and how many jobs would make one) instead."""
    target = 1.0 / parse_rate(rate).interval
    head = f"rate_limit={rate} on {workers} workers x {concurrency}: {len(starts)} starts"
    rates = window_rates(starts) if starts else []
    if not rates:
        span = f" over {starts[-1] - starts[0]:.2f} s" if starts else ""
        return (
            f"{head}{span}, shorter than one {WINDOW:.0f} s window: no window rates "
            f"(at {rate}, --jobs {math.ceil(WINDOW * target) + 1} or more makes one)"
        )
    overall = (len(starts) - 1) / (starts[-1] - starts[0])
    return (
        f"{head} over {starts[-1] - starts[0]:.2f} s ({overall:.2f}/s); "
        f"over {len(rates)} {WINDOW:.0f} s windows: min {min(rates):.2f}/s, "
        f"median {median(rates):.2f}/s, max {max(rates):.2f}/s (target {target:.0f} ± 2)"
    )


def main() -> None:
    parser = bench_parser(__doc__, base="3bf43d4", concurrency=4, skips=True)
    parser.add_argument("--rate", default="20/s")
    parser.add_argument("--jobs", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-rate-") as scratch:
        root = Path(scratch)
        if not args.skip_claims:
            sides = {"before": (BEFORE, "plain"), "after": (AFTER, "plain")}
            compare_claims(args, sides, summary="unlimited claim")
        if args.skip_drain:
            return
        procs = Processes(root / "logs", REPO)
        with pg_database(args.pg_url) as url:
            try:
                starts = rated_drain(procs, url, args.amqp_url, root, args)
            finally:
                procs.stop_all()
        print(accuracy(starts, args.rate, args.workers, args.concurrency))


if __name__ == "__main__":
    main()
