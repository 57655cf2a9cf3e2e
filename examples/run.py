"""One command for an example shop: its worker, its sweeper and its web app, together.

    python examples/run.py django [--port 8000]   # or: make shop-django
    python examples/run.py flask  [--port 5000]   # or: make shop-flask

The three processes get this environment: nothing set runs on the embedded default (a SQLite file
and a folder broker under the example's ``jobs-data/``); ``SHOP_DATABASE_URL=postgresql://…``
and ``JOBS_BROKER_URL=amqp://…`` put the shop on PostgreSQL and RabbitMQ. The Django shop is
migrated first (which also brings the job tables to head); the Flask shop's tables are created
first (``flask --app shop_flask init-db``). Ctrl-C or SIGTERM stops all three.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

HERE = Path(__file__).resolve().parent


def commands(shop: str, port: int) -> tuple[Path, list[list[str]], list[str]]:
    """(folder, set-up commands, [worker, sweeper, web]) of a shop."""
    python = sys.executable
    if shop == "django":
        manage = [python, "manage.py"]
        return (
            HERE / "django",
            [[*manage, "migrate", "--verbosity", "0"]],
            [
                [*manage, "jobs_worker"],
                [*manage, "jobs_sweeper"],
                [*manage, "runserver", f"127.0.0.1:{port}", "--noreload"],
            ],
        )
    flask = [python, "-m", "flask", "--app", "shop_flask"]
    return (
        HERE / "flask",
        # The tables first: a worker and a web app that both create them at once race
        # ("table shop_orders already exists").
        [[*flask, "init-db"]],
        [
            [*flask, "jobs", "worker"],
            [*flask, "jobs", "sweeper"],
            [*flask, "run", "--port", str(port)],
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="examples/run.py", description=__doc__.split("\n")[0])
    parser.add_argument("shop", choices=["django", "flask"])
    parser.add_argument("--port", type=int, help="the web app's port (8000 / 5000)")
    args = parser.parse_args(argv)
    port = args.port or (8000 if args.shop == "django" else 5000)
    folder, setup, processes = commands(args.shop, port)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
    for command in setup:
        if subprocess.run(command, cwd=folder, env=env, check=False).returncode != 0:
            print(f"examples/run.py: {' '.join(command[1:])} failed", file=sys.stderr)
            return 1
    children = [
        subprocess.Popen(argv, cwd=folder, env=env, start_new_session=True) for argv in processes
    ]
    stopping = False

    def stop(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    print(f"{args.shop} shop on http://127.0.0.1:{port} (worker pid {children[0].pid})", flush=True)
    while not stopping and all(child.poll() is None for child in children):
        time.sleep(0.2)
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)  # warm shutdown: running jobs handed back
    deadline = time.monotonic() + 15
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    failed = [child for child in children if child.returncode not in (0, -signal.SIGTERM)]
    return 1 if failed and not stopping else 0


if __name__ == "__main__":
    raise SystemExit(main())
