"""jobctl stats and limits: how many jobs wait, run and ended, by state and kind, the oldest
due job's wait, and each kind's backpressure limits (read and set); jobctl pause and resume:
a kind or a queue none of whose jobs any worker claims until it is resumed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from jobs._core.errors import InvalidInput
from jobs._core.states import State
from jobs._core.validate import (
    MAX_KIND_LIMIT,
    clip,
    printable,
)
from jobs.application import default_app
from jobs.cli.bulk_commands import _operator
from jobs.cli.command_modules import pause_clauses as pausing
from jobs.cli.group import main

if TYPE_CHECKING:  # the store and the runtime load SQLAlchemy: only when a command runs
    from jobs._core.records import Pause
from jobs.cli.render import echo_json, iso, runtime, table

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
    pauses = store.reads.pauses()
    kind_pauses = {pause.name: pause for pause in pauses if pause.scope == "kind"}
    held = store.depth.held_by_pauses()
    kind_limits = store.reads.limits()
    by_keys = store.depth.held_by_keys()
    by_rates = store.depth.held_by_rates()
    limits = {
        kind: {
            "max_running": None if limit is None else limit.max_running,
            "running": counts.get((kind, State.RUNNING.value), 0),
            "max_queued": None if limit is None else limit.max_queued,
            "queued": counts.get((kind, State.QUEUED.value), 0),
            "max_running_per_key": None if limit is None else limit.max_running_per_key,
            "keys_at_limit": by_keys.get(kind, (0, 0))[0],
            "held_by_keys": by_keys.get(kind, (0, 0))[1],
            "rate_limit": None if limit is None else limit.rate_limit,
            "rate_limit_per_key": None if limit is None else limit.rate_limit_per_key,
            "held_by_rate": by_rates.get(kind, 0),
            "paused": pause_dict(kind_pauses.get(kind)),
            "held_by_pause": held.get(kind, 0),
        }
        for kind, limit in sorted(
            {name: kind_limits.get(name) for name in {*kind_limits, *kind_pauses}}.items()
        )
    }
    return {
        "total": sum(by_state.values()),
        "limits": limits,
        "pauses": [pause_dict(pause) for pause in pauses],
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
    _queue_pauses(figures["pauses"])


def pause_dict(pause: Pause | None) -> dict[str, Any] | None:
    """A pause as JSON (``None``: not paused)."""
    if pause is None:
        return None
    return {
        "scope": pause.scope,
        "name": pause.name,
        "paused_at": iso(pause.paused_at),
        "paused_by": pause.paused_by,
        "reason": pause.reason,
    }


def _limitstable(limits: dict[str, dict[str, Any]]) -> None:
    def show(value: int | None) -> str:
        return "-" if value is None else str(value)

    def paused(value: dict[str, Any] | None) -> str:
        if value is None:
            return "-"
        return f"since {value['paused_at'][:19]}" + (
            f" by {printable(value['paused_by'])}" if value["paused_by"] else ""
        )

    def per_key(value: dict[str, Any]) -> str:
        if value["max_running_per_key"] is None:
            return "-"
        full = value["keys_at_limit"]
        held = f" ({full} keys full, {value['held_by_keys']} held)" if full else ""
        return f"{value['max_running_per_key']}{held}"

    def rate(value: dict[str, Any]) -> str:
        rates = [value["rate_limit"] or "-"]
        if value["rate_limit_per_key"] is not None:
            rates.append(f"{value['rate_limit_per_key']} per key")
        held = f" ({value['held_by_rate']} held)" if value["held_by_rate"] else ""
        return ", ".join(rates) + held

    table(
        ("KIND", "RUNNING", "MAX_RUNNING", "PER_KEY", "RATE", "QUEUED", "MAX_QUEUED", "PAUSED"),
        [
            (
                kind,
                str(v["running"]),
                show(v["max_running"]),
                per_key(v),
                rate(v),
                str(v["queued"]),
                show(v["max_queued"]),
                paused(v["paused"]),
            )
            for kind, v in limits.items()
        ],
    )


def _queue_pauses(pauses: list[dict[str, Any]]) -> None:
    queues = [pause for pause in pauses if pause["scope"] != "kind"]
    if queues:
        table(
            ("PAUSED QUEUE", "SINCE", "BY", "REASON"),
            [
                (
                    printable(pause["name"]),
                    pause["paused_at"][:19],
                    printable(pause["paused_by"] or "-"),
                    printable(pause["reason"] or "-"),
                )
                for pause in queues
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
        everything = stats_dict()
        figures = everything["limits"]
        if as_json:
            echo_json(figures)
            return
        if figures:
            _limitstable(figures)
        else:
            click.echo("no limits set (jobctl limits set KIND --max-running N --max-queued M)")
        _queue_pauses(everything["pauses"])


@limits.command("set")
@click.argument("kind")
@click.option(
    "--max-running", help="At most N RUNNING at once, all workers together; 'none' lifts it."
)
@click.option("--max-queued", help="Refuse submits while N are QUEUED; 'none' lifts it.")
@click.option(
    "--per-key",
    help="At most N RUNNING per concurrency key, all workers together; 'none' lifts it.",
)
@click.option(
    "--rate", help="At most N starts per s, m or h (60/m), all workers together; 'none' lifts it."
)
@click.option(
    "--rate-per-key", help="At most N starts per s, m or h of each key (10/m); 'none' lifts it."
)
def set_limits(
    kind: str,
    max_running: str | None,
    max_queued: str | None,
    per_key: str | None,
    rate: str | None,
    rate_per_key: str | None,
) -> None:
    """Set a kind's limits; an option left out keeps its current value."""
    store = runtime().store
    current = store.reads.limits().get(kind)
    kind_rate = (current.rate_limit if current else None) if rate is None else _rate(rate)
    key_rate = (
        (current.rate_limit_per_key if current else None)
        if rate_per_key is None
        else _rate(rate_per_key)
    )
    keyed = (
        (current.max_running_per_key if current else None)
        if per_key is None
        else _limit_value(per_key, "--per-key")
    )
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
    result = store.submissions.set_limits(
        kind,
        max_running=running,
        max_queued=queued,
        max_running_per_key=keyed,
        rate_limit=kind_rate,
        rate_limit_per_key=key_rate,
    )
    per_key_text = (
        "" if result.max_running_per_key is None else f" per_key={result.max_running_per_key}"
    )
    rate_text = "" if result.rate_limit is None else f" rate={result.rate_limit}"
    if result.rate_limit_per_key is not None:
        rate_text += f" rate_per_key={result.rate_limit_per_key}"
    click.echo(
        f"{result.kind}: max_running={result.max_running} max_queued={result.max_queued}"
        + per_key_text
        + rate_text
    )


