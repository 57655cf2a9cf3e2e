"""What global rate limits cost and how close they keep to the rate (issue 27 part 2),
measured in one run:

1. the claim of a kind with no rate limit, before the feature (the branch's base commit,
   exported to a scratch folder) and after it, back to back, each side in a process of
   its own on a fresh database, taking turns over several rounds (as bench/per_key.py);
2. the accuracy of ``rate_limit="20/s"`` on 2 real prefork workers: 300 one-step jobs
   queued at once, the starts read from their history (the claims, on the database's
   clock), and the starts per second over every 5 s window of the drain (slid by 0.5 s).

    python -m bench.rate_limit [--claims 2000] [--rounds 3] [--rate 20/s] [--jobs 300]
        [--workers 2] [--concurrency 4] [--base 3bf43d4] [--pg-url …] [--amqp-url …]

A server is needed (PostgreSQL and RabbitMQ; each database made here is dropped at the end).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import uuid
from pathlib import Path

from sqlalchemy import select

import jobs
from bench import kinds
from bench.per_key import claim_cost, export_base
from bench.procs import Child, Processes
from bench.scenarios import REPO, _base_env, _environ, _wait
from bench.services import pg_database
from bench.stats import median
from jobs._core.rate_syntax import parse_rate
from jobs._core.states import State
from jobs._store.db import make_engine
from jobs._store.schema import upgrade
from jobs._store.tables import JobsTable, TransitionsTable
from jobs.application import default_app

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
    with _environ(env):
        upgrade(make_engine(database_url))
        default_app().reset_settings()
        jobs.reset()
        store = default_app().runtime.store
        store.submissions.set_limits(
            kinds.STEP, max_running=None, max_queued=None, rate_limit=args.rate
        )
        started: list[Child] = [
            procs.start_worker(
                f"bench-rate-{n}",
                "jobs.celery_app",
                queue,
                args.concurrency,
                {**_base_env(), **env},
                "INFO",
            )
            for n in range(args.workers)
        ]
        for worker in started:
            procs.wait_ready(worker)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", default="20/s")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--base", default="3bf43d4", help="the commit before the feature")
    parser.add_argument("--skip-claims", action="store_true")
    parser.add_argument("--skip-drain", action="store_true")
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument(
        "--amqp-url", default=os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1//")
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-rate-") as scratch:
        root = Path(scratch)
        if not args.skip_claims:
            base = export_base(args.base, root / "before")
            sides = {"before": base, "after": REPO}
            costs: dict[str, list[float]] = {side: [] for side in sides}
            for round_ in range(args.rounds):
                for side, code_root in sides.items():
                    cost = claim_cost(args.pg_url, code_root, args.claims, keyed=False)
                    costs[side].append(cost["median_us"])
                    print(
                        f"claim round {round_ + 1} {side:6s}: {cost['median_us']:7.1f} us "
                        f"median, {cost['mean_us']:7.1f} us mean",
                        flush=True,
                    )
            for side, values in costs.items():
                ratio = median(values) / median(costs["before"])
                print(
                    f"unlimited claim {side:6s}: median of medians {median(values):7.1f} us "
                    f"({ratio:.3f} x before)"
                )
        if args.skip_drain:
            return
        procs = Processes(root / "logs", REPO)
        with pg_database(args.pg_url) as url:
            try:
                starts = rated_drain(procs, url, args.amqp_url, root, args)
            finally:
                procs.stop_all()
        rates = window_rates(starts)
        target = 1.0 / parse_rate(args.rate).interval
        overall = (len(starts) - 1) / (starts[-1] - starts[0])
        print(
            f"rate_limit={args.rate} on {args.workers} workers x {args.concurrency}: "
            f"{len(starts)} starts over {starts[-1] - starts[0]:.2f} s ({overall:.2f}/s); "
            f"over {len(rates)} {WINDOW:.0f} s windows: min {min(rates):.2f}/s, "
            f"median {median(rates):.2f}/s, max {max(rates):.2f}/s (target {target:.0f} ± 2)"
        )


if __name__ == "__main__":
    main()
