"""jobctl's operator actions on jobs picked by ID or by filter: ``retry`` (one job, from the
step that failed), and ``retry``, ``cancel`` and ``approve`` of many jobs at once.

Acting on many jobs (``jobctl retry --kind sync_invoice --state FAILED --error-like
Timeout``): the filters are ``jobctl list``'s; without one the command refuses. It shows
the count first, asks before it writes (``--yes`` skips the question, ``--dry-run``
writes nothing), and works in short batches that each commit. Each job is written only
while it is still in the state and under the fence it was selected with: one that moved
on meanwhile is skipped, untouched, and reported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import getpass
import json
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from jobs._core import reasons
from jobs._core.errors import IllegalTransition, InvalidInput
from jobs._core.records import BulkOutcome, JobFilter, Selected
from jobs._core.states import APPROVABLE, CANCELLABLE, RETRYABLE, State
from jobs._core.validate import (
    ERROR_PATTERN_LENGTH,
    MAX_LIST_LIMIT,
    check_error_pattern,
    check_instant,
    clip,
    printable,
)
from jobs.application import JobsApp, default_app
from jobs.cli.group import main

#: Jobs written per transaction: short enough to hold no lock for long, large enough that
#: a thousand jobs take a few seconds.
BATCH_SIZE = 100
#: At most this many jobs per command unless ``--limit`` says otherwise.
DEFAULT_BULK_LIMIT = 10_000
#: Job IDs a report lists before it says "and N more".
SHOWN_IDS = 20

_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_SPAN_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}

F = TypeVar("F", bound=Callable[..., Any])


def _app() -> JobsApp:
    return default_app()


def parse_since(text: str, now: Callable[[], dt.datetime]) -> dt.datetime:
    """``--since``: an ISO 8601 instant with its offset (``2025-03-01T09:00:00+01:00``), or
    a span back from now on the database's clock (``90s``, ``30m``, ``2h``, ``1d``)."""
    span = _SPAN.match(text)
    if span is not None:
        seconds = float(span.group(1)) * _SPAN_SECONDS[span.group(2)]
        if seconds > 366 * 86_400:
            raise InvalidInput(f"--since {clip(text, 40)!r} reaches back more than a year")
        return now() - dt.timedelta(seconds=seconds)
    try:
        instant = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(
            f"--since {clip(text, 60)!r} is neither an ISO 8601 instant nor a span like 2h"
        ) from None
    if instant.tzinfo is None:
        raise InvalidInput(f"--since {clip(text, 60)!r} has no offset; add Z or +HH:MM")
    return check_instant(instant, "--since")


def job_filter(
    state: str | None,
    kind: str | None,
    since: str | None,
    error_like: str | None,
    queue: str | None = None,
) -> JobFilter:
    """The options of ``jobctl list`` and of the bulk actions as a :class:`JobFilter`."""
    if error_like is not None:
        check_error_pattern(error_like, "--error-like")
    return JobFilter(
        state=State(state.upper()) if state else None,
        kind=kind,
        since=None if since is None else parse_since(since, _app().store.reads.now),
        error_like=error_like,
        queue=queue,
        default_queue=_app().settings.queue,
    )


def filter_options(command: F) -> F:
    """``--since``, ``--error-like`` and ``--queue``, the filters ``jobctl list`` shares with
    the bulk actions (which add ``--kind`` and ``--state``: :func:`bulk_options`)."""
    command = click.option(
        "--queue",
        metavar="QUEUE",
        help="Only jobs whose doorbells go to QUEUE (JOBS_QUEUE for jobs that name none).",
    )(command)
    command = click.option(
        "--error-like",
        "error_like",
        metavar="TEXT",
        help="Only jobs whose last error contains TEXT (case-insensitive and literal: % and _ "
        f"are no wildcards; at most {ERROR_PATTERN_LENGTH} characters).",
    )(command)
    return click.option(
        "--since",
        metavar="WHEN",
        help="Only jobs changed at or after WHEN: an ISO 8601 instant, or a span (30m, 2h, 1d).",
    )(command)


@dataclasses.dataclass(frozen=True)
class Bulk:
    """How a bulk action was asked for: the selection's options and the reporting's."""

    state: str | None
    kind: str | None
    since: str | None
    error_like: str | None
    queue: str | None
    dry_run: bool
    limit: int
    as_json: bool
    yes: bool

    @property
    def filtered(self) -> bool:
        """Whether any filter was given (a bulk action refuses to run without one)."""
        given = (self.state, self.kind, self.since, self.error_like, self.queue)
        return any(value is not None for value in given)


