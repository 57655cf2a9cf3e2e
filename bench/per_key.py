"""What concurrency keys cost (issue 27 part 1), measured in one run:

1. the claim of a kind with no per-key limit, before the feature (the branch's base
   commit, exported to a scratch folder) and after it, back to back: each side in a
   process of its own on a fresh database, the sides taking turns over several rounds;
   each claim timed alone (a completion after it, untimed, so no key ever fills);
2. the drain of 2,000 one-step jobs over 50 keys (keys interleaved) by real prefork
   workers, without a per-key limit and with ``max_running_per_key``, taking turns too.

    python -m bench.per_key [--claims 2000] [--jobs 2000] [--keys 50] [--per-key 2]
        [--rounds 3] [--base ee44da3] [--pg-url …] [--amqp-url …]

A server is needed (PostgreSQL and RabbitMQ; each database made here is dropped at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import uuid
from io import BytesIO
from pathlib import Path

from sqlalchemy import select

import jobs
from bench import kinds
from bench.drain import steady_rate
from bench.procs import Child, Processes
from bench.scenarios import REPO, _base_env, _environ, _wait
from bench.services import clock_offset, pg_database
from bench.stats import median
from jobs._store.db import make_engine
from jobs._store.schema import upgrade
from jobs._store.tables import JobsTable
from jobs.application import default_app

# Run with the code under test first on sys.path: the same statements both sides have.
CLAIM_CHILD = r"""
import json, sys, time, uuid
from jobs._store import JobStore
from jobs._store.db import make_engine
from jobs._store.schema import upgrade

url, count, keyed = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "keyed"
engine = make_engine(url)
upgrade(engine)
store = JobStore(engine)
kind = "claim_cost"
extra = {}
if keyed:
    store.submissions.set_limits(kind, max_running=None, max_queued=None, max_running_per_key=2)
tag = uuid.uuid4().hex[:8]
rows = []
for n in range(count):
    if keyed:
        extra = {"concurrency_key": f"key-{n % 50}"}
    rows.append(store.submissions.new_job_values(
        kind, {}, job_id=f"{tag}-{n}", max_attempts=1, delay_seconds=0, code_version=None,
        **extra))
for start in range(0, count, 1000):
    store.submissions.create_many(kind, rows[start:start + 1000])
times = []
for n in range(count):
    started = time.perf_counter()
    claim = store.ownership.claim(f"{tag}-{n}", "bench", 30)
    times.append(time.perf_counter() - started)
    assert claim is not None, n
    store.ownership.complete(claim, None)
