"""The plain-Celery side's result signal: one appended line per event in a shared file.

A plain task writes ``<event> <tag> <hostname> <unix time>`` with a single ``os.write`` on
an ``O_APPEND`` descriptor (atomic for a short line on a local file system), which costs
a few microseconds: much less than a result backend, so the plain figures are not slowed
by the measuring. The bench tails the file.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

ENV = "BENCH_MARKS"

_fd: tuple[int, str, int] | None = None  # (pid, path, descriptor)
_guard = threading.Lock()


def record(event: str, tag: str, host: str = "-") -> float:
    """Append one mark to the file named by ``$BENCH_MARKS``; returns the time written."""
    global _fd  # noqa: PLW0603 - one descriptor per process, re-opened after a fork
    path = os.environ[ENV]
    now = time.time()
    with _guard:
        if _fd is None or _fd[0] != os.getpid() or _fd[1] != path:
            _fd = (os.getpid(), path, os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
        os.write(_fd[2], f"{event} {tag} {host or '-'} {now:.6f}\n".encode())
    return now


@dataclasses.dataclass(frozen=True)
class Mark:
    event: str
    tag: str
    host: str
    at: float


class MarkReader:
    """Reads marks appended since the last call, keeping every mark seen, grouped by tag."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self.by_tag: dict[str, list[Mark]] = {}

    def poll(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            event, tag, host, at = line.decode().split(" ")
            self.by_tag.setdefault(tag, []).append(Mark(event, tag, host, float(at)))

    def marks(self, tag: str, event: str | None = None) -> list[Mark]:
        return [m for m in self.by_tag.get(tag, []) if event is None or m.event == event]
