"""jobctl commands for time and operations: schedules, prune, explain, replay-check,
metrics.

What loads SQLAlchemy, Celery or the metrics library is declared below as a module imported
on first use, so ``jobctl --help`` loads none of it.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
from typing import TYPE_CHECKING, Any

import click

import jobs
from jobs._core.states import State
from jobs._core.validate import MAX_RETENTION_DAYS, check_lookup_id, printable
from jobs.application import default_app
from jobs.cli.command_modules import explain as diagnosis
from jobs.cli.command_modules import live_workers as workers
from jobs.cli.command_modules import metrics as prometheus
from jobs.cli.command_modules import replay_check as replays
from jobs.cli.command_modules import sweeper
from jobs.cli.core_commands import parse_inputs
from jobs.cli.group import Finite, main

if TYPE_CHECKING:
    from jobs._core.schedule_ticks import Schedule
    from jobs._store import JobStore


def _store() -> JobStore:
    """The process's store (loads SQLAlchemy: only when a command runs)."""
    return default_app().runtime.store


def _iso(instant: Any) -> str | None:
    return None if instant is None else instant.isoformat(timespec="seconds")


def _schedule_dict(schedule: Schedule, now: Any) -> dict[str, Any]:
    start = schedule.last_tick or schedule.created_at or now
    try:
        upcoming = schedule.next_tick(start)
    except Exception:  # a row no check lets in any more: listed, with no next tick
        upcoming = None
    return {
        "name": schedule.name,
        "kind": schedule.kind,
        "schedule": schedule.spec,
        "timezone": schedule.timezone,
        "catch_up": schedule.catch_up,
        "source": schedule.source,
        "inputs": schedule.inputs,
        "last_tick": _iso(schedule.last_tick),
        "next_tick": _iso(upcoming),
        "overdue": upcoming is not None and upcoming <= now,
    }


@main.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="A JSON list, for scripts.")
@click.pass_context
def schedules(ctx: click.Context, as_json: bool) -> None:
    """Periodic jobs with their last and next tick (fired by the sweepers)."""
    if ctx.invoked_subcommand is not None:
        return

    store = _store()
    now = store.reads.now()
    found = [_schedule_dict(schedule, now) for schedule in store.reads.schedules()]
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    if not found:
        click.echo("no schedules (@jobs.job(..., schedule='0 * * * *') or jobctl schedules add)")
        return
    rows = [
        (
            s["name"],
            s["kind"],
            s["schedule"],
            s["timezone"],
            s["catch_up"],
            s["last_tick"] or "-",
            (s["next_tick"] or "- (cannot be computed: jobctl schedules remove it)")
            + (" (overdue: is a sweeper running?)" if s["overdue"] else ""),
        )
        for s in found
    ]
    header = ("NAME", "KIND", "SCHEDULE", "TZ", "CATCH_UP", "LAST_TICK", "NEXT_TICK")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@schedules.command("add")
@click.argument("name")
@click.argument("kind")
@click.argument("spec")
@click.option("--input", "input_json", default="{}", help="Each tick's job inputs (JSON object).")
@click.option("--timezone", default="UTC", show_default=True, help="IANA zone for cron fields.")
@click.option(
    "--catch-up",
    type=click.Choice(["latest", "all"]),
    default="latest",
    show_default=True,
    help="After downtime: only the most recent missed tick, or every one.",
)
def add_schedule(
    name: str, kind: str, spec: str, input_json: str, timezone: str, catch_up: str
) -> None:
    """Create or change schedule NAME: a job of KIND at every tick of SPEC.

    SPEC is cron ("0 * * * *", "@daily") or an interval ("every 5m").
    """

    made = jobs.schedule(
        name, kind, spec, inputs=parse_inputs(input_json), timezone=timezone, catch_up=catch_up
    )
    click.echo(
        f"{made.name}: {made.kind} at {made.spec} ({made.timezone}, catch_up={made.catch_up})"
    )


@schedules.command("remove")
@click.argument("name")
def remove_schedule(name: str) -> None:
    """Stop schedule NAME (jobs it already submitted are left alone)."""

    if not jobs.unschedule(name):
        raise click.ClickException(f"unknown schedule {name!r:.80}")
    click.echo(f"{name}: removed")


