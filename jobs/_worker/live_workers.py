"""Which live workers consume which queues and know which kinds: asked of the workers
themselves through Celery's remote control (``inspect active_queues`` and ``registered``),
so ``jobctl explain`` can say that a job waits on a queue no live worker serves, or one
whose workers do not know its kind."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

log = logging.getLogger("jobs")

INSPECT_SECONDS = 1.5


@dataclasses.dataclass(frozen=True)
class WorkerSeen:
    """One live worker as it answered: its node name, the queues it consumes and the task
    names it has registered (``jobs.<kind>`` for each kind it knows)."""

    name: str
    queues: frozenset[str]
    tasks: frozenset[str]


def live_workers(celery: Any, timeout: float = INSPECT_SECONDS) -> list[WorkerSeen] | None:
    """The workers that answered within ``timeout`` seconds (an empty list: none did), or
    ``None`` when the broker could not be asked at all."""
    try:
        inspect = celery.control.inspect(timeout=timeout)
        queues = inspect.active_queues() or {}
        tasks = inspect.registered() or {}
    except Exception as err:  # a hint for an operator, never a failure of the command
        log.debug("could not ask the workers: %s", err)
        return None
    return [
        WorkerSeen(
            name,
            frozenset(str(queue.get("name")) for queue in consumed if isinstance(queue, dict)),
            frozenset(str(task).split(" ")[0] for task in tasks.get(name) or ()),
        )
        for name, consumed in sorted(queues.items())
    ]
