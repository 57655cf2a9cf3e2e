"""How long ``jobctl replay-check`` takes over many live jobs (issue 26: "seconds, not
minutes"): ``--jobs`` three-step jobs of ``bench.kinds.THREE`` are written QUEUED with two
of their steps recorded (as a crash between steps leaves them), into a fresh PostgreSQL
database; then the check replays all of them, a batch at a time, and the time is printed
with the rate, over ``--rounds`` rounds (median).

    python -m bench.replay_check_cost --admin-url postgresql://postgres@127.0.0.1/test
"""

from __future__ import annotations

import argparse
import statistics
import uuid

from sqlalchemy import insert

import bench.kinds
from bench.services import pg_database
from jobs._service.replay_check import replay_check
from jobs._store import JobStore
from jobs._store.db import make_engine
from jobs._store.schema import upgrade
from jobs._store.tables import StepsTable
from jobs.application import default_app


def live_jobs(store: JobStore, count: int) -> None:
    """``count`` QUEUED jobs of three steps with the first two recorded."""
    tag = uuid.uuid4().hex[:8]
    rows = [
        store.submissions.new_job_values(
            bench.kinds.THREE,
            {},
            job_id=f"{tag}-{index:06d}",
            max_attempts=3,
            delay_seconds=0,
            code_version=None,
        )
        for index in range(count)
    ]
    store.submissions.create_many(bench.kinds.THREE, rows)
    now = store.reads.now()
    steps = [
        {
            "job_id": row["id"],
            "name": name,
            "output": None,
            "recorded_at": now,
            "owner": "bench",
            "fence": 1,
            "position": position,
        }
        for row in rows
        for position, name in enumerate(("one", "two"))
    ]
    with store.engine.begin() as conn:
        conn.execute(insert(StepsTable), steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with pg_database(args.admin_url) as url:
        engine = make_engine(url)
        upgrade(engine)
        store = JobStore(engine)
        live_jobs(store, args.jobs)
        registry = default_app().registry
        seconds = []
        for _ in range(args.rounds):
            report = replay_check(store, registry)
            assert report.checked == args.jobs, report.counts()
            assert report.counts() == {"ok": args.jobs}, report.counts()
            seconds.append(report.seconds)
        median = statistics.median(seconds)
        print(
            f"replay-check over {args.jobs} live jobs (2 recorded steps each): "
            f"median {median:.2f} s of {args.rounds} rounds ({args.jobs / median:,.0f} jobs/s)"
        )
        engine.dispose()


if __name__ == "__main__":
    main()