def _rate(raw: str) -> str | None:
    """A ``--rate`` option's value: ``none`` lifts the rate, else N/s, N/m or N/h."""
    return None if raw.strip().lower() == "none" else raw


# -- pause and resume ----------------------------------------------------------------------


def _target(kind: str | None, queue: str | None) -> str:
    """``kind 'x'`` or ``queue 'q'``; a mistake (neither, both, a bad name) is refused
    before the database is opened."""
    scope, name = pausing.check_target(kind, queue)
    return f"{scope} {printable(name)!r}"


@main.command()
@click.argument("kind", required=False)
@click.option("--queue", help="Pause a queue (every kind whose doorbells go there) instead.")
@click.option("--by", default=_operator, help="Who pauses; shown by explain and limits.")
@click.option("--reason", help="Why; shown by explain and limits.")
def pause(kind: str | None, queue: str | None, by: str, reason: str | None) -> None:
    """Stop every worker claiming a kind's (or a queue's) jobs until `jobctl resume`.

    Nothing fails or is lost: jobs stay QUEUED (submits go on), doorbells that arrive are
    dropped, and jobs already RUNNING finish. A kind no job or code knows yet may be
    paused (a note says so)."""
    _target(kind, queue)
    app = default_app()
    store = app.runtime.store
    before = {(found.scope, found.name) for found in store.reads.pauses()}
    done = app.limits.pause(kind, queue=queue, by=by, reason=reason)
    if (done.scope, done.name) in before:
        click.echo(f"already {done.describe()}; unchanged")
        return
    click.echo(f"{done.describe()}: no worker claims its jobs until `jobctl resume`")
    if kind is not None and kind not in app.registry.names():
        known = {name for name, _state in store.depth.counts()} | set(store.reads.limits())
        if kind not in known:
            click.echo(
                f"note: no job of kind {printable(kind)!r} exists and no code here registers "
                "it (a typo?); the pause holds it from its first job on",
                err=True,
            )


@main.command()
@click.argument("kind", required=False)
@click.option("--queue", help="Resume a queue instead.")
def resume(kind: str | None, queue: str | None) -> None:
    """Lift a pause: ring the doorbells of the due jobs it held, so they run now."""
    target = _target(kind, queue)
    done = default_app().limits.resume(kind, queue=queue)
    if done.pause is None:
        click.echo(f"{target} was not paused; nothing changed")
        return
    click.echo(f"resumed {done.pause.describe()}; rang {len(done.rung)} waiting jobs")
