"""The pieces the claim-cost benches share (``bench.per_key``, ``bench.rate_limit``,
``bench.versions``, ``bench.fairness``), so each bench holds only what it measures:

- their command line: the servers (``--pg-url``, ``--amqp-url``), ``--rounds``, the claims
  and the commit before the feature (``--claims``, ``--base``), the workers
  (``--workers``, ``--concurrency``), the keyed drain (``--jobs``, ``--keys``);
- the before/after claim loop: the feature's base commit exported from git to a scratch
  folder, each side claiming in a process of its own on a fresh database (each claim timed
  alone, a completion after it untimed, so no key ever fills), the sides taking turns over
  the rounds, then the median of each side's medians against the first side's;
- the drain of keyed one-step jobs by real prefork workers (:class:`KeyedDrain`), its rounds
  (:func:`drain_rounds`), and what every drain starts with: the bench process's settings
  for one database (:func:`bench_app`) and workers started and ready
  (:func:`start_workers`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import uuid
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from jobs._store import JobStore

# Run with the code under test first on sys.path: the same statements on both sides. The
# third argument names the claim's options, comma-separated: ``kinds`` (the claim names
# the worker's kinds, as a worker does), ``keyed`` (jobs over 50 keys, the kind at
# max_running_per_key=2), ``versioned`` (the kind at version 2, running 1 and 2); ``plain``
# for none.
CLAIM_CHILD = r"""
import json, sys, time, uuid
from jobs._store import JobStore
from jobs._store.db import make_engine
from jobs._store.schema import upgrade

url, count, options = sys.argv[1], int(sys.argv[2]), set(sys.argv[3].split(","))
engine = make_engine(url)
upgrade(engine)
store = JobStore(engine)
kind = "claim_cost"
claim_options = {}
if "kinds" in options:
    claim_options["kinds"] = [kind]
if "versioned" in options:
    from jobs._core.kind_versions import kind_versions
    claim_options["versions"] = kind_versions([(kind, "2", ("1",))])
extra = {}
if "keyed" in options:
    store.submissions.set_limits(kind, max_running=None, max_queued=None, max_running_per_key=2)
tag = uuid.uuid4().hex[:8]
rows = []
for n in range(count):
    if "keyed" in options:
        extra = {"concurrency_key": f"key-{n % 50}"}
    rows.append(store.submissions.new_job_values(
        kind, {}, job_id=f"{tag}-{n}", max_attempts=1, delay_seconds=0, code_version=None,
        **extra))
for start in range(0, count, 1000):
    store.submissions.create_many(kind, rows[start:start + 1000])
times = []
for n in range(count):
    started = time.perf_counter()
    claim = store.ownership.claim(f"{tag}-{n}", "bench", 30, **claim_options)
    times.append(time.perf_counter() - started)
    assert claim is not None, n
    if "versioned" in options:
        assert claim.job.code_version == "2", claim.job
    store.ownership.complete(claim, None)