@main.command()
@click.option(
    "--older-than",
    "older_than",
    type=Finite(0, MAX_RETENTION_DAYS),
    help="Days since a job finished (default: JOBS_RETENTION_DAYS).",
)
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for scripts.")
def prune(older_than: float | None, dry_run: bool, as_json: bool) -> None:
    """Delete finished jobs (COMPLETED, FAILED, CANCELLED) with their steps and history."""

    days = default_app().settings.retention_days if older_than is None else older_than
    if days is None:
        raise click.ClickException(
            "JOBS_RETENTION_DAYS=none keeps finished jobs; give --older-than DAYS to prune"
        )
    store = _store()
    if dry_run:
        count = store.depth.count_prunable(days * sweeper.DAY_SECONDS)
    else:
        count = 0
        while True:  # small batches, each its own short transaction
            deleted = sweeper.prune(store, days)
            count += deleted
            if deleted == 0:
                break
    if as_json:
        click.echo(json.dumps({"older_than_days": days, "dry_run": dry_run, "jobs": count}))
        return
    verb = "would delete" if dry_run else "deleted"
    click.echo(f"{verb} {count} finished jobs older than {days:g} days")


@main.command()
@click.argument("job_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for scripts.")
@click.option(
    "--no-workers",
    is_flag=True,
    help="Do not ask the live workers (over the broker) which queues and kinds they serve.",
)
def explain(job_id: str, as_json: bool, no_workers: bool) -> None:
    """Why a job is where it is, and what an operator can do."""

    app = default_app()
    store = _store()
    check_lookup_id(job_id)
    serving = None
    if not no_workers and store.reads.get(job_id).state is State.QUEUED:
        serving = workers.live_workers(app.celery)
    found = diagnosis.explain(store, app.settings, job_id, serving)
    if as_json:
        click.echo(json.dumps(found.as_dict(), indent=2))
        return
    click.echo(printable(found.paragraph))
    for action in found.actions:
        click.echo(f"  - {action}")


@main.command("replay-check")
@click.option("--kind", help="Only jobs of this kind.")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice([state.value for state in State], case_sensitive=False),
    help="Only jobs in this state (repeatable); default: the states that resume "
    "(QUEUED, RUNNING, WAITING, WAITING_APPROVAL).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for scripts.")
def replay_check(kind: str | None, states: tuple[str, ...], as_json: bool) -> None:
    """Replay the deployed code against live jobs' recorded steps, in dry mode.

    Nothing unrecorded runs and nothing is written. Exits 1 if a job would end
    NonDeterministic (or its kind is gone) under this code: a gate before a deploy."""

    app = default_app()
    chosen = [State(state.upper()) for state in states] or list(replays.LIVE_STATES)
    report = replays.replay_check(
        _store(),
        app.registry,
        chosen,
        kind,
        default_max_attempts=app.settings.default_max_attempts,
        run_versions=app.settings.run_versions,
    )
    if as_json:
        found = {
            "checked": report.checked,
            "counts": report.counts(),
            "seconds": round(report.seconds, 3),
            "findings": [verdict.as_dict() for verdict in report.findings],
        }
        click.echo(json.dumps(found, indent=2))
    else:
        for verdict in report.findings:
            click.echo(
                printable(
                    f"{verdict.verdict}: {verdict.job_id} ({verdict.kind}, "
                    f"{verdict.state.value}): {verdict.detail}"
                )
            )
        counts = ", ".join(f"{count} {name}" for name, count in report.counts().items())
        click.echo(f"replayed {report.checked} jobs in {report.seconds:.1f} s: {counts}")
    if report.blocks_deploy:
        raise SystemExit(1)


@main.command()
@click.option("--port", type=click.IntRange(1, 65535), default=9464, show_default=True)
@click.option("--addr", default="0.0.0.0", show_default=True, help="Address to listen on.")  # noqa: S104
def metrics(port: int, addr: str) -> None:
    """Serve Prometheus metrics read from the job tables on http://ADDR:PORT/metrics."""

    try:
        settings = default_app().settings
        prometheus.serve(_store(), port, settings.lease_seconds, addr, default_queue=settings.queue)
    except OSError as err:
        raise click.ClickException(f"cannot listen on {addr}:{port}: {err.strerror}") from None
    click.echo(f"serving metrics on http://{addr}:{port}/metrics (Ctrl-C stops)")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with contextlib.suppress(KeyboardInterrupt):
        stop.wait()
