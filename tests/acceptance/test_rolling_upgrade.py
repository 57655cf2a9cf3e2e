"""A rolling upgrade from the previous release loses nothing (issue 26 part 6).

The previous release is this repository at :data:`PREVIOUS_RELEASE` (the commit before the
durability work: schema 0006), taken with ``git archive`` and run from its own folder by
the same interpreter. On PostgreSQL and RabbitMQ:

1. the old release's ``jobctl db upgrade``, sweeper and workers (a prefork pool and a
   threads pool) run a stream of jobs with durable timers between their steps;
2. this release's ``jobctl db upgrade`` applies its migrations (0007 on) under them; the old
   workers go on claiming, recording steps and completing jobs on the new schema;
3. this release's sweeper and worker start, the old sweeper and threads worker stop as a
   deploy stops them (SIGTERM), and the old prefork worker is SIGKILLed mid-flight;
4. every job completes, none is lost, and no recorded step ran again.

The previous release refuses to open its store on a newer schema, so a process of it that
starts after step 2 would fail (its workers' pool processes are warmed before the upgrade
here); from 0011 on a schema says which code it serves (:mod:`jobs._store.schema_floor`)
and this release's processes start on a newer release's schema that serves them
(tests/test_startup_checks.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from tests.acceptance.conftest import Proc, delete_rabbit_queue, wait_until
from tests.conftest import IN_CI, PG_ADMIN_URL

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres, pytest.mark.rabbitmq]

ROOT = Path(__file__).resolve().parents[2]

#: The previous release: the last commit before the durability work (issue 26), schema 0006.
PREVIOUS_RELEASE = "0c5b039c3eab848b6be004c909b1f5272506f2cd"
PREVIOUS_SCHEMA = "0006"

#: Jobs the old release submits before the upgrade, and this release after it.
JOBS, LATE_JOBS = 30, 20

KINDS = """
import os
import time

import jobs

EFFECTS = os.environ["ROLLING_EFFECTS"]


def effect(job_id, name):
    with open(EFFECTS, "a") as effects:
        effects.write(f"{job_id} {name} {os.getpid()}\\n")
    time.sleep(0.2)
    return name


@jobs.job("rolling", max_attempts=20)
def rolling(ctx, n):
    for name in ("a", "b", "c", "d"):
        ctx.step(name, effect, ctx.job_id, name)
        ctx.sleep(f"pause_{name}", 1.0)
    return n
"""


def previous_release(folder: Path) -> Path:
    """The previous release's ``jobs`` package in ``folder`` (``git archive``)."""
    archive = folder / "previous.tar"
    made = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "-o", str(archive), PREVIOUS_RELEASE, "jobs"],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        message = (
            f"the previous release {PREVIOUS_RELEASE[:10]} is not in this clone: {made.stderr}"
        )
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    tree = folder / "previous"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


@pytest.fixture
def database(pg_admin: Engine) -> Iterator[str]:
    """An empty database of the test's own (the old release migrates it), dropped after."""
    name = f"roll_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with pg_admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


class Release:
    """One release's processes: ``python -m jobs`` with its own ``PYTHONPATH``."""

    def __init__(self, name: str, env: dict[str, str], logs: Path) -> None:
        self.name, self.env, self.logs = name, env, logs
        self.procs: list[Proc] = []

    def jobctl(self, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "jobs", *args],
            env=self.env,
            input=stdin,
            cwd=self.logs.parent,  # not the checkout: ``-m`` puts the cwd first on the path
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{self.name} jobctl {args}: {done.stdout}{done.stderr}"
        return done.stdout

    def start(self, label: str, *args: str) -> Proc:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{self.name}-{label}.log"
        node = f"{self.name}-{label}-{uuid.uuid4().hex[:4]}@" if args[0] == "worker" else None
        extra = ["--hostname", f"{node}%h", "--without-mingle", "--without-gossip"] if node else []
        with log.open("ab") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "jobs", *args, *extra],
                env=self.env,
                cwd=self.logs.parent,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(f"{self.name}-{label}", popen, log, node)
        self.procs.append(proc)
        return proc


