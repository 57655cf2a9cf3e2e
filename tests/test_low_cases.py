"""The low cases of a careless or hostile operator: each one clear line, nothing written."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import threading
import unicodedata
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

import jobs
from jobs._core.context import JobContext
from jobs._core.errors import InvalidInput, UnknownKind
from jobs._core.registry import Registry
from jobs._core.states import State
from jobs._store.db import make_engine
from jobs._store.schema import upgrade
from jobs._sweeper.sweeper import run_forever
from jobs.application import default_app
from jobs.testing import perform_job
from tests.conftest import (
    AMQP_URL,
    PG_ADMIN_URL,
    error_line,
    jobctl,
    jobctl_in_child,
    one_line_error,
    private_pg_database,
    refused,
    start_worker,
)


@jobs.job("low_child")
def low_child(ctx: JobContext) -> int:
    return 1


@jobs.job("low_long_spawn_key", max_attempts=3)
def low_long_spawn_key(ctx: JobContext) -> None:
    ctx.spawn("low_child", {}, key="k" * 198)  # fits a key; "spawn:<key>" does not fit


@jobs.job("low_long_event", max_attempts=3)
def low_long_event(ctx: JobContext) -> None:
    ctx.wait_for_event("e" * 198, timeout=5)  # its step "event:<name>" does not fit


@pytest.mark.parametrize("kind", ["low_long_spawn_key", "low_long_event"])
def test_derived_step_names_past_the_column_fail_at_once(kind: str) -> None:
    """They were retried (every attempt failing the same way) instead of failing at once."""
    job = perform_job(kind, {})
    assert (job.state, job.attempts) == (State.FAILED, 1), job.last_error
    assert "at most 200 characters" in (job.last_error or "")


def test_an_unknown_kind_message_is_bounded() -> None:
    """Among 300 kinds, or for a 50,000-character name, it printed 10,000 to 50,000
    characters."""
    registry = Registry(imports=())
    for number in range(300):
        registry.register(f"kind_number_{number:03}", lambda ctx: None)
    for name in ("nosuch", "x" * 50_000):
        with pytest.raises(UnknownKind) as caught:
            registry.get(name)
        message = str(caught.value)
        assert len(message) < 1000, len(message)
        assert "and 280 more" in message
    assert "(50000 characters)" in message


def test_submit_many_refuses_one_string_of_ids() -> None:
    """``job_ids="ab"`` was split into the IDs "a" and "b"."""
    with pytest.raises(InvalidInput, match="not one string"):
        jobs.submit_many("low_child", [{}, {}], job_ids="ab")
    assert jobs.list_jobs() == []


def test_nfc_and_nfd_spellings_of_an_id_are_one_id() -> None:
    """Two jobs whose IDs look the same (é as one character, and as e + a combining accent)."""
    nfc, nfd = unicodedata.normalize("NFC", "café-1"), unicodedata.normalize("NFD", "café-1")
    assert nfc != nfd
    assert jobs.submit("low_child", job_id=nfc) == nfc
    with pytest.raises(InvalidInput, match="NFC") as caught:
        jobs.submit("low_child", job_id=nfd)
    assert repr(nfc) in str(caught.value)
    assert [job.id for job in jobs.list_jobs()] == [nfc]


def test_timezone_localtime_is_refused() -> None:
    """``localtime`` follows whatever zone each sweeper's host is set to."""
    for zone in ("localtime", "posixrules", "right/UTC"):
        one_line_error(
            jobctl("schedules", "add", "nightly", "low_child", "0 3 * * *", "--timezone", zone),
            "not an IANA time zone",
        )
    assert jobctl("schedules", "--json").output.strip() in ("[]", "")


def test_from_file_dev_zero_is_a_bounded_read() -> None:
    """It read without end and died of a MemoryError."""
    line = one_line_error(
        jobctl("submit", "low_child", "--from-file", "/dev/zero"),
        "line 1 is over 1048576 characters",
    )
    assert "JOBS_MAX_INPUT_BYTES" in line
    assert jobs.list_jobs() == []


def test_flower_options_with_a_space_are_one_line(tmp_path: Path) -> None:
    """``--port 5555`` ended in a Tornado traceback: Tornado takes ``--port=5555`` only.
    (In a child process: jobctl flower becomes Flower.)"""
    done = jobctl_in_child(
        {**os.environ, "JOBS_DATA_DIR": str(tmp_path)},
        *("flower", "--insecure-no-auth", "--port", "5555"),
    )
    line = error_line(done)
    assert "write --port=5555 instead of --port 5555" in line


