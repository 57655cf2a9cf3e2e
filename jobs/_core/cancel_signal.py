"""A run's cancel signal: set once its job is cancelled, with callbacks called then.

The heartbeat learns of a cancel from a refused renewal and sets the signal from its own
thread; the handler reads it (``ctx.cancelled``) or registers a callback
(``ctx.on_cancel``) that unblocks a blocking call. Each callback is called exactly once:
when the signal is set, or at once if it is set already.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from jobs._core.errors import InvalidInput

log = logging.getLogger("jobs.context")


class CancelSignal:
    """Whether a run's job was cancelled, and what to call when it is.

    ``set()`` is called once the run learns of the cancel (from any thread);
    ``call_when_set(callback)`` registers a callback, or calls it at once when the signal
    is set already. A callback that raises is logged, never raised."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self._seen = False  # set under the lock; read without it (one bool)
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], object]] = []

    def is_set(self) -> bool:
        """Whether the run has learnt that its job was cancelled."""
        return self._seen

    def set(self) -> None:
        """Mark the job cancelled and call the registered callbacks, in this thread."""
        with self._lock:
            self._seen = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            self._call(callback)

    def call_when_set(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` once when the signal is set (at once if it is already)."""
        if not callable(callback):
            raise InvalidInput(f"on_cancel needs a callable, got {type(callback).__name__}")
        with self._lock:
            if not self._seen:
                self._callbacks.append(callback)
                return
        self._call(callback)

    def _call(self, callback: Callable[[], object]) -> None:
        try:
            callback()
        except Exception:
            log.exception("job %s: an on_cancel callback raised", self.job_id)


__all__ = ["CancelSignal"]