def steps_by_owner(engine: Engine) -> list[tuple[str, str, str]]:
    """(job, step, owner) of every recorded step, read with plain SQL (any schema)."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT job_id, name, owner FROM job_steps")).all()
    return [(row.job_id, row.name, row.owner) for row in rows]


def states(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT state, count(*) AS n FROM jobs GROUP BY state")).all()
    return {row.state: row.n for row in rows}


def test_a_rolling_upgrade_from_the_previous_release_loses_nothing(
    tmp_path: Path, database: str, amqp_url: str
) -> None:
    old_tree = previous_release(tmp_path)
    (tmp_path / "rolling_kinds.py").write_text(KINDS)
    effects = tmp_path / "effects.log"
    queue = f"roll-{uuid.uuid4().hex[:10]}"
    base = {key: value for key, value in os.environ.items() if not key.startswith("JOBS_")}
    base.update(
        PYTHONUNBUFFERED="1",
        JOBS_DATABASE_URL=database,
        JOBS_BROKER_URL=amqp_url,
        JOBS_QUEUE=queue,
        JOBS_IMPORTS="rolling_kinds",
        JOBS_LEASE_SECONDS="3",
        JOBS_SWEEP_INTERVAL_SECONDS="0.5",
        JOBS_DATA_DIR=str(tmp_path / "data"),
        ROLLING_EFFECTS=str(effects),
    )
    old = Release("old", {**base, "PYTHONPATH": f"{old_tree}:{tmp_path}"}, tmp_path / "logs")
    new = Release("new", {**base, "PYTHONPATH": f"{ROOT}:{tmp_path}"}, tmp_path / "logs")
    engine = create_engine(database)
    try:
        assert f"revision {PREVIOUS_SCHEMA}" in old.jobctl("db", "upgrade")
        old_sweeper = old.start("sweeper", "sweeper")
        old_prefork = old.start("prefork", "worker", "--pool", "prefork", "--concurrency", "2")
        old_threads = old.start("threads", "worker", "--pool", "threads", "--concurrency", "4")
        for worker in (old_prefork, old_threads):
            worker.wait_ready()
        lines = "".join(json.dumps({"n": n}) + "\n" for n in range(JOBS))
        submitted = old.jobctl("submit", "rolling", "--from-file", "-", stdin=lines).split()
        assert len(submitted) == JOBS

        # Both of the prefork worker's pool processes have run a job (opened their store):
        # the previous release checks the schema when a process opens it.
        def prefork_children_busy() -> bool:
            pids = {
                owner.rpartition(":")[2]
                for _, _, owner in steps_by_owner(engine)
                if old_prefork.owns(owner)
            }
            return len(pids) >= 2

        wait_until(prefork_children_busy, 60, "both old prefork children to record steps")

        upgraded = new.jobctl("db", "upgrade")
        assert "(head)" in upgraded, upgraded

        def old_steps() -> int:
            return sum(
                old_prefork.owns(owner) or old_threads.owns(owner)
                for _, _, owner in steps_by_owner(engine)
            )

        old_at_upgrade = old_steps()
        assert states(engine).get("COMPLETED", 0) < JOBS, "every job ended before the upgrade"

        # The old release goes on, on the new schema.
        wait_until(
            lambda: old_steps() >= old_at_upgrade + 10,
            60,
            "the old workers to record ten steps after it",
        )
        # ... and this release's jobs too: submitted by the new code, run by either.
        lines = "".join(json.dumps({"n": n}) + "\n" for n in range(JOBS, JOBS + LATE_JOBS))
        late = new.jobctl("submit", "rolling", "--from-file", "-", stdin=lines).split()

        new.start("sweeper", "sweeper")
        new_worker = new.start("prefork", "worker", "--pool", "prefork", "--concurrency", "2")
        new_worker.wait_ready()
        old_sweeper.terminate()
        old_threads.terminate()  # a deploy's stop: warm shutdown, running tasks finish
        killed = {str(pid) for pid in [old_prefork.pid, *old_prefork.pool_children()]}
        for pid in old_prefork.pool_children():
            os.kill(pid, signal.SIGKILL)
        old_prefork.kill(signal.SIGKILL)  # and one that dies mid-flight, pool and all
        for proc in (old_sweeper, old_threads, old_prefork):
            proc.popen.wait(30)

        wait_until(
            lambda: states(engine).get("COMPLETED", 0) == JOBS + LATE_JOBS,
            180,
            "every job to complete on the new release",
            interval=0.5,
        )
        assert states(engine) == {"COMPLETED": JOBS + LATE_JOBS}
        with engine.connect() as conn:
            results = dict(conn.execute(text("SELECT id, result FROM jobs")).all())
        done = sorted(results[job_id] for job_id in [*submitted, *late])
        assert done == list(range(JOBS + LATE_JOBS))

        # No recorded step ran again: for every job and step, the process that recorded it
        # was the last one to start its function, and started it once; an earlier start is
        # allowed only in the SIGKILLed worker (its record never written).
        runs: dict[tuple[str, str], list[str]] = defaultdict(list)
        for line in effects.read_text().splitlines():
            job_id, step, pid = line.split()
            runs[(job_id, step)].append(pid)
        recorded = steps_by_owner(engine)
        for job_id, step, owner in recorded:
            if step.startswith("pause"):
                continue  # timers run no function
            pids = runs[(job_id, step)]
            owner_pid = owner.rpartition(":")[2]
            assert pids[-1] == owner_pid, (job_id, step, owner, pids)
            assert pids.count(owner_pid) == 1, (job_id, step, owner, pids)
            assert set(pids[:-1]) <= killed, (job_id, step, owner, pids, killed)
        owners = {owner for _, _, owner in recorded}
        assert any(new_worker.owns(owner) for owner in owners), "the new worker took nothing over"
        assert any(old_threads.owns(owner) for owner in owners)
    except BaseException:
        for release in (old, new):
            for proc in release.procs:
                print(f"\n===== {proc.name} (exit {proc.popen.poll()}) =====")
                print(proc.output()[-6000:])
        raise
    finally:
        for release in (old, new):
            for proc in release.procs:
                proc.terminate()
        time.sleep(1)
        for release in (old, new):
            for proc in release.procs:
                proc.kill_group()
        engine.dispose()
        delete_rabbit_queue(amqp_url, queue)
