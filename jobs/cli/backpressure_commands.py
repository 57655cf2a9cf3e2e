"""jobctl stats and limits: how many jobs wait, run and ended, by state and kind, the oldest
due job's wait, and each kind's backpressure limits (read and set)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from jobs._core.errors import InvalidInput
from jobs._core.states import State
from jobs._core.validate import (
    MAX_KIND_LIMIT,
    clip,
)
from jobs.cli.group import main

if TYPE_CHECKING:  # the store and the runtime load SQLAlchemy: only when a command runs
    pass
from jobs.cli.render import echo_json, runtime, table

# -- stats ---------------------------------------------------------------------------------


def stats_dict() -> dict[str, Any]:
    """Counts with every state present (zeros too), so dashboards need no defaults."""
    store = runtime().store
    by_state = {state.value: 0 for state in State}
    by_kind: dict[str, int] = {}
    for (kind, state), count in sorted(store.depth.counts().items()):
        by_state[state] = by_state.get(state, 0) + count
        by_kind[kind] = by_kind.get(kind, 0) + count
    oldest = store.depth.oldest_queued()
    counts = store.depth.counts()
    limits = {
        kind: {
            "max_running": limit.max_running,
            "running": counts.get((kind, State.RUNNING.value), 0),
            "max_queued": limit.max_queued,
            "queued": counts.get((kind, State.QUEUED.value), 0),
        }
        for kind, limit in sorted(store.reads.limits().items())
    }
    return {
        "total": sum(by_state.values()),
        "limits": limits,
        "by_state": by_state,
        "by_kind": by_kind,
        "queue_depth": by_state[State.QUEUED.value],
        "oldest_queued": None
        if oldest is None
        else {
            "id": oldest[0],
            "age_seconds": round(oldest[1], 3),
        },
    }


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for scripts.")
def stats(as_json: bool) -> None:
    """Jobs by state and kind, and how long the oldest due job has waited."""
    figures = stats_dict()
    if as_json:
        echo_json(figures)
        return
    click.echo(f"jobs: {figures['total']}")
    table(("STATE", "COUNT"), [(s, str(n)) for s, n in figures["by_state"].items()])
    if figures["by_kind"]:
        table(("KIND", "COUNT"), [(k, str(n)) for k, n in figures["by_kind"].items()])
    oldest = figures["oldest_queued"]
    waiting = (
        "none due"
        if oldest is None
        else (f"oldest due {oldest['id']} waiting {oldest['age_seconds']:.1f}s")
    )
    click.echo(f"queue depth: {figures['queue_depth']} QUEUED; {waiting}")
    if figures["limits"]:
        _limitstable(figures["limits"])


def _limitstable(limits: dict[str, dict[str, int | None]]) -> None:
    def show(value: int | None) -> str:
        return "-" if value is None else str(value)

    table(
        ("KIND", "RUNNING", "MAX_RUNNING", "QUEUED", "MAX_QUEUED"),
        [
            (
                kind,
                str(v["running"]),
                show(v["max_running"]),
                str(v["queued"]),
                show(v["max_queued"]),
            )
            for kind, v in limits.items()
        ],
    )


# -- limits --------------------------------------------------------------------------------


def _limit_value(raw: str | None, name: str) -> int | None:
    if raw is None or raw.lower() == "none":
        return None
    text = raw.strip()
    sign, digits = (text[0], text[1:]) if text[:1] in ("+", "-") else ("", text)
    if not digits.isascii() or not digits.isdigit():
        raise InvalidInput(f"{name} {clip(raw, 40)!r} is not a whole number or 'none'")
    magnitude = digits.lstrip("0")
    if sign == "-" and magnitude:
        raise InvalidInput(f"{name} must be at least 0")
    # Compared by length first: int() of more than 4,300 digits raises.
    if len(magnitude) > len(str(MAX_KIND_LIMIT)) or int(digits) > MAX_KIND_LIMIT:
        raise InvalidInput(f"{name} must be from 0 to {MAX_KIND_LIMIT}, or 'none'")
    return int(digits)


@main.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object by kind, for scripts.")
@click.pass_context
def limits(ctx: click.Context, as_json: bool) -> None:
    """Backpressure per kind: how many may run and wait at once (held in the database)."""
    if ctx.invoked_subcommand is None:
        figures = stats_dict()["limits"]
        if as_json:
            echo_json(figures)
        elif figures:
            _limitstable(figures)
        else:
            click.echo("no limits set (jobctl limits set KIND --max-running N --max-queued M)")


@limits.command("set")
@click.argument("kind")
@click.option(
    "--max-running", help="At most N RUNNING at once, all workers together; 'none' lifts it."
)
@click.option("--max-queued", help="Refuse submits while N are QUEUED; 'none' lifts it.")
def set_limits(kind: str, max_running: str | None, max_queued: str | None) -> None:
    """Set a kind's limits; an option left out keeps its current value."""
    store = runtime().store
    current = store.reads.limits().get(kind)
    running = (
        (current.max_running if current else None)
        if max_running is None
        else (_limit_value(max_running, "--max-running"))
    )
    queued = (
        (current.max_queued if current else None)
        if max_queued is None
        else (_limit_value(max_queued, "--max-queued"))
    )
    result = store.submissions.set_limits(kind, max_running=running, max_queued=queued)
    click.echo(f"{result.kind}: max_running={result.max_running} max_queued={result.max_queued}")
