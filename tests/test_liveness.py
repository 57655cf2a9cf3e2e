"""Liveness locks on PostgreSQL: a job whose owner process is gone can be taken over at once,
by a claim (a redelivered message) or by the sweeper, without waiting for the lease; a live
owner's job cannot. The fence still guards the old owner's writes."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.pool import NullPool

from jobs._core.errors import LeaseLost
from jobs._core.states import State
from jobs._store import JobStore
from jobs._store.db import make_engine
from jobs._store.schema import upgrade
from jobs._worker import liveness
from jobs.application import JobsApp, default_app
from tests.conftest import PG_ADMIN_URL

T = TypeVar("T")


def eventually(attempt: Callable[[], T], timeout: float = 5.0) -> T:
    """The server drops a closed session's locks a moment after the client hangs up."""
    deadline = time.monotonic() + timeout
    while True:
        result = attempt()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.02)


@pytest.fixture
def store(clean_pg_engine: Engine) -> JobStore:
    return JobStore(clean_pg_engine)


@pytest.fixture
def lock_holder(pg_url: str) -> Iterator[liveness.LivenessLock]:
    lock = liveness.LivenessLock(pg_url)
    lock.ensure()
    yield lock
    lock.release()


@pytest.mark.postgres
def test_held_keys_sees_the_lock(store: JobStore, lock_holder: liveness.LivenessLock) -> None:
    assert lock_holder.key in liveness.held_keys(store.engine)


@pytest.mark.postgres
def test_claim_takes_over_only_when_owner_lock_is_released(
    store: JobStore, lock_holder: liveness.LivenessLock
) -> None:
    store.submissions.create("k", {}, job_id="J", max_attempts=3)
    first = store.ownership.claim("J", "A", 300, liveness_key=lock_holder.key)
    assert first is not None
    # A holds its lock and a 300 s lease: nobody may take the job.
    assert store.ownership.claim("J", "B", 300) is None
    lock_holder.release()  # the owner's process "dies": its connection and lock are gone
    second = eventually(lambda: store.ownership.claim("J", "B", 300))
    assert second.fence == first.fence + 1
    assert second.job.attempts == 2
    history = store.reads.history("J")
    assert (history[-1].from_state, history[-1].to_state) == (State.RUNNING, State.RUNNING)
    with pytest.raises(LeaseLost):
        store.ownership.record_step(first, "late", {"by": "A"})
    assert [s.name for s in store.reads.steps("J")] == []


@pytest.mark.postgres
def test_sweeper_requeues_dead_owner_before_lease_expiry(
    store: JobStore, lock_holder: liveness.LivenessLock
) -> None:
    store.submissions.create("k", {}, job_id="J", max_attempts=3)
    assert store.ownership.claim("J", "A", 300, liveness_key=lock_holder.key) is not None
    assert liveness.rescue_dead_owners(store) == []  # alive: left alone
    lock_holder.release()
    rescued = eventually(lambda: liveness.rescue_dead_owners(store))
    assert [job.id for job in rescued] == ["J"]
    job = store.reads.get("J")
    assert job.state is State.QUEUED
    assert "died" in (job.last_error or "")


@pytest.mark.postgres
def test_a_lock_on_another_database_does_not_count(store: JobStore, pg_url: str) -> None:
    """pg_locks lists every database's locks: the same key held elsewhere is not our owner."""
    other = create_engine(PG_ADMIN_URL, poolclass=NullPool)
    with other.connect() as conn:
        key = 123456789
        conn.execute(select(func.pg_advisory_lock(key)))
        assert key not in liveness.held_keys(store.engine)
        store.submissions.create("k", {}, job_id="J", max_attempts=3)
        assert store.ownership.claim("J", "A", 300, liveness_key=key) is not None
        assert store.ownership.claim("J", "B", 300) is not None
    other.dispose()


def test_sqlite_liveness_is_the_owner_process(tmp_path: object) -> None:
    """Embedded: every worker shares this host, so the owner's PID tells whether it lives.
    The claim never takes over on that alone (PIDs are reused); the sweeper re-queues."""
    engine = make_engine(f"sqlite:///{tmp_path}/x.db")
    upgrade(engine)
    sqlite_store = JobStore(engine)
    assert JobsApp(
        dataclasses.replace(default_app().settings, database_url=f"sqlite:///{tmp_path}/x.db")
    ).runtime.liveness_key() == liveness.pid_key(os.getpid())
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(finished.stdout)
    assert not liveness.process_alive(dead_pid)
    assert liveness.process_alive(os.getpid())
    for job_id, pid in (("alive", os.getpid()), ("dead", dead_pid)):
        sqlite_store.submissions.create("k", {}, job_id=job_id, max_attempts=3)
        key = liveness.pid_key(pid)
        assert sqlite_store.ownership.claim(job_id, f"w:{pid}", 300, liveness_key=key) is not None
        assert sqlite_store.ownership.claim(job_id, "B", 300) is None
    rescued = liveness.rescue_dead_owners(sqlite_store)
    assert [job.id for job in rescued] == ["dead"]
    assert f"process {dead_pid} is gone" in (rescued[0].last_error or "")
    assert sqlite_store.reads.get("alive").state is State.RUNNING
    engine.dispose()


