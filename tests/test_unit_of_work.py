"""The unit-of-work contract: a submit that joins the caller's transaction commits or rolls
back with it and rings its doorbell only after the commit; the process-wide heartbeat; the
process runtime object after a fork; and the writes a job makes (PostgreSQL: counted from
the transaction IDs stamped on its rows)."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

import jobs
from jobs import testing
from jobs._core.context import JobContext
from jobs._core.heartbeat import LeaseHeartbeat
from jobs._core.records import Batch
from jobs._store import JobStore
from jobs._store.tables import JobsTable
from jobs.application import default_app
from tests.conftest import snapshot


@jobs.job("uow_echo")
def uow_echo(ctx: JobContext, n: int = 0) -> int:
    return ctx.step("echo", lambda: n)


@jobs.job("uow_limited", max_queued=3)
def uow_limited(ctx: JobContext, n: int = 0) -> int:
    return n


class Doorbell:
    """Records what rang, and whether each job was visible to another connection when it
    did (it must be: the ring comes after the commit)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.rung: list[str] = []
        self.visible: list[bool] = []

    def __call__(self, job_id: str) -> None:
        with self.engine.connect() as other:
            found = other.execute(select(JobsTable.id).where(JobsTable.id == job_id)).first()
        self.rung.append(job_id)
        self.visible.append(found is not None)


@pytest.fixture
def app_engine(
    database: tuple[str, Engine], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Engine, Doorbell]]:
    """The API pointed at the test's database (SQLite file or PostgreSQL), with a doorbell
    that checks visibility; the "app" engine is the test's own, as a web app's would be."""
    url, engine = database
    monkeypatch.setenv("JOBS_DATABASE_URL", url)
    default_app().reset_settings()
    jobs.reset()
    bell = Doorbell(engine)
    jobs.set_doorbell(bell)
    yield engine, bell
    jobs.reset()


