"""How durable jobs hear a worker's Celery signals, and what the signals do to the jobs it
runs where Celery's own handling falls short.

Celery's signals are process-wide: a handler connected at import would run for every worker
of every Celery app in the process. So nothing connects at import: installing durable jobs on
an app (:func:`jobs._worker.celery_setup.install_runner`, which ``jobs.contrib.celery.install``
and ``make_app`` call) connects its handlers through :func:`connect_for_app`, once per app,
each told which app it serves. The worker signals durable jobs use send no app (a worker's
host name, the worker, its consumer), so each handler still checks that the worker is one of
its app's.

SIGHUP: off a terminal, Celery restarts the worker in place (a warm stop, then the process
executes itself again) without sending ``worker_shutting_down``, so running jobs were not
handed back: the restart waited for them to finish, however long they ran. The handler is
wrapped so they are handed back first, as on a warm shutdown. On a terminal Celery installs
none: SIGHUP is then the terminal closing.
"""

from __future__ import annotations

import logging
import signal
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from celery.utils.dispatch import Signal

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


AppHandler = Callable[..., None]
"""A signal handler for one Celery app: called with the app, then the signal's arguments."""

# What connect_for_app connected: (signal, dispatch_uid, the app, weakly), so that receivers
# of apps since collected are disconnected at the next connection.
_connected: list[tuple[Signal, str, weakref.ref[Any]]] = []
_connected_lock = threading.Lock()


def connect_for_app(celery: Any, signal: Signal, handler: AppHandler) -> None:
    """Connect ``handler`` to Celery's ``signal`` for the app ``celery``: each send calls
    ``handler(celery, sender=…, **arguments)`` while the app lives. Connected strongly
    (``weak=False``: the receiver is a closure no one else holds) under a ``dispatch_uid``
    naming the handler and the app, so connecting again for the same app adds nothing.

    The receiver holds the app weakly, so an app built and dropped (a test's, one rebuilt
    for new settings) is collected with its jobs application and its connections; its
    receivers, doing nothing since, are disconnected at the next connection (not from the
    collector, which may run while Celery's signal holds its lock), before an app at the
    same address could be taken for it."""
    uid = f"durable_jobs:{handler.__module__}.{handler.__qualname__}:{id(celery)}"
    app = weakref.ref(celery)

    def receiver(**arguments: Any) -> None:
        alive = app()
        if alive is not None:
            handler(alive, **arguments)

    receiver.__qualname__ = receiver.__name__ = f"{handler.__name__}_for_app"
    with _connected_lock:
        for entry in [entry for entry in _connected if entry[2]() is None]:
            entry[0].disconnect(dispatch_uid=entry[1])
            _connected.remove(entry)
        if any(uid == known and signal is of for of, known, _ in _connected):
            return
        signal.connect(receiver, weak=False, dispatch_uid=uid)
        _connected.append((signal, uid, app))
