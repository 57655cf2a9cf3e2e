"""``python -m bench``: the command line, the table and the clean-up."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

from bench.procs import Processes
from bench.scenarios import (
    BACKENDS,
    EMBEDDED,
    PG_RABBITMQ,
    REPO,
    Options,
    Say,
    describe,
    run_backend,
)
from bench.services import check_amqp, check_pg

HEADER = f"{'backend':<14} {'metric':<28} {'durable':>10} {'plain-celery':>14} {'ratio':>7}"

NOTES = [
    "drain: N jobs (N no-op tasks) queued while the side's worker is stopped (durable: "
    "jobs.submit_many, doorbells published), then a fresh worker drains them; rate from the "
    "20th completion to the last (the issue's method). worker memory: RSS and PSS of that "
    "worker's main process + pool children right after the 1-step drain.",
    "peer (issue 19): the same 1-step drain of N jobs back to back with procrastinate 3.x "
    "(bench.peer: N no-op jobs deferred in bulk, then as many fresh 'procrastinate worker' "
    "processes as the durable worker has pool processes, one job at a time each, the same "
    "PostgreSQL server in a database of its own; rate from its 'succeeded' events) in the "
    "'plain-celery' column.",
    "native (issue 14): the same 1-step drain by a worker of a user's own Celery app with "
    "durable jobs installed (bench.user_app: the plain side's app + install(app)) in the "
    "'durable' column, by jobs.celery_app's worker in the 'plain-celery' column; and no-op "
    "plain tasks drained by that user's app as a mixed worker (plain and durable queues) in "
    "the 'durable' column, by the plain worker in the 'plain-celery' column. Target: ratios "
    "within 5% of 1.",
    "write txns/job: distinct transaction IDs on the batch's history and step rows (exact, this "
    "database only; heartbeat renewals write no such row); xids/job (cluster): "
    "pg_snapshot_xmax before the fill and after the drain, divided by N, counting every "
    "database on the server (other activity inflates it).",
    "submit single/bulk: N jobs.submit vs N send_task; one jobs.submit_many of N vs N publishes "
    "on one producer. Every doorbell and task message is confirmed by RabbitMQ: send_task waits "
    "for each confirmation; jobs.submit returns once its job is committed and its doorbell "
    "written, and reads the confirmations at the next publish (JOBS_DOORBELL_CONFIRMS="
    "background, the default; the time includes reading the last ones); 'single, confirmed' "
    "waits for each as send_task does (JOBS_DOORBELL_CONFIRMS=wait).",
    "round trips/job and per job: parts: N 1-step jobs run in-process by the worker's Runner "
    "(libpq trace: flights, a claim pipelined with the held completion counting once; "
    "completions held as a worker holds them, so complete is ~0 and the claim carries it; "
    "wall time per store call); per job: worker time = concurrency / drain rate (durable) vs "
    "concurrency / plain drain rate (Celery itself).",
    "fan-out (issue 17): a bench_fanout parent that maps N one-step children (ctx.map: one "
    "bulk insert, then parked WAITING until the last child's finishing transaction queues it), "
    "from its jobs.submit to its finished_at, vs a Celery chord of N no-op tasks with a Redis "
    "result backend (its own database number), from the chord's apply to its callback. write "
    "txns/child: distinct transaction IDs on the family's job, history and step rows, / N. "
    "polls while parked: the parent's moves, claims and dropped deliveries between its park "
    "and its wake (the children's countdowns of its counter are its only writes then; the "
    "sweeper's pass runs its fixed statements whether or not a parent waits).",
    "pools: the drain on each Celery pool, durable jobs vs plain Celery with the same pool, "
    "concurrency and settings, back to back (bench.pools): agent-shaped jobs (a 100 ms model "
    "call, a 50 ms tool call and a small write, three recorded steps; plain: the same sleeps "
    "in one task; ceiling concurrency / 150 ms) and no-op jobs (one step; plain: a no-op "
    "task), on threads x50, gevent x100 and prefork x20; rate from the 20th completion.",
    "async: the drain of an async def one-step job vs the sync one-step job's (durable both: "
    "the durable column is async, plain-celery is sync), on prefork x20 and threads x50, "
    "each from a filled queue with a fresh worker (bench.async_drain); rate from the 20th "
    "completion.",
    "ratio = durable / plain-celery, the median of per-repeat ratios (each repeat measures both "
    "sides back to back); durable and plain-celery columns are medians over repeats.",
    "throughput: N jobs submitted one after another through jobs.submit (1-step: one recorded "
    "step; 0-step: none) vs N app.send_task of a no-op task; from the first submit to the last "
    "completion (the job's finished_at in the database; the plain task's own completion mark).",
    "plain-celery completion signal: each task appends one line to a file (O_APPEND, a few "
    "microseconds; no result backend).",
    "submit: one jobs.submit (INSERT + history row, commit, publish) vs one send_task; 'busy' "
    "while the throughput batches run, the others from the one-at-a-time runs.",
    "end-to-end: one job at a time, submit -> COMPLETED (1-step kind) vs send -> task ran.",
    "recovery: SIGKILL of the worker process group running the job -> the job RUNNING under "
    "another (already running) worker; durable: 30 s lease, the dead worker's liveness lock "
    "seen by the claim of RabbitMQ's redelivery (or by the sweeper); "
    "plain: acks_late redelivery when the killed worker's connection drops.",
]


EMBEDDED_NOTE = (
    "embedded: SQLite + filesystem:// on both sides, {jobs} jobs per batch, {samples} single jobs "
    "per repeat (each started at a random phase of the transport's poll). Both sides use "
    "jobs.celery_app's settings, which poll the folder every 50 ms (kombu's default is 1 s). "
    "Recovery is not measured there: a killed worker's unacked message "
    "dies with it on filesystem://, so plain Celery never runs it again, and durable jobs "
    "wait for the lease."
)


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text} must be greater than 0")
        return value

    return parse


def _scenarios(text: str) -> tuple[str, ...]:
    chosen = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = sorted(set(chosen) - set(Options().scenarios))
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"unknown scenario {', '.join(map(repr, unknown)) or repr(text)}; choose from "
            + ", ".join(Options().scenarios)
        )
    return chosen


def parser() -> argparse.ArgumentParser:
    defaults = Options()
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Durable jobs vs plain Celery on the same broker, same worker settings "
        "and concurrency, measured in the same run.",
    )
    p.add_argument(
        "--jobs",
        "-n",
        type=_positive(int),
        help=f"jobs per throughput batch (default {defaults.jobs} on pg-rabbitmq, "
        f"{defaults.embedded_jobs} on embedded)",
    )
    p.add_argument(
        "--embedded-jobs",
        type=_positive(int),
        help="jobs per batch on embedded, where the filesystem transport hands a "
        "worker `concurrency` messages per 1 s poll (default: --jobs if given, "
        f"else {defaults.embedded_jobs})",
    )
    p.add_argument(
        "--repeat",
        "-r",
        type=_positive(int),
        default=defaults.repeat,
        help="repeats of every measurement (default %(default)s)",
    )
    p.add_argument(
        "--backend", choices=[*BACKENDS, "all"], default="all", help="default %(default)s"
    )
    p.add_argument(
        "--concurrency",
        "-c",
        type=_positive(int),
        default=defaults.concurrency,
        help="worker processes per celery worker, both sides (default %(default)s)",
    )
    p.add_argument(
        "--samples",
        type=_positive(int),
        default=defaults.samples,
        help="single jobs per repeat for the latency figures on pg-rabbitmq (default %(default)s)",
    )
    p.add_argument(
        "--embedded-samples",
        type=_positive(int),
        default=defaults.embedded_samples,
        help="the same on embedded, where the filesystem transport polls once a "
        "second (default %(default)s)",
    )
    p.add_argument(
        "--sweep-interval",
        type=_positive(float),
        default=defaults.sweep_interval,
        help="JOBS_SWEEP_INTERVAL_SECONDS of the durable side's sweeper "
        "(default %(default)s, the project default)",
    )
    p.add_argument(
        "--drain-jobs",
        type=_positive(int),
        default=defaults.drain_jobs,
        help="jobs per steady-state drain on pg-rabbitmq (default %(default)s)",
    )
    p.add_argument(
        "--embedded-drain-jobs",
        type=_positive(int),
        default=defaults.embedded_drain_jobs,
        help="jobs per steady-state drain on embedded (default %(default)s)",
    )
    p.add_argument(
        "--submit-jobs",
        type=_positive(int),
        default=defaults.submit_jobs,
        help="jobs per submit-rate run, single and bulk (default %(default)s)",
    )
    p.add_argument(
        "--fanout-children",
        type=_positive(int),
        default=defaults.fanout_children,
        help="children of the fan-out parent and members of the chord (default %(default)s)",
    )
    p.add_argument(
        "--redis-url",
        default=os.environ.get("BENCH_REDIS_URL") or defaults.redis_url,
        help="the chord's Redis result backend, a database number of the bench's own "
        "(default %(default)s; env BENCH_REDIS_URL)",
    )
    p.add_argument("--no-recovery", action="store_true", help="skip the SIGKILL recovery runs")
    p.add_argument(
        "--only",
        type=_scenarios,
        default=defaults.scenarios,
        help="comma-separated scenarios to run, of: "
        + ", ".join(defaults.scenarios)
        + " (default all; drain includes the submit rates and the per-job profile)",
    )
    p.add_argument(
        "--loglevel",
        default=defaults.loglevel,
        help="celery worker log level, both sides (default %(default)s)",
    )
    p.add_argument(
        "--pg-url",
        default=os.environ.get("BENCH_PG_URL") or defaults.pg_url,
        help="PostgreSQL server (a bench_<random> database is created on it and "
        "dropped; env BENCH_PG_URL)",
    )
    p.add_argument(
        "--amqp-url",
        default=os.environ.get("BENCH_AMQP_URL") or defaults.amqp_url,
        help="RabbitMQ (env BENCH_AMQP_URL)",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the work folder (worker logs) after a successful run",
    )
    return p


def _number(value: float, unit: str) -> str:
    if math.isnan(value):
        return "n/a"
    if unit == "s":
        return f"{value:.3f}"
    if unit == "ms":
        return f"{value:.2f}"
    return f"{value:.1f}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [HEADER]
    for row in rows:
        ratio = "n/a" if math.isnan(row["ratio"]) else f"{row['ratio']:.2f}"
        lines.append(
            f"{row['backend']:<14} {row['metric']:<28} {_number(row['durable'], row['unit']):>10}"
            f" {_number(row['plain'], row['unit']):>14} {ratio:>7}"
        )
    return "\n".join(lines)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


def say(message: str) -> None:
    """Progress goes to stderr; stdout carries only the table (or the JSON)."""
    print(message, file=sys.stderr, flush=True)


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _run(
    backends: list[str], opts: Options, root: Path, procs: Processes, say: Say, *, keep: bool
) -> tuple[list[dict[str, Any]], bool]:
    """Every backend in turn; all processes stopped (and the PostgreSQL database dropped,
    inside run_backend) however it ends. Returns the rows and whether all of it ran."""
    rows: list[dict[str, Any]] = []
    ok = False
    try:
        for backend in backends:
            rows += describe(run_backend(backend, opts, root / backend, procs, say))
        ok = True
    except KeyboardInterrupt:
        say("interrupted: stopping workers and dropping the bench database")
    except Exception as err:
        say(f"bench failed: {type(err).__name__}: {err}")
        raise
    finally:
        procs.stop_all()
        if ok and not keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            say(f"worker logs kept in {root / 'logs'}")
    return rows, ok


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    defaults = Options()
    opts = Options(
        jobs=args.jobs or defaults.jobs,
        embedded_jobs=args.embedded_jobs or args.jobs or defaults.embedded_jobs,
        repeat=args.repeat,
        concurrency=args.concurrency,
        samples=args.samples,
        embedded_samples=args.embedded_samples,
        sweep_interval=args.sweep_interval,
        drain_jobs=args.drain_jobs,
        embedded_drain_jobs=args.embedded_drain_jobs,
        submit_jobs=args.submit_jobs,
        loglevel=args.loglevel,
        pg_url=args.pg_url,
        amqp_url=args.amqp_url,
        recovery=not args.no_recovery,
        scenarios=args.only,
        fanout_children=args.fanout_children,
        redis_url=args.redis_url,
    )

    backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    notes = list(NOTES)
    if PG_RABBITMQ in backends:
        problem = check_pg(opts.pg_url) or check_amqp(opts.amqp_url)
        if problem and args.backend != "all":
            say(f"cannot run {PG_RABBITMQ}: {problem}")
            return 2
        if problem:
            say(f"skipping {PG_RABBITMQ}: {problem}")
            notes.append(f"{PG_RABBITMQ} skipped: {problem}")
            backends.remove(PG_RABBITMQ)
        else:
            notes.append(
                f"{PG_RABBITMQ}: {opts.jobs} jobs per batch, {opts.samples} single "
                f"jobs per repeat, sweeper every {opts.sweep_interval:g} s."
            )
    if EMBEDDED in backends:
        notes.append(EMBEDDED_NOTE.format(jobs=opts.embedded_jobs, samples=opts.embedded_samples))

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    root = Path(tempfile.mkdtemp(prefix="bench-"))
    procs = Processes(root / "logs", REPO)
    say(
        f"work folder {root}; repeat {opts.repeat}, concurrency {opts.concurrency}, "
        f"sweep interval {opts.sweep_interval:g}s"
    )
    started = time.monotonic()
    rows, ok = _run(backends, opts, root, procs, say, keep=args.keep)
    elapsed = time.monotonic() - started
    if not ok:
        notes.append("INTERRUPTED: partial results")
    if args.json:
        print(
            json.dumps(
                _json_safe(
                    {
                        "command": [
                            sys.executable,
                            "-m",
                            "bench",
                            *(sys.argv[1:] if argv is None else argv),
                        ],
                        "backends": backends,
                        "options": dataclasses.asdict(opts),
                        "elapsed_seconds": round(elapsed, 1),
                        "rows": rows,
                        "notes": notes,
                    }
                ),
                indent=2,
            )
        )
    else:
        if rows:
            print(table(rows))
            print()
        for note in notes:
            print(f"- {note}")
        print(f"({opts.repeat} repeat(s), {elapsed:.0f} s)")
    return 0 if ok else 130