def count_jobs(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM jobs")).scalar_one())


# -- the store joins the caller's transaction ---------------------------------------------


def test_a_store_write_in_a_rolled_back_transaction_leaves_nothing(
    store: JobStore, engine: Engine
) -> None:
    before = snapshot(engine)
    with engine.connect() as conn:
        transaction = conn.begin()
        _job, created = store.submissions.create(
            "uow_echo", {"n": 1}, job_id="T-1", max_attempts=3, conn=conn
        )
        assert created
        assert conn.execute(text("SELECT count(*) FROM jobs")).scalar_one() == 1
        store.submissions.set_limits("uow_echo", max_running=1, max_queued=None, conn=conn)
        transaction.rollback()
    assert snapshot(engine) == before


def test_a_store_write_in_a_committed_transaction_is_there(store: JobStore, engine: Engine) -> None:
    with engine.begin() as conn:
        store.submissions.create("uow_echo", {"n": 1}, job_id="T-1", max_attempts=3, conn=conn)
    assert store.reads.get("T-1").state is jobs.State.QUEUED
    assert [t.reason for t in store.reads.history("T-1")] == ["submitted"]


# -- jobs.submit(connection=…) / (session=…) ---------------------------------------------


def test_submit_on_a_connection_rolled_back_writes_and_rings_nothing(
    app_engine: tuple[Engine, Doorbell],
) -> None:
    engine, bell = app_engine
    with engine.connect() as conn:
        jobs.submit("uow_echo", {"n": 1}, connection=conn)
        conn.rollback()  # the order failed
    assert count_jobs(engine) == 0
    assert bell.rung == []


def test_submit_on_a_connection_rings_once_after_the_commit(
    app_engine: tuple[Engine, Doorbell],
) -> None:
    engine, bell = app_engine
    with engine.begin() as conn:
        first = jobs.submit("uow_echo", {"n": 1}, connection=conn)
        second = jobs.submit("uow_echo", {"n": 2}, connection=conn)
        assert bell.rung == []  # nothing before the commit
    assert bell.rung == [first, second]
    assert bell.visible == [True, True]
    # the connection's next transaction rings only its own jobs
    with engine.connect() as conn:
        third = jobs.submit("uow_echo", {"n": 3}, connection=conn)
        conn.rollback()
        fourth = jobs.submit("uow_echo", {"n": 4}, connection=conn)
        conn.commit()
    assert bell.rung == [first, second, fourth]
    assert count_jobs(engine) == 3
    with pytest.raises(jobs.UnknownJob):
        jobs.get(third)


def test_submit_on_a_session_commits_and_rolls_back_with_it(
    app_engine: tuple[Engine, Doorbell],
) -> None:
    engine, bell = app_engine
    with Session(engine) as session:
        kept = jobs.submit("uow_echo", {"n": 1}, session=session)
        session.commit()
        assert bell.rung == [kept]
        dropped = jobs.submit("uow_echo", {"n": 2}, session=session)
        session.rollback()
        assert bell.rung == [kept]
    assert bell.visible == [True]
    assert jobs.get(kept).state is jobs.State.QUEUED
    with pytest.raises(jobs.UnknownJob):
        jobs.get(dropped)


def test_a_commit_whose_doorbell_fails_is_left_to_the_sweeper(
    app_engine: tuple[Engine, Doorbell],
) -> None:
    engine, _bell = app_engine

    def broken(job_id: str) -> None:
        raise ConnectionError("broker unreachable")

    jobs.set_doorbell(broken)
    with engine.begin() as conn:
        job_id = jobs.submit("uow_echo", {"n": 1}, connection=conn)
    assert jobs.get(job_id).dispatched_at is None  # the next sweep sends it at once
    assert default_app().runtime.store.doorbells.take_due_doorbell_ids(300) == [job_id]


def test_admission_refuses_before_the_callers_commit(
    app_engine: tuple[Engine, Doorbell],
) -> None:
    engine, _bell = app_engine
    jobs.submit_many("uow_limited", [{"n": i} for i in range(3)])
    started = time.monotonic()
    with pytest.raises(jobs.AdmissionRefused), engine.begin() as conn:
        jobs.submit("uow_limited", {"n": 9}, connection=conn)
    # Not a speed test: the refusal's metrics counter once waited out SQLite's 30 s busy
    # timeout for the write lock the caller's own transaction held (a web request hung).
    assert time.monotonic() - started < 15
    assert count_jobs(engine) == 3


def test_at_most_one_unit_of_work(app_engine: tuple[Engine, Doorbell]) -> None:
    engine, _bell = app_engine
    with engine.connect() as conn, Session(engine) as session, pytest.raises(TypeError):
        jobs.submit("uow_echo", connection=conn, session=session)


# -- submit_many ------------------------------------------------------------------------


def test_submit_many_is_one_transaction_with_submits_rules(
    app_engine: tuple[Engine, Doorbell],
) -> None:
    engine, bell = app_engine
    ids = jobs.submit_many("uow_echo", [{"n": i} for i in range(50)])
    assert len(set(ids)) == 50
    assert bell.rung == ids
    # caller-chosen IDs are idempotent one by one; a mismatch writes nothing of the batch
    chosen = jobs.submit_many("uow_echo", [{"n": 1}, {"n": 2}], job_ids=["A", "B"])
    assert chosen == ["A", "B"]
    assert jobs.submit_many("uow_echo", [{"n": 1}], job_ids=["A"]) == ["A"]
    with pytest.raises(jobs.DuplicateJob):
        jobs.submit_many("uow_echo", [{"n": 7}, {"n": 99}], job_ids=["C", "A"])
    with pytest.raises(jobs.UnknownJob):
        jobs.get("C")
    # every input is checked before anything is written
    with pytest.raises(jobs.InvalidInput, match="job 2 of 2"):
        jobs.submit_many("uow_echo", [{"n": 1}, {"n": float("nan")}])
    # admission counts the whole batch: all or none
    with pytest.raises(jobs.AdmissionRefused, match="4 more do not fit"):
        jobs.submit_many("uow_limited", [{"n": i} for i in range(4)])
    assert jobs.list_jobs(kind="uow_limited") == []
    assert count_jobs(engine) == 52


# -- one heartbeat per process -----------------------------------------------------------


def test_one_heartbeat_renews_every_live_claim_and_drops_those_it_no_longer_runs(
    engine: Engine,
) -> None:
    store = JobStore(engine)  # the database's own clock
    for job_id in ("A", "B", "C"):
        store.submissions.create("uow_echo", {}, job_id=job_id, max_attempts=3)
    claims = {job_id: store.ownership.claim(job_id, "me", 0.6) for job_id in ("A", "B", "C")}
    lost: list[str] = []
    heartbeat = LeaseHeartbeat(store, lease_seconds=0.6)  # beats every 0.2 s
    try:
        for job_id in ("A", "B", "C"):
            claim = claims[job_id]
            assert claim is not None
            heartbeat.watch(claim, lambda err, job_id=job_id: lost.append(job_id))
        first_leases = {job_id: store.reads.get(job_id).lease_until for job_id in claims}
        claim_c = claims["C"]
        assert claim_c is not None
        heartbeat.unwatch(claim_c)  # the process no longer runs C
        store.operator.cancel("B")  # B is taken away: its owner must be told
        time.sleep(1.0)
        assert first_leases["A"] is not None
        # Beats every 0.2 s; on a busy machine the thread may get its first turn late.
        deadline = time.monotonic() + 10
        while (renewed := store.reads.get("A").lease_until) == first_leases["A"]:
            assert time.monotonic() < deadline, "A's lease was never renewed"
            time.sleep(0.05)
        assert renewed is not None
        assert renewed > first_leases["A"]
        c = store.reads.get("C")
        assert c.lease_until == first_leases["C"]  # not renewed
        assert store.ownership.claim("C", "rescuer", 30) is not None  # its lease ran out
        assert lost == ["B"]
        assert [claim.job_id for claim in heartbeat.watching()] == ["A"]
    finally:
        heartbeat.stop()


# -- the runtime object after a fork ----------------------------------------------------


@pytest.mark.postgres
def test_a_forked_child_builds_its_own_engine_and_liveness_lock(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, clean_pg_engine: Engine
) -> None:
    monkeypatch.setenv("JOBS_DATABASE_URL", pg_url)
    default_app().reset_settings()
    jobs.reset()
    parent = default_app().runtime
    parent_key = parent.liveness_key()
    assert parent_key is not None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running any test machinery
        try:
            child = default_app().runtime
            child_key = child.liveness_key()
            with child.engine.connect() as conn:
                backend = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            report = f"{child is parent} {child.engine is parent.engine} {child_key} {backend}"
        except BaseException as err:
            report = f"error {err!r}"
        os.write(write, report.encode())
        os._exit(0)
    os.close(write)
    _pid, status = os.waitpid(pid, 0)
    report = os.read(read, 4096).decode().split()
    os.close(read)
    assert status == 0, report
    same_object, same_engine, child_key, child_backend = report
    assert same_object == "False"
    assert same_engine == "False"
    assert int(child_key) != parent_key
    with parent.engine.connect() as conn:  # the parent's lock survived the child's exit
        held = set(conn.execute(text("SELECT objid FROM pg_locks WHERE locktype='advisory'")))
        mine = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    assert held, "the parent's liveness lock is gone"
    assert int(child_backend) != mine


# -- the writes a job makes -------------------------------------------------------------


@pytest.mark.postgres
def test_a_one_step_job_makes_three_write_transactions_submit_included(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, clean_pg_engine: Engine
) -> None:
    """Counted from the transaction IDs stamped on the job's history and step rows: every
    write of a job leaves one (the heartbeat's renewals aside)."""
    monkeypatch.setenv("JOBS_DATABASE_URL", pg_url)
    default_app().reset_settings()
    jobs.reset()
    jobs.set_doorbell(None)
    job = testing.perform_job("uow_echo", {"n": 5})
    assert job.state is jobs.State.COMPLETED
    assert job.result == 5
    with clean_pg_engine.connect() as conn:
        writers: Any = conn.execute(
            text(
                "SELECT xmin::text FROM job_transitions WHERE job_id = :id "
                "UNION SELECT xmin::text FROM job_steps WHERE job_id = :id"
            ),
            {"id": job.id},
        ).scalars()
        assert len(set(writers)) == 3  # submit; claim; last step + completion


# -- a batch of doorbells on RabbitMQ ---------------------------------------------------


@pytest.mark.rabbitmq
def test_a_batch_of_doorbells_is_published_and_confirmed_once_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kombu import Connection  # noqa: PLC0415

    from jobs._doorbell.ringer import CeleryRinger  # noqa: PLC0415
    from jobs._worker.celery_setup import make_app  # noqa: PLC0415
    from tests.conftest import AMQP_URL, service_unavailable  # noqa: PLC0415

    queue = f"uow-batch-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("JOBS_BROKER_URL", AMQP_URL)
    monkeypatch.setenv("JOBS_QUEUE", queue)
    default_app().reset_settings()
    ids = [f"job-{i}" for i in range(300)]
    settings = default_app().settings
    publisher = CeleryRinger(settings, celery=lambda: make_app(settings))
    try:
        publisher(Batch(tuple(ids)))
        publisher.flush()  # the default reads confirmations later; now they are all in
    except OSError as err:
        service_unavailable("RabbitMQ", err)
    assert publisher.waiting() == 300  # what the sweeper reads before re-sending stale ones
    got = []
    with Connection(AMQP_URL) as connection:
        channel = connection.channel()
        try:
            while (message := channel.basic_get(queue, no_ack=True)) is not None:
                args, _kwargs, _embed = json.loads(message.body)
                assert message.headers["task"] == "jobs.run"
                got.append(args[0])
        finally:
            channel.queue_delete(queue)
    assert got == ids
