"""Fairness across keys (issue 27 part 3), measured: a tenant's backlog of 1,000 one-step
jobs queued, real prefork workers draining it, and another tenant's 10 jobs submitted once
a tenth of the backlog ran; the claim position of the late tenant's jobs after their
submission (read from the history, on the database's clock), with ``fair=True``
(``bench_fair``) and without (``bench_keyed``, the same kind first in, first out); then
what the fair pick costs: the drain of the same backlog (``--jobs`` one-step jobs over
``--keys`` keys, interleaved) by fresh real prefork workers, ``fair=True`` against the same
kind without fairness, back to back on one database, the sides taking turns over
``--rounds`` rounds; the ratio of the medians.

    python -m bench.fairness [--backlog 1000] [--late 10] [--workers 2] [--concurrency 2]
        [--jobs 2000] [--keys 50] [--rounds 3] [--only late|drain] [--pg-url …] [--amqp-url …]

A server is needed (PostgreSQL and RabbitMQ; each database made here is dropped at the end).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import uuid
from pathlib import Path

from sqlalchemy import func, select

import jobs
from bench import kinds
from bench.per_key import KeyedDrain
from bench.procs import Child, Processes
from bench.scenarios import REPO, _base_env, _environ, _wait
from bench.services import pg_database
from bench.stats import median
from jobs._core.states import State
from jobs._store.db import make_engine
from jobs._store.schema import upgrade
from jobs._store.tables import JobsTable, TransitionsTable
from jobs.application import default_app


def late_positions(
    procs: Processes,
    database_url: str,
    amqp_url: str,
    root: Path,
    kind: str,
    args: argparse.Namespace,
) -> tuple[list[int], int]:
    """The late tenant's claim positions after its first submission, and how many of the
    backlog were still QUEUED then."""
    queue = f"bench-fair-{uuid.uuid4().hex[:8]}"
    env = kinds.worker_env(database_url, amqp_url, root / "durable", queue)
    with _environ(env):
        upgrade(make_engine(database_url))
        default_app().reset_settings()
        jobs.reset()
        store = default_app().runtime.store
        tag = f"f{uuid.uuid4().hex[:8]}"
        jobs.submit_many(
            kind,
            [{"key": "big"} for _ in range(args.backlog)],
            job_ids=[f"{tag}-big-{n:06d}" for n in range(args.backlog)],
        )
        started: list[Child] = [
            procs.start_worker(
                f"bench-fair-{n}",
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
        mine = JobsTable.id.like(f"{tag}-%")

        def count(state: State) -> int:
            with store.engine.connect() as conn:
                return int(
                    conn.execute(
                        select(func.count()).where(mine, JobsTable.state == state.value)
                    ).scalar_one()
                )

        _wait(lambda: count(State.COMPLETED) >= args.backlog // 10, 120, "a tenth to run", 0.05)
        waiting = count(State.QUEUED)
        late = [jobs.submit(kind, {"key": "small"}) for _ in range(args.late)]
        total = args.backlog + args.late
        _wait(
            lambda: (
                count(State.COMPLETED)
                + sum(store.reads.get(job_id).state is State.COMPLETED for job_id in late)
                >= total
            ),
            300,
            "the drain",
            0.2,
        )
        with store.engine.connect() as conn:
            ids = [*late]
            rows = conn.execute(
                select(TransitionsTable.at, TransitionsTable.job_id).where(
                    TransitionsTable.to_state == State.RUNNING.value,
                    TransitionsTable.job_id.like(f"{tag}-%") | TransitionsTable.job_id.in_(ids),
                )
            ).all()
            submitted = conn.execute(
                select(func.min(TransitionsTable.at)).where(TransitionsTable.job_id.in_(ids))
            ).scalar_one()
        procs.stop_many(started)
        after = [job_id for at, job_id in sorted(rows) if at >= submitted]
        return sorted(after.index(job_id) + 1 for job_id in late), waiting


def drain_cost(procs: Processes, root: Path, args: argparse.Namespace) -> None:
    """Print each round's drain rate of ``fair=True`` and of the same kind without
    fairness, then the medians and their ratio."""
    sides = {"fair=True": kinds.FAIR, "without": kinds.KEYED}
    rates: dict[str, list[float]] = {side: [] for side in sides}
    with pg_database(args.pg_url) as url:
        drain = KeyedDrain(procs, url, args.amqp_url, root)
        with _environ(drain.env):
            upgrade(make_engine(url))
            default_app().reset_settings()
            jobs.reset()
            for round_ in range(args.rounds):
                order = list(sides.items()) if round_ % 2 == 0 else list(sides.items())[::-1]
                for side, kind in order:
                    rate = drain.drain(
                        args.jobs, args.keys, None, args.workers, args.concurrency, kind=kind
                    )
                    rates[side].append(rate)
                    print(f"drain round {round_ + 1} {side:9s}: {rate:7.1f} jobs/s", flush=True)
    fair, plain = median(rates["fair=True"]), median(rates["without"])
    print(
        f"drain of {args.jobs} jobs over {args.keys} keys, {args.workers} workers x "
        f"{args.concurrency}, median of {args.rounds} rounds: fair=True {fair:.1f} jobs/s, "
        f"without {plain:.1f} jobs/s ({fair / plain:.3f} x)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=1000)
    parser.add_argument("--late", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=("late", "drain"))
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument(
        "--amqp-url", default=os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1//")
    )
    args = parser.parse_args()
    slots = args.workers * args.concurrency
    with tempfile.TemporaryDirectory(prefix="bench-fair-") as scratch:
        root = Path(scratch)
        procs = Processes(root / "logs", REPO)
        try:
            for label, kind in (("fair=True", kinds.FAIR), ("first in, first out", kinds.KEYED)):
                if args.only == "drain":
                    break
                with pg_database(args.pg_url) as url:
                    positions, waiting = late_positions(procs, url, args.amqp_url, root, kind, args)
                print(
                    f"{label:20s}: late tenant's {args.late} jobs behind {waiting} queued of "
                    f"a backlog of {args.backlog}, {args.workers} workers x {args.concurrency}: "
                    f"claim positions after submission {positions} (bound for fair: first "
                    f"<= {slots + 1})",
                    flush=True,
                )
            if args.only != "late":
                drain_cost(procs, root, args)
        finally:
            procs.stop_all()


if __name__ == "__main__":
    main()
