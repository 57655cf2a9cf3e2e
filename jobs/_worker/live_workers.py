"""Which live workers consume which queues and know which kinds: asked of the workers
themselves through Celery's remote control (``inspect active_queues`` and ``registered``),
so ``jobctl explain`` can say that a job waits on a queue no live worker serves, or one
whose workers do not know its kind, or do not run the version it was recorded under."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from jobs._worker.installed import VERSIONS_FIELD

log = logging.getLogger("jobs")

INSPECT_SECONDS = 1.5


@dataclasses.dataclass(frozen=True)
class WorkerSeen:
    """One live worker as it answered: its node name, the queues it consumes, the task
    names it has registered (``jobs.<kind>`` for each kind it knows) and, by task name, the
    versions of the kind it runs (``*``: the kind has none; a task missing: the worker did
    not say, an older one)."""

    name: str
    queues: frozenset[str]
    tasks: frozenset[str]
    versions: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)

    def runs(self, task: str, version: str) -> bool | None:
        """Whether this worker claims a job of ``task``'s kind recorded under ``version``
        (``None``: it did not say)."""
        told = self.versions.get(task)
        return None if told is None else bool(told & {"*", version})


def registered_task(entry: str) -> tuple[str, frozenset[str] | None]:
    """One entry of ``inspect registered``'s answer (``jobs.ship [jobs_versions=2,1]``):
    the task's name and the versions it said it runs (``None``: it did not say)."""
    name, _, fields = str(entry).partition(" ")
    for field in fields.strip("[]").split(" "):
        key, equals, value = field.partition("=")
        if equals and key == VERSIONS_FIELD:
            return name, frozenset(each for each in value.split(",") if each)
    return name, None


def live_workers(celery: Any, timeout: float = INSPECT_SECONDS) -> list[WorkerSeen] | None:
    """The workers that answered within ``timeout`` seconds (an empty list: none did), or
    ``None`` when the broker could not be asked at all."""
    try:
        inspect = celery.control.inspect(timeout=timeout)
        queues = inspect.active_queues() or {}
        tasks = inspect.registered(VERSIONS_FIELD) or {}
    except Exception as err:  # a hint for an operator, never a failure of the command
        log.debug("could not ask the workers: %s", err)
        return None
    seen = []
    for name, consumed in sorted(queues.items()):
        told = [registered_task(entry) for entry in tasks.get(name) or ()]
        seen.append(
            WorkerSeen(
                name,
                frozenset(str(queue.get("name")) for queue in consumed if isinstance(queue, dict)),
                frozenset(task for task, _versions in told),
                {task: versions for task, versions in told if versions is not None},
            )
        )
    return seen