def _terminate_lock_session(engine: Engine, key: int) -> None:
    """Drop the one session holding ``key`` (our own test's lock), as a network cut would."""
    with engine.connect() as conn:
        pid = conn.execute(
            text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
                "AND ((classid::bigint << 32) | objid::bigint) = :key"
            ),
            {"key": key},
        ).scalar_one()
        conn.execute(select(func.pg_terminate_backend(pid)))
        conn.commit()


@pytest.mark.postgres
def test_a_dropped_lock_connection_is_taken_again_and_not_judged_dead(
    store: JobStore, lock_holder: liveness.LivenessLock
) -> None:
    """Issue 8: a live owner whose lock connection dropped must not look dead. The keeper
    takes the lock again within a round, and the sweeper looks twice before it rescues."""
    store.submissions.create("k", {}, job_id="J", max_attempts=3)
    assert store.ownership.claim("J", "A", 300, liveness_key=lock_holder.key) is not None
    _terminate_lock_session(store.engine, lock_holder.key)
    assert eventually(lambda: lock_holder.key not in liveness.held_keys(store.engine), 2)

    assert liveness.rescue_dead_owners(store) == []  # looked twice: the lock came back
    assert store.reads.get("J").state is State.RUNNING
    assert lock_holder.key in liveness.held_keys(store.engine)


@pytest.mark.postgres
def test_a_lock_missing_on_both_looks_is_a_dead_owner(
    store: JobStore, lock_holder: liveness.LivenessLock
) -> None:
    store.submissions.create("k", {}, job_id="J", max_attempts=3)
    assert store.ownership.claim("J", "A", 300, liveness_key=lock_holder.key) is not None
    lock_holder.release()  # the process is gone: nothing takes the lock again
    rescued = eventually(lambda: liveness.rescue_dead_owners(store, recheck_seconds=0.5))
    assert [job.id for job in rescued] == ["J"]


@pytest.mark.postgres
def test_the_server_uptime_is_known(store: JobStore) -> None:
    assert liveness.server_uptime(store.engine) > 0


def _in_another_pid_namespace(argv: list[str], env: dict[str, str]) -> str:
    """Run ``argv`` as another container would: its own PID namespace (and /proc), the same
    files. Needs root (CAP_SYS_ADMIN) and util-linux's unshare."""
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("another PID namespace needs root on Linux")
    finished = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", *argv],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 0, finished.stderr[-2000:]
    return finished.stdout


def test_a_sweeper_in_another_pid_namespace_leaves_a_live_owner_alone(tmp_path: object) -> None:
    """A sweeper in another container sharing the embedded data folder sees none of this
    namespace's PIDs: it must not call this live owner dead (it did, and the step ran three
    times at once). The owner's job is left to its lease there."""
    url = f"sqlite:///{tmp_path}/x.db"
    app = JobsApp(dataclasses.replace(default_app().settings, database_url=url))
    store = app.runtime.store
    store.submissions.create("k", {}, job_id="alive", max_attempts=3)
    claimed = store.ownership.claim(
        "alive", f"w:{os.getpid()}", 300, liveness_key=app.runtime.liveness_key()
    )
    assert claimed is not None
    env = {**os.environ, "JOBS_DATABASE_URL": url, "JOBS_DATA_DIR": str(tmp_path)}
    env.pop("JOBS_IMPORTS", None)
    out = _in_another_pid_namespace([sys.executable, "-m", "jobs", "sweeper", "--once"], env)
    assert "dead owners re-queued: 0" in out, out
    job = store.reads.get("alive")
    assert (job.state, job.owner, job.fence) == (State.RUNNING, claimed.owner, claimed.fence)
    app.reset()


@pytest.mark.postgres
def test_locks_taken_where_the_sweeper_cannot_see_them_turn_liveness_off(
    store: JobStore, pg_url: str
) -> None:
    """A JOBS_LIVENESS_DATABASE_URL naming another database than the jobs' put every lock
    out of the sweeper's sight (it reads the jobs database's locks), so every live owner
    looked dead. Such a lock proves nothing: liveness is off and the lease decides."""
    settings = dataclasses.replace(
        default_app().settings, database_url=pg_url, liveness_database_url=PG_ADMIN_URL
    )
    app = JobsApp(settings)
    try:
        key = app.runtime.liveness_key()
        store.submissions.create("k", {}, job_id="J", max_attempts=3)
        assert store.ownership.claim("J", "A", 300, liveness_key=key) is not None
        assert liveness.rescue_dead_owners(store, recheck_seconds=0) == []
        assert store.reads.get("J").state is State.RUNNING
        assert key is None
        assert "liveness: OFF" in liveness.describe(
            settings, liveness._elsewhere_reason(pg_url, PG_ADMIN_URL)
        )
    finally:
        app.reset()
