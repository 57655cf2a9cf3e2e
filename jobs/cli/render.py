"""How jobctl prints: the records as JSON-ready dicts (ISO 8601 instants with their offset,
the store's field names), stored text escaped, and plain tables; and the process's runtime,
imported on first use so ``--help`` stays fast."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from jobs._core.validate import (
    printable,
)
from jobs.application import default_app

if TYPE_CHECKING:  # the store and the runtime load SQLAlchemy: only when a command runs
    from jobs._core.records import Job, Step, Transition
    from jobs._worker.process import ProcessRuntime


def runtime() -> ProcessRuntime:
    """The process's runtime (built on first use, so ``--help`` opens nothing)."""
    return default_app().runtime


def iso(instant: dt.datetime | None) -> str | None:
    """Always with microseconds and offset, so every value parses the same way."""
    return None if instant is None else instant.isoformat(timespec="microseconds")


def job_dict(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "kind": job.kind,
        "state": job.state.value,
        "owner": job.owner,
        "lease_until": iso(job.lease_until),
        "fence": job.fence,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "priority": job.priority,
        "code_version": job.code_version,
        "inputs": job.inputs,
        "result": job.result,
        "last_error": job.last_error,
        "waiting_for": job.waiting_for,
        "parent_id": job.parent_id,
        "progress": job.progress,
        "run_after": iso(job.run_after),
        "created_at": iso(job.created_at),
        "updated_at": iso(job.updated_at),
        "finished_at": iso(job.finished_at),
    }


def step_dict(step: Step) -> dict[str, Any]:
    return {
        "name": step.name,
        "output": step.output,
        "recorded_at": iso(step.recorded_at),
        "owner": step.owner,
        "fence": step.fence,
        "position": step.position,
        "progress": step.progress,
    }


def transition_dict(move: Transition) -> dict[str, Any]:
    return {
        "from": move.from_state.value if move.from_state is not None else None,
        "to": move.to_state.value,
        "owner": move.owner,
        "fence": move.fence,
        "at": iso(move.at),
        "reason": move.reason,
        "approved_by": move.approved_by,
    }


def compact(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "), sort_keys=True, default=repr)


def shown(text: str | None) -> str:
    """Text from the ledger as one safe line: newlines, tabs, terminal escapes and other
    control characters are shown escaped (``\\n``, ``\\x1b``), so a note or reason can
    neither forge another line of output nor drive the terminal."""
    return "-" if text is None else printable(text)


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2))


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
