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
The command line, the workers and the drain's rounds are :mod:`bench.claim_cost`'s.
"""

from __future__ import annotations

import argparse
import tempfile
import uuid
from pathlib import Path

from sqlalchemy import func, select

import jobs
from bench import kinds
from bench.claim_cost import bench_app, bench_parser, drain_rounds, start_workers
from bench.procs import Processes
from bench.scenarios import REPO, _wait
from bench.services import pg_database
from bench.stats import median
from jobs._core.states import State
from jobs._store.tables import JobsTable, TransitionsTable


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
    with bench_app(database_url, env) as store:
        tag = f"f{uuid.uuid4().hex[:8]}"
        jobs.submit_many(
            kind,
            [{"key": "big"} for _ in range(args.backlog)],
            job_ids=[f"{tag}-big-{n:06d}" for n in range(args.backlog)],
        )
        started = start_workers(procs, queue, args.workers, args.concurrency, env)
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
    sides = {"fair=True": (kinds.FAIR, None), "without": (kinds.KEYED, None)}
    rates = drain_rounds(procs, root, args, sides, alternate=True)
    fair, plain = median(rates["fair=True"]), median(rates["without"])
    print(
        f"drain of {args.jobs} jobs over {args.keys} keys, {args.workers} workers x "
        f"{args.concurrency}, median of {args.rounds} rounds: fair=True {fair:.1f} jobs/s, "
        f"without {plain:.1f} jobs/s ({fair / plain:.3f} x)",
        flush=True,
    )


def main() -> None:
    parser = bench_parser(__doc__, concurrency=2, keyed_drain=True)
    parser.add_argument("--backlog", type=int, default=1000)
    parser.add_argument("--late", type=int, default=10)
    parser.add_argument("--only", choices=("late", "drain"))
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