engine.dispose()
times.sort()
print(json.dumps({"median_us": times[len(times) // 2] * 1e6,
                  "mean_us": sum(times) / len(times) * 1e6}))
"""


def bench_parser(
    doc: str | None,
    *,
    base: str | None = None,
    base_help: str = "the commit before the feature",
    concurrency: int | None = None,
    keyed_drain: bool = False,
    skips: bool = False,
) -> argparse.ArgumentParser:
    """The command line a claim-cost bench starts from, so the four read the same flags
    with the same defaults: always ``--pg-url`` and ``--rounds``; with ``base`` the claim
    comparison's ``--claims`` and ``--base``; with ``concurrency`` real workers'
    ``--amqp-url``, ``--workers`` and ``--concurrency`` (its default); with
    ``keyed_drain`` the drain's ``--jobs`` and ``--keys``; with ``skips`` ``--skip-claims``
    and ``--skip-drain``. The bench adds its own flags to what this returns."""
    parser = argparse.ArgumentParser(description=(doc or "").partition("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    if base is not None:
        parser.add_argument("--claims", type=int, default=2000)
        parser.add_argument("--base", default=base, help=base_help)
    if concurrency is not None:
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--concurrency", type=int, default=concurrency)
    if keyed_drain:
        parser.add_argument("--jobs", type=int, default=2000)
        parser.add_argument("--keys", type=int, default=50)
    if skips:
        parser.add_argument("--skip-claims", action="store_true")
        parser.add_argument("--skip-drain", action="store_true")
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    if concurrency is not None:
        parser.add_argument(
            "--amqp-url",
            default=os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1//"),
        )
    return parser


def export_base(commit: str, into: Path) -> Path:
    """The ``jobs`` package of ``commit`` (the code before the feature), in ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, "jobs"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def run_child(pg_url: str, code_root: Path, script: str, *args: str) -> dict[str, Any]:
    """The JSON a child running ``script`` (its arguments: a fresh database's URL, then
    ``args``) with the code in ``code_root`` prints last: a process of its own, so each side
    imports its own ``jobs``."""
    with pg_database(pg_url) as url:
        done = subprocess.run(
            [sys.executable, "-c", script, url, *args],
            env={**_base_env(), "PYTHONPATH": str(code_root)},
            capture_output=True,
            text=True,
            check=False,
            cwd=tempfile.gettempdir(),
        )
        if done.returncode != 0:
            raise RuntimeError(f"claim child failed:\n{done.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result


#: The code a side of :func:`compare_claims` claims with: the ``--base`` commit's or this.
BEFORE = "before"
AFTER = "after"


def compare_claims(
    args: argparse.Namespace,
    sides: dict[str, tuple[str, str]],
    *,
    summary: str = "claim",
    width: int | None = None,
) -> dict[str, list[float]]:
    """Each side's median per-claim microseconds, round by round, printed as they come and
    then as the median of each side's medians against the first side's (the code before
    the feature). ``sides`` maps a label to its code (:data:`BEFORE`, the ``args.base``
    commit exported to a scratch folder, or :data:`AFTER`, this checkout) and its
    :data:`CLAIM_CHILD` options (``plain``, ``keyed``, ``kinds,versioned``…); the sides
    take turns in each of ``args.rounds`` rounds of ``args.claims`` claims on
    ``args.pg_url``, so the machine's drift falls on all."""
    width = width or max(map(len, sides))
    costs: dict[str, list[float]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="bench-claims-") as scratch:
        code = {BEFORE: export_base(args.base, Path(scratch)), AFTER: REPO}
        for round_ in range(args.rounds):
            for side, (version, options) in sides.items():
                cost = run_child(args.pg_url, code[version], CLAIM_CHILD, str(args.claims), options)
                costs[side].append(cost["median_us"])
                print(
                    f"claim round {round_ + 1} {side:{width}s}: {cost['median_us']:7.1f} us "
                    f"median, {cost['mean_us']:7.1f} us mean",
                    flush=True,
                )
    reference = median(next(iter(costs.values())))
    for side, values in costs.items():
        print(
            f"{summary} {side:{width}s}: median of medians {median(values):7.1f} us "
            f"({median(values) / reference:.3f} x before)"
        )
    return costs


@contextlib.contextmanager
def bench_app(database_url: str, env: dict[str, str]) -> Iterator[JobStore]:
    """This process's settings ``env`` (the workers' own) on ``database_url``, its schema
    upgraded, and the store this process submits and reads with, for the block."""
    with _environ(env):
        upgrade(make_engine(database_url))
        default_app().reset_settings()
        jobs.reset()
        yield default_app().runtime.store


def start_workers(
    procs: Processes,
    queue: str,
    count: int,
    concurrency: int,
    env: dict[str, str],
    first: int = 1,
) -> list[Child]:
    """``count`` real prefork workers (``-c concurrency``, on ``queue``, with the settings
    ``env``), all started before the first is waited for, returned once every one is ready.
    Each is named after its queue (``<queue>-<first>``, ``<queue>-<first + 1>``…): the
    queue's name is random, and two bench runs at once on one broker must not give two
    workers one name (the second's pidbox queue is refused as locked, and it never gets
    ready)."""
    started = [
        procs.start_worker(
            f"{queue}-{number}",
            "jobs.celery_app",
            queue,
            concurrency,
            {**_base_env(), **env},
            "INFO",
        )
        for number in range(first, first + count)
    ]
    for worker in started:
        procs.wait_ready(worker)
    return started


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
        started = start_workers(
            self.procs, self.queue, workers, conc, self.env, first=self.started + 1
        )
        self.started += workers
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


def drain_rounds(
    procs: Processes,
    root: Path,
    args: argparse.Namespace,
    sides: dict[str, tuple[str, int | None]],
    *,
    alternate: bool = False,
) -> dict[str, list[float]]:
    """Each side's drain rate (jobs/s), round by round, printed as they come: ``sides`` maps
    a label to the kind drained and its ``max_running_per_key``; every drain is
    ``args.jobs`` jobs over ``args.keys`` keys by ``args.workers`` fresh workers of
    ``args.concurrency``, on one database (``args.pg_url``) made for the rounds and dropped
    after; with ``alternate`` the sides' order swaps every other round."""
    width = max(map(len, sides))
    rates: dict[str, list[float]] = {side: [] for side in sides}
    with pg_database(args.pg_url) as url:
        drain = KeyedDrain(procs, url, args.amqp_url, root)
        with bench_app(url, drain.env):
            try:
                for round_ in range(args.rounds):
                    order = list(sides.items())
                    if alternate and round_ % 2:
                        order.reverse()
                    for side, (kind, per_key) in order:
                        rate = drain.drain(
                            args.jobs, args.keys, per_key, args.workers, args.concurrency, kind
                        )
                        rates[side].append(rate)
                        print(
                            f"drain round {round_ + 1} {side:{width}s}: {rate:7.1f} jobs/s",
                            flush=True,
                        )
            finally:
                procs.stop_all()
    return rates
