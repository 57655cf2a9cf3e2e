"""Flower against a real run: a real worker on RabbitMQ + PostgreSQL, Flower with basic
auth, a real job; Flower's HTTP API must show the worker and the task with the job ID."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

import jobs
from jobs._store.db import make_engine
from jobs._store.schema import upgrade
from jobs.application import default_app
from tests.conftest import AMQP_URL, service_unavailable

pytestmark = [pytest.mark.acceptance, pytest.mark.rabbitmq, pytest.mark.postgres]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _amqp_reachable() -> None:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=2):
            pass
    except OSError as err:
        service_unavailable("RabbitMQ", err)


@contextlib.contextmanager
def _process(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        child = subprocess.Popen(
            args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield child
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)
        try:
            child.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def _poll(fetch: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException):
            last = fetch()
            if last:
                return last
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}; last answer: {last!r}")


def test_flower_shows_worker_and_job_task(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _amqp_reachable()
    queue = f"flower-{uuid.uuid4().hex[:8]}"
    settings_env = {
        "JOBS_DATABASE_URL": pg_url,
        "JOBS_BROKER_URL": AMQP_URL,
        "JOBS_QUEUE": queue,
        "JOBS_IMPORTS": "jobs.examples.check_order",
        "JOBS_DATA_DIR": str(tmp_path / "data"),
    }
    for key, value in settings_env.items():
        monkeypatch.setenv(key, value)
    default_app().reset_settings()
    jobs.reset()
    upgrade(make_engine(pg_url))
    env = {**os.environ, **settings_env}
    port = _free_port()
    auth = ("admin", "s3cret")
    worker_cmd = [
        sys.executable,
        "-m",
        "jobs",
        "worker",
        "--pool",
        "solo",
        "--hostname",
        f"flowertest-{queue}@%h",
    ]
    flower_cmd = [
        sys.executable,
        "-m",
        "jobs",
        "flower",
        f"--port={port}",
        "--address=127.0.0.1",
        f"--basic-auth={auth[0]}:{auth[1]}",
    ]
    base = f"http://127.0.0.1:{port}"
    with (
        _process(flower_cmd, env, tmp_path / "flower.log"),
        _process(worker_cmd, env, tmp_path / "worker.log"),
    ):
        try:
            _poll(lambda: requests.get(f"{base}/healthcheck", timeout=2).ok, 30, "Flower to start")
            # Without credentials Flower refuses: basic auth is really on.
            assert requests.get(f"{base}/api/workers", timeout=5).status_code == 401

            def worker_seen() -> bool:
                answer = requests.get(f"{base}/api/workers?refresh=1", auth=auth, timeout=10)
                return answer.ok and any(queue in name for name in answer.json())

            _poll(worker_seen, 60, "Flower to list the worker")
            job_id = jobs.submit(
                "check_order",
                {"order_id": 7, "check_seconds": 0.1},
                job_id=f"FLOWER-{uuid.uuid4().hex[:6]}",
            )

            def job_task() -> dict[str, Any] | None:
                tasks = requests.get(f"{base}/api/tasks", auth=auth, timeout=5).json()
                for task in tasks.values():
                    if job_id in str(task.get("args")) and task.get("state") == "SUCCESS":
                        return dict(task)
                return None

            task = _poll(job_task, 60, f"Flower to show the task for {job_id}")
            assert task["name"] == "jobs.check_order"  # the kind, by name
            assert job_id in str(task["result"])
            assert jobs.get(job_id).state is jobs.State.COMPLETED
        except AssertionError:
            for name in ("flower.log", "worker.log"):
                print(f"--- {name}\n{(tmp_path / name).read_text()[-4000:]}")
            raise