engine.dispose()
times.sort()
print(json.dumps({"median_us": times[len(times) // 2] * 1e6,
                  "mean_us": sum(times) / len(times) * 1e6}))
"""


def export_base(commit: str, into: Path) -> Path:
    """The ``jobs`` package of ``commit`` (the code before the feature), in ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, "jobs"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def claim_cost(pg_url: str, code_root: Path, count: int, keyed: bool) -> dict[str, float]:
    """Per-claim microseconds (median, mean) of ``count`` back-to-back claims, by the code
    in ``code_root``, on a fresh database."""
    with pg_database(pg_url) as url:
        env = {**_base_env(), "PYTHONPATH": str(code_root)}
        done = subprocess.run(
            [sys.executable, "-c", CLAIM_CHILD, url, str(count), "keyed" if keyed else "plain"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            cwd=tempfile.gettempdir(),
        )
        if done.returncode != 0:
            raise RuntimeError(f"claim child failed:\n{done.stderr[-3000:]}")
        result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
        return result


class KeyedDrain:
    """Real prefork workers draining keyed one-step jobs on one database and queue."""

    def __init__(self, procs: Processes, database_url: str, amqp_url: str, root: Path) -> None:
        self.procs = procs
        self.queue = f"bench-perkey-{uuid.uuid4().hex[:8]}"
        self.env = kinds.worker_env(database_url, amqp_url, root / "durable", self.queue)
        self.started = 0

    def drain(
        self,
        n: int,
        keys: int,
        per_key: int | None,
        workers: int,
        conc: int,
        kind: str = kinds.KEYED,
    ) -> float:
        """Jobs/s of a fresh set of workers draining ``n`` queued jobs of ``kind`` over
        ``keys`` keys."""
        store = default_app().runtime.store
        store.submissions.set_limits(
            kind, max_running=None, max_queued=None, max_running_per_key=per_key
        )
        tag = f"pk{uuid.uuid4().hex[:8]}"
        for start in range(0, n, 1000):
            batch = range(start, min(n, start + 1000))
            jobs.submit_many(
                kind,
                [{"key": f"key-{i % keys}"} for i in batch],
                job_ids=[f"{tag}-{i:06d}" for i in batch],
            )
        started: list[Child] = []
        for _ in range(workers):
            self.started += 1
            started.append(
                self.procs.start_worker(
                    f"bench-perkey-{self.started}",
                    "jobs.celery_app",
                    self.queue,
                    conc,
                    {**_base_env(), **self.env},
                    "INFO",
                )
            )
        for worker in started:
            self.procs.wait_ready(worker)
        finished = JobsTable.finished_at
        mine = JobsTable.id.like(f"{tag}-%")

        def drained() -> bool:
            with store.engine.connect() as conn:
                rows = conn.execute(select(finished).where(mine, finished.is_not(None))).all()
            return len(rows) >= n

        _wait(drained, 60 + n * 0.2, f"{n} keyed jobs to drain", interval=0.2)
        offset = clock_offset(store.engine)
        with store.engine.connect() as conn:
            ends = [
                at.timestamp() - offset
                for at in conn.execute(select(finished).where(mine)).scalars()
            ]
        self.procs.stop_many(started)
        return steady_rate(ends)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=2000)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--per-key", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--base", default="ee44da3", help="the commit before the feature")
    parser.add_argument("--skip-drain", action="store_true")
    parser.add_argument("--skip-claims", action="store_true")
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument(
        "--amqp-url", default=os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1//")
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-perkey-") as scratch:
        root = Path(scratch)
        if not args.skip_claims:
            base = export_base(args.base, root / "before")
            sides = {"before": (base, False), "after": (REPO, False), "after, keyed": (REPO, True)}
            costs: dict[str, list[float]] = {side: [] for side in sides}
            for round_ in range(args.rounds):
                for side, (code_root, keyed) in sides.items():
                    cost = claim_cost(args.pg_url, code_root, args.claims, keyed)
                    costs[side].append(cost["median_us"])
                    print(
                        f"claim round {round_ + 1} {side:13s}: {cost['median_us']:7.1f} us "
                        f"median, {cost['mean_us']:7.1f} us mean",
                        flush=True,
                    )
            for side, values in costs.items():
                ratio = median(values) / median(costs["before"])
                print(
                    f"claim {side:13s}: median of medians {median(values):7.1f} us "
                    f"({ratio:.3f} x before)"
                )
        if args.skip_drain:
            return
        procs = Processes(root / "logs", REPO)
        with pg_database(args.pg_url) as url:
            drain = KeyedDrain(procs, url, args.amqp_url, root)
            with _environ(drain.env):
                upgrade(make_engine(url))
                default_app().reset_settings()
                jobs.reset()
                rates: dict[str, list[float]] = {"no limit": [], "per key": []}
                try:
                    for round_ in range(args.rounds):
                        for mode, limit in (("no limit", None), ("per key", args.per_key)):
                            rate = drain.drain(
                                args.jobs, args.keys, limit, args.workers, args.concurrency
                            )
                            rates[mode].append(rate)
                            print(
                                f"drain round {round_ + 1} {mode:8s}: {rate:7.1f} jobs/s",
                                flush=True,
                            )
                finally:
                    procs.stop_all()
                ratio = median(rates["per key"]) / median(rates["no limit"])
                print(
                    f"drain of {args.jobs} jobs over {args.keys} keys, {args.workers} workers x "
                    f"{args.concurrency}: no limit {median(rates['no limit']):.1f} jobs/s, "
                    f"max_running_per_key={args.per_key} {median(rates['per key']):.1f} jobs/s "
                    f"({ratio:.3f} x)"
                )


if __name__ == "__main__":
    main()
