"""Child processes of the bench (workers, the sweeper): started in their own session,
killed as a group, and all stopped however the bench ends."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Best effort (Linux): the child is SIGKILLed if the bench itself is SIGKILLed."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclasses.dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    hostname: str = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class Processes:
    def __init__(self, logs: Path, cwd: Path) -> None:
        self.logs = logs
        self.cwd = cwd
        self.children: list[Child] = []

    def start(self, name: str, argv: list[str], env: dict[str, str], hostname: str = "") -> Child:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                env=env,
                cwd=self.cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - no threads hold locks here
            )
        child = Child(name, proc, log, hostname)
        self.children.append(child)
        return child

    def start_worker(
        self,
        name: str,
        app: str,
        queue: str,
        concurrency: int,
        env: dict[str, str],
        loglevel: str = "INFO",
        pool: str = "prefork",
    ) -> Child:
        """A real ``celery worker`` (``pool``, ``-c concurrency``) on its own queue: the plain
        side as ``celery -A app worker``; the durable side (``app`` is ``jobs.celery_app``) as
        the process ``jobctl worker`` execs, each as its users run it."""
        hostname = f"{name}@%h"
        command = (
            ["-m", "jobs._worker.main"]
            if app == "jobs.celery_app"
            else ["-m", "celery", "-A", app, "worker"]
        )
        argv = [
            sys.executable,
            *command,
            "-Q",
            queue,
            "-c",
            str(concurrency),
            "-P",
            pool,
            "-n",
            hostname,
            "-l",
            loglevel,
            # No cluster chatter with other workers on the same broker (other engineers'
            # test runs); both sides get the same flags.
            "--without-gossip",
            "--without-mingle",
        ]
        return self.start(name, argv, env, hostname=name)

    def wait_ready(self, child: Child, timeout: float = 60.0) -> None:
        """Until the worker logs ``<hostname> ready.`` (it consumes from then on)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not child.alive():
                raise RuntimeError(
                    f"{child.name} exited with {child.proc.returncode}:\n{child.log_tail()}"
                )
            with contextlib.suppress(OSError):
                if " ready." in child.log.read_text(errors="replace"):
                    return
            time.sleep(0.05)
        raise TimeoutError(f"{child.name} not ready after {timeout:.0f}s:\n{child.log_tail()}")

    def kill(self, child: Child) -> float:
        """SIGKILL the whole process group (the worker and its pool); returns the kill time."""
        at = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.proc.wait()
        return at

    def stop_many(self, children: list[Child], timeout: float = 10.0) -> None:
        self._stop(children, timeout)

    def stop_all(self, timeout: float = 10.0) -> None:
        self._stop(self.children, timeout)

    def _stop(self, children: list[Child], timeout: float) -> None:
        """SIGTERM (warm shutdown), then SIGKILL to whatever is left of each group. The
        leader is not reaped before the group is killed, so its ID cannot have been reused."""
        for child in children:
            if child.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in children:
            if child.proc.returncode is not None:
                continue
            while time.monotonic() < deadline and not _exited(child.pid):
                time.sleep(0.05)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.proc.wait()


def _exited(pid: int) -> bool:
    """Whether ``pid`` (our child) has exited, without reaping it."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None
