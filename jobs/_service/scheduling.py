"""``app.schedules``: periodic jobs held in the database for every sweeper — declared in
code (``@jobs.job(schedule=…)``) and written at start-up, or put and removed at run time."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jobs._core.registry import Registry
from jobs._core.schedule_ticks import Schedule, normalize_spec

if TYPE_CHECKING:  # SQLAlchemy loads on first use
    from jobs._worker.process import ProcessRuntime


class ScheduleService:
    """Periodic jobs (``app.schedules``; ``jobs.schedule``, ``jobs.unschedule`` and
    ``jobs.schedules`` are the default app's). ``registry``: the kinds a schedule may
    name; ``runtime``: the application's at the time of each call."""

    def __init__(self, registry: Registry, runtime: Callable[[], ProcessRuntime]) -> None:
        self._registry = registry
        self._runtime = runtime

    def put(
        self,
        name: str,
        kind: str,
        spec: str | int | float | dt.timedelta,
        *,
        inputs: dict[str, Any] | None = None,
        timezone: str = "UTC",
        catch_up: str = "latest",
    ) -> Schedule:
        """Create or change a periodic job at run time, held in the database for every
        sweeper.

        ``spec`` is a cron expression (``"*/15 * * * *"``, read in ``timezone``) or an
        interval (``"every 10m"``, seconds, a timedelta). Each tick submits one job of
        ``kind`` with ``inputs`` and the ID ``<name>@<tick>``; changing a schedule keeps its
        last tick.
        """
        inputs = {} if inputs is None else inputs
        self._registry.get(kind).check_inputs(inputs)
        spec = normalize_spec(spec)
        schedule = Schedule(name, kind, spec, timezone=timezone, inputs=inputs, catch_up=catch_up)
        return self._runtime().store.schedules.put_schedule(schedule)

    def remove(self, name: str) -> bool:
        """Stop a periodic job (its submitted jobs are left alone); False if it did not
        exist."""
        return self._runtime().store.schedules.delete_schedule(name)

    def all(self) -> list[Schedule]:
        """Every periodic schedule with its last tick (see :meth:`Schedule.next_tick`)."""
        return self._runtime().store.reads.schedules()

    def sync(self) -> list[Schedule]:
        """Write the schedules declared with ``@jobs.job(schedule=…)`` into the database
        (workers and sweepers do this at start-up). A kind whose schedule was removed from
        the code keeps its row until ``jobctl schedules remove NAME``: one process's partial
        imports must not stop another's schedule."""
        schedules = self._runtime().store.schedules
        return [
            schedules.put_schedule(
                Schedule(
                    kind.name,
                    kind.name,
                    kind.schedule,
                    timezone=kind.timezone,
                    catch_up=kind.catch_up,
                    source="code",
                )
            )
            for kind in self._registry.kinds()
            if kind.schedule is not None
        ]


__all__ = ["ScheduleService"]