@pytest.mark.postgres
def test_a_read_only_role_is_one_line(tmp_path: Path) -> None:
    """An 18-frame traceback; a worker on it said "ready" and failed every claim."""
    role = f"jobs_ro_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with private_pg_database("jobs_ro") as url:
        engine = make_engine(url)
        upgrade(engine)
        engine.dispose()
        owner = create_engine(url, isolation_level="AUTOCOMMIT")
        with owner.connect() as conn:
            conn.execute(text(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'"))
            conn.execute(text(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"))
        owner.dispose()
        try:
            read_only = make_url(url).set(username=role, password="pw")
            env = {k: v for k, v in os.environ.items() if not k.startswith("JOBS_")}
            env["JOBS_DATABASE_URL"] = read_only.render_as_string(hide_password=False)
            env["JOBS_BROKER_URL"] = AMQP_URL  # a server database needs a real broker
            env["JOBS_DATA_DIR"] = str(tmp_path)
            line = error_line(jobctl_in_child(env, "cancel", "some-job"))
            assert "permission denied" in line
            assert "SELECT, INSERT, UPDATE and DELETE" in line
            status, output = start_worker(env)
            refused(status, output, "may not write the job tables", "jobs: INSERT")
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{read_only.database}" WITH (FORCE)'))
                conn.execute(text(f"DROP ROLE IF EXISTS {role}"))
    admin.dispose()


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB file system (tmpfs) that a test can fill: needs root on Linux."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root on Linux")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        default_app().reset()
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path) -> Path:
    """Write a file until the disk is full; returns it (delete it to make room again)."""
    filler = disk / "filler"
    # Unbuffered: a write refused for want of room leaves nothing for close() to flush
    # (which would raise the same error outside the loop).
    with filler.open("wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError:
            pass
    return filler


def _use_data_dir(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    monkeypatch.setenv("JOBS_DATA_DIR", str(folder))
    default_app().reset_settings()
    default_app().reset()
    default_app().use_doorbell(None)


FULL_DISK: dict[str, Path] = {}


@jobs.job("low_disk_fills", max_attempts=3)
def low_disk_fills(ctx: JobContext) -> str:
    ctx.step("first", lambda: 1)
    filler = fill(FULL_DISK["disk"])
    threading.Timer(1.0, filler.unlink).start()  # room again a second later
    ctx.step("second", lambda: "x" * 300_000)
    return "done"


def test_a_full_disk_is_an_outage_not_the_jobs_failure(
    tiny_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's "database or disk is full" counted as the job's own failure (an attempt
    spent, the error recorded as the job's). It is the database failing to write: the
    write is held, as through any outage, and lands once there is room."""
    _use_data_dir(monkeypatch, tiny_disk)
    FULL_DISK["disk"] = tiny_disk
    job = perform_job("low_disk_fills", {})
    assert (job.state, job.attempts, job.last_error) == (State.COMPLETED, 1, None)
    assert [step.name for step in jobs.steps(job.id)] == ["first", "second"]


def test_a_sweeper_on_a_full_disk_logs_one_line_a_pass(
    tiny_disk: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each pass logged a traceback."""
    _use_data_dir(monkeypatch, tiny_disk)
    store = default_app().runtime.store
    for number in range(20):
        store.submissions.create(
            "low_child", {"pad": "p" * 5000}, job_id=f"j{number}", max_attempts=3
        )
        assert (
            store.ownership.claim(f"j{number}", "gone", 0.01) is not None
        )  # leases run out at once
    filler = fill(tiny_disk)
    settings = dataclasses.replace(default_app().settings, sweep_interval_seconds=0.2)
    stop = threading.Event()
    threading.Timer(1.5, stop.set).start()
    with caplog.at_level(logging.WARNING, logger="jobs"):
        run_forever(store, settings, default_app().runtime.ring_batch, stop=stop)
    filler.unlink()
    failed = [record for record in caplog.records if "pass failed" in record.getMessage()]
    assert failed, [record.getMessage() for record in caplog.records]
    assert all(record.exc_info is None for record in failed)
    assert all("disk is full" in record.getMessage() for record in failed)