def bulk_options(command: F) -> F:
    """The selection's options (``jobctl list``'s filters, ``--dry-run``, ``--limit``,
    ``--json``, ``--yes``), handed to ``command`` as one :class:`Bulk` named ``bulk``."""

    @functools.wraps(command)
    def with_bulk(
        *args: Any,
        state: str | None,
        kind: str | None,
        since: str | None,
        error_like: str | None,
        queue: str | None,
        dry_run: bool,
        limit: int,
        as_json: bool,
        yes: bool,
        **kwargs: Any,
    ) -> Any:
        bulk = Bulk(state, kind, since, error_like, queue, dry_run, limit, as_json, yes)
        return command(*args, bulk=bulk, **kwargs)

    decorated: Any = with_bulk
    for option in (
        click.option("--yes", is_flag=True, help="Act on many jobs without asking first."),
        click.option("--json", "as_json", is_flag=True, help="One JSON report, for scripts."),
        click.option(
            "--limit",
            type=click.IntRange(1, MAX_LIST_LIMIT),
            default=DEFAULT_BULK_LIMIT,
            show_default=True,
            help="Act on at most N of the matching jobs, the oldest first.",
        ),
        click.option("--dry-run", is_flag=True, help="Count and list the jobs; change nothing."),
        filter_options,
        click.option("--kind", help="Many jobs: those of this kind."),
        click.option(
            "--state",
            type=click.Choice([s.value for s in State], case_sensitive=False),
            help="Many jobs: those in this state.",
        ),
    ):
        decorated = option(decorated)
    return decorated  # type: ignore[no-any-return]


@dataclasses.dataclass(frozen=True)
class Action:
    """One bulk action: its name, the states it applies to, and its write of one batch."""

    name: str
    done: str  # "retried"
    applies_to: tuple[State, ...]
    write: Callable[[Sequence[Selected]], BulkOutcome]


def run_bulk(action: Action, job_id: str | None, bulk: Bulk) -> bool:
    """Run ``action`` on the jobs ``bulk`` selects, if it asks for many jobs; ``False``
    when it does not (the caller acts on ``job_id`` alone). Refuses an ID with filters, no
    ID and no filter, and a ``--state`` the action does not apply to."""
    if not bulk.filtered:
        if job_id is None:
            raise click.UsageError(
                f"give a job ID, or filters (--kind, --state, --since, --error-like) to "
                f"{action.name} many jobs"
            )
        if bulk.dry_run or bulk.as_json or bulk.yes:
            raise click.UsageError("--dry-run, --json and --yes go with filters, not an ID")
        return False
    if job_id is not None:
        raise click.UsageError("give a job ID or filters, not both")
    where = job_filter(bulk.state, bulk.kind, bulk.since, bulk.error_like, bulk.queue)
    if where.state is not None and where.state not in action.applies_to:
        names = " or ".join(state.value for state in action.applies_to)
        raise click.ClickException(
            f"{action.name} applies to {names} jobs, not {where.state.value}"
        )
    _act(action, where, bulk)
    return True


def _act(action: Action, where: JobFilter, bulk: Bulk) -> None:
    app = _app()
    count, selected = app.jobs.select_jobs(where, bulk.limit, among=action.applies_to)
    report: dict[str, Any] = {
        "action": action.name,
        "filter": where.described(),
        "matched": count,
        "selected": len(selected),
        "dry_run": bulk.dry_run,
    }
    if not bulk.as_json:
        states = " or ".join(state.value for state in action.applies_to)
        line = f"{count} {states} jobs match {where.described()}"
        if count > len(selected):
            line += f"; acting on the oldest {len(selected)} (--limit)"
        click.echo(printable(line))
    if bulk.dry_run or not selected:
        report["ids"] = [seen.id for seen in selected]
        _finish(report, bulk, action, [seen.id for seen in selected], [])
        return
    if not bulk.yes:
        if not sys.stdin.isatty():
            raise click.ClickException(
                f"add --yes to {action.name} {len(selected)} jobs without a prompt"
            )
        click.confirm(f"{action.name.capitalize()} {len(selected)} jobs?", abort=True)
    done: list[str] = []
    skipped: list[str] = []
    batches = [selected[i : i + BATCH_SIZE] for i in range(0, len(selected), BATCH_SIZE)]
    progress: contextlib.AbstractContextManager[Any] = contextlib.nullcontext(None)
    if not bulk.as_json and sys.stdout.isatty():
        progress = click.progressbar(length=len(selected), label=action.done.capitalize())
    with progress as bar:
        for batch in batches:  # each batch its own short transaction
            outcome = action.write(batch)
            done.extend(job.id for job in outcome.done)
            skipped.extend(outcome.skipped)
            if bar is not None:
                bar.update(len(batch))
    report["done"] = len(done)
    report["skipped"] = skipped
    _finish(report, bulk, action, done, skipped)


