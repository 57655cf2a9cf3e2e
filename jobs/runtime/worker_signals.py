"""What a worker's signals do to the jobs it runs, where Celery's own handling falls short.

SIGHUP: off a terminal, Celery restarts the worker in place (a warm stop, then the process
executes itself again) without sending ``worker_shutting_down``, so running jobs were not
handed back: the restart waited for them to finish, however long they ran. The handler is
wrapped so they are handed back first, as on a warm shutdown. On a terminal Celery installs
none: SIGHUP is then the terminal closing.
"""

from __future__ import annotations

import logging
import signal
from typing import Any, Protocol

log = logging.getLogger("jobs")


class Flag(Protocol):
    """The worker's shutting-down flag, shared with its pool processes."""

    def set(self) -> None: ...


def hand_back_before_restart(shutting_down: Flag) -> None:
    """Wrap Celery's SIGHUP handler (installed by the time the worker is ready) so it sets
    ``shutting_down`` first: running jobs stop at their next step and go back to the queue."""
    restart = signal.getsignal(signal.SIGHUP)
    if not callable(restart):
        return

    def hand_back_then_restart(signum: int, frame: Any) -> None:
        shutting_down.set()
        restart(signum, frame)

    try:
        signal.signal(signal.SIGHUP, hand_back_then_restart)
    except ValueError:  # not the main thread: leave Celery's handler as it is
        log.warning("SIGHUP restarts this worker without handing running jobs back")
