"""``make shop-flask`` / ``make shop-django`` (``examples/run.py``): one command starts a shop's
worker, sweeper and web app, an order placed over HTTP is checked by the worker, and SIGTERM
stops all (embedded default; the shops themselves are tested in depth in test_web_examples.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

from tests.acceptance.conftest import wait_until

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.acceptance
@pytest.mark.parametrize("shop", ["flask", "django"])
def test_one_command_runs_a_shop_and_stops_it(shop: str, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBS_", "SHOP_"))}
    env["JOBS_DATA_DIR"] = str(tmp_path / "data")
    log = (tmp_path / "run.log").open("wb")
    runner = subprocess.Popen(
        [sys.executable, str(REPO / "examples" / "run.py"), shop, "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    family: list[psutil.Process] = []
    try:

        def up() -> bool:
            try:
                return requests.get(f"{base}/orders/999", timeout=1).status_code == 404
            except requests.ConnectionError:
                return False

        wait_until(up, 60, f"the {shop} shop to answer")
        created = requests.post(
            f"{base}/orders", json={"customer": "ada", "total_cents": 500}, timeout=10
        )
        assert created.status_code == 201, created.text
        order = created.json()["order_id"]
        wait_until(
            lambda: requests.get(f"{base}/orders/{order}", timeout=5).json()["checked"],
            60,
            "the worker to check the order",
        )
        family = psutil.Process(runner.pid).children(recursive=True)
        assert len(family) >= 3  # the worker (and its pool), the sweeper and the web app
        commands = [" ".join(process.cmdline()) for process in family]
        assert any("sweeper" in command for command in commands), commands
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=30) == 0
        time.sleep(0.5)
        assert not [p for p in family if p.is_running() and p.status() != "zombie"]
    finally:
        if runner.poll() is None:
            runner.kill()
        for process in family:  # whatever a failed test left running
            if process.is_running():
                process.kill()
        log.close()
        if sys.exc_info()[0] is not None:
            print((tmp_path / "run.log").read_text(errors="replace")[-3000:])