def _ids(ids: Sequence[str]) -> str:
    shown = ", ".join(printable(job_id) for job_id in ids[:SHOWN_IDS])
    more = len(ids) - SHOWN_IDS
    return shown + (f" and {more} more" if more > 0 else "")


def _finish(
    report: dict[str, Any], bulk: Bulk, action: Action, done: list[str], skipped: list[str]
) -> None:
    if bulk.as_json:
        click.echo(json.dumps(report, indent=2))
        return
    if bulk.dry_run:
        if done:
            click.echo(f"would {action.name}: {_ids(done)}")
        click.echo("dry run: nothing changed")
        return
    if not report["selected"]:
        return
    click.echo(f"{action.done} {len(done)} jobs")
    if skipped:
        click.echo(
            f"skipped {len(skipped)} that changed since the selection (left untouched): "
            f"{_ids(skipped)}"
        )


def _operator() -> str:
    """Who runs jobctl, for ``--by``'s default: the login name, else ``jobctl``."""
    try:
        name = getpass.getuser()
    except (OSError, KeyError):  # no login name in a bare container
        return "jobctl"
    return name if name.strip() and name.isprintable() else "jobctl"


@main.command()
@click.argument("job_id", metavar="[ID]", required=False)
@click.option("--by", default=_operator, help="Who retries; recorded in the history.")
@click.option("--reason", default=reasons.RETRIED, show_default=True)
@click.option(
    "--from-start",
    is_flag=True,
    help="Drop the recorded steps: every step runs again (default: resume at the failed one).",
)
@bulk_options
def retry(job_id: str | None, by: str, reason: str, from_start: bool, bulk: Bulk) -> None:
    """Run a FAILED or CANCELLED job again from the step that failed, with a fresh budget
    of attempts; or many, selected by filter."""
    app = _app()
    action = Action(
        "retry",
        "retried",
        RETRYABLE,
        lambda batch: app.operator.retry_selected(
            batch, by=by, reason=reason, from_start=from_start
        ),
    )
    if run_bulk(action, job_id, bulk):
        return
    assert job_id is not None  # run_bulk refuses neither an ID nor a filter
    try:
        job = app.operator.retry(job_id, by=by, reason=reason, from_start=from_start)
    except IllegalTransition as err:
        raise click.ClickException(
            f"{err} (only a FAILED or CANCELLED job can be retried)"
        ) from None
    steps = "from the start" if from_start else "from the step that failed"
    click.echo(f"{job.id} {job.state.value}, runs again {steps}")


def bulk_approve(job_id: str | None, by: str, note: str | None, bulk: Bulk) -> bool:
    """``jobctl approve`` of many jobs (see :func:`run_bulk`)."""
    app = _app()
    action = Action(
        "approve",
        "approved",
        APPROVABLE,
        lambda batch: app.operator.approve_selected(batch, by=by, note=note),
    )
    return run_bulk(action, job_id, bulk)


def bulk_cancel(job_id: str | None, reason: str, bulk: Bulk) -> bool:
    """``jobctl cancel`` of many jobs (see :func:`run_bulk`)."""
    app = _app()
    action = Action(
        "cancel",
        "cancelled",
        CANCELLABLE,
        lambda batch: app.operator.cancel_selected(batch, reason=reason),
    )
    return run_bulk(action, job_id, bulk)


__all__ = [
    "BATCH_SIZE",
    "Bulk",
    "bulk_approve",
    "bulk_cancel",
    "bulk_options",
    "filter_options",
    "job_filter",
    "parse_since",
    "retry",
    "run_bulk",
]
