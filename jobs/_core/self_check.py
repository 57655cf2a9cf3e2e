"""One process's answer to "does this library's private path still work?".

The doorbell publisher (py-amqp), the embedded broker's transport (kombu) and the held
completion's flight (psycopg) each lean on a private part of a pinned library. Each checks
it once per process, at first use, and falls back to the library's ordinary path with one
warning when the check finds a problem. :class:`SelfCheck` is that rule, shared: the first
caller runs the check (under a lock), later callers get the same answer. A check that
raises (the database went away mid-check) leaves the question open for the next caller.
The answer is about the libraries loaded in the process, so it holds across a fork.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class SelfCheck:
    """A once-per-process verdict on one private path (see the module's docstring).
    ``warn(problem)`` is called once when the answer is no: it should name the installed
    versions and what the process does instead."""

    def __init__(self, warn: Callable[[str], None]) -> None:
        self._warn = warn
        self._verdict: bool | None = None
        self._lock = threading.Lock()

    def verified(self, find_problem: Callable[[], str | None]) -> bool:
        """Whether the private path may be used: ``find_problem()`` (a problem, or
        ``None``) runs at the first call only; its exceptions propagate unanswered."""
        with self._lock:
            if self._verdict is None:
                problem = find_problem()
                if problem is not None:
                    self._warn(problem)
                self._verdict = problem is None
            return self._verdict

    def forget(self) -> None:
        """Check again at the next call (tests that change a library)."""
        with self._lock:
            self._verdict = None


__all__ = ["SelfCheck"]
