"""jobctl commands over the core alone: submit, show, list, approve, cancel, wake, db,
simulate (stats and limits: :mod:`jobs.cli.backpressure_commands`).

Every command reads the ledger through the default app's services (or the store), never through a
broker, so what it prints is what a recovering worker would see. Output meant for
scripts (``--json``) uses ISO 8601 instants with their offset and keeps the store's
field names.
"""

from __future__ import annotations

import datetime as dt
import json
import shlex
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

import click

import jobs
from jobs._core import reasons
from jobs._core.errors import AdmissionRefused, IllegalTransition, InvalidInput
from jobs._core.states import TERMINAL, State
from jobs._core.validate import (
    MAX_ATTEMPTS,
    MAX_DELAY_SECONDS,
    MAX_DEPTH,
    MAX_LIST_LIMIT,
    MAX_PRIORITY,
    MAX_SIMULATED_STEPS,
    MAX_SUBMIT_MANY,
    MAX_WAIT_SECONDS,
    check_instant,
    clip,
)
from jobs.cli.bulk_commands import (
    Bulk,
    _app,
    bulk_approve,
    bulk_cancel,
    bulk_options,
    filter_options,
    job_filter,
)
from jobs.cli.command_modules import schema, show_text
from jobs.cli.command_modules import simulate as replaying
from jobs.cli.group import Finite, main
from jobs.cli.render import (
    echo_json,
    job_dict,
    runtime,
    shown,
    step_dict,
    table,
    transition_dict,
)

if TYPE_CHECKING:  # the store and the runtime load SQLAlchemy: only when a command runs
    from jobs._core.records import Job, Step

#: The types of submit's bounded options (click refuses a value outside them, naming them).
ATTEMPTS = click.IntRange(min=1, max=MAX_ATTEMPTS)
PRIORITY = click.IntRange(min=0, max=MAX_PRIORITY)
DELAY = click.FloatRange(min=0, max=MAX_DELAY_SECONDS)  # NaN: the store refuses it in one line
SECONDS = Finite(0, MAX_DELAY_SECONDS)

#: sysexits.h EX_TEMPFAIL: "try again later", for a submit refused by backpressure.
EX_TEMPFAIL = 75


#: How often ``submit --wait`` re-reads the job; tests shorten it.
POLL_SECONDS = 0.3

# -- submit --------------------------------------------------------------------------------


def parse_inputs(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except RecursionError:
        raise InvalidInput(f"--input nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:  # not JSON, or an integer of more than 4,300 digits
        raise InvalidInput(f"--input is not valid JSON: {clip(str(err), 200)}") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"--input must be a JSON object, got {type(value).__name__}")
    return value


def parse_instant(text: str, what: str) -> dt.datetime:
    """An ISO 8601 instant with its offset (``Z`` or ``+01:00``); a bare local time is
    refused, since the database's clock, not this machine's, decides when it comes."""
    try:
        instant = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(f"{what} {clip(text, 60)!r} is not an ISO 8601 instant") from None
    if instant.tzinfo is None:
        raise InvalidInput(f"{what} {clip(text, 60)!r} has no offset; add Z or +HH:MM")
    check_instant(instant, what)
    return instant


def read_inputs_file(source: TextIO, limit: int) -> list[dict[str, Any]]:
    """The inputs of a JSON-lines file, one object per non-blank line (the first bad line
    named, nothing submitted). No line is read past ``limit`` characters: ``/dev/zero`` is
    one line of error, not memory exhaustion."""
    inputs: list[dict[str, Any]] = []
    number = 0
    while True:
        try:
            line = source.readline(limit + 1)
        except UnicodeDecodeError:
            raise InvalidInput(f"line {number + 1} is not valid UTF-8 text") from None
        if not line:
            return inputs
        number += 1
        if len(line.removesuffix("\n")) > limit:
            raise InvalidInput(f"line {number} is over {limit} characters (JOBS_MAX_INPUT_BYTES)")
        if not line.strip():
            continue
        if len(inputs) == MAX_SUBMIT_MANY:  # stop reading: the rest would be refused anyway
            raise InvalidInput(
                f"more than {MAX_SUBMIT_MANY} jobs in one file; split it (at most "
                f"{MAX_SUBMIT_MANY} per submit)"
            )
        try:
            inputs.append(parse_inputs(line))
        except InvalidInput as err:
            shown = str(err).replace("--input", "the line")
            raise InvalidInput(f"line {number}: {shown}") from None


@main.command()
@click.argument("kind")
@click.option(
    "--input",
    "input_json",
    default="{}",
    show_default=True,
    help="The job's inputs as a JSON object.",
)
@click.option("--id", "job_id", help="Choose the ID; the same ID and inputs again is a no-op.")
@click.option("--max-attempts", type=ATTEMPTS, help="Override the kind's limit.")
@click.option("--delay", type=DELAY, help="Seconds before the job is due (database clock).")
@click.option(
    "--run-at",
    "run_at",
    metavar="ISO8601",
    help="The instant the job is due, with its offset (2026-12-01T09:00:00+01:00).",
)
@click.option("--priority", type=PRIORITY, help="0 to 9, higher first (default: the kind's).")
@click.option(
    "--unique-for",
    type=SECONDS,
    help="For S seconds, the same kind and inputs (or --unique-key) print the first job's ID.",
)
@click.option("--unique-key", help="Deduplicate by this key instead of the inputs.")
@click.option(
    "--debounce",
    type=SECONDS,
    help="Run S seconds after the last submit of the same key, once, with its inputs.",
)
@click.option("--wait", is_flag=True, help="Follow the job until it ends or waits for approval.")
@click.option(
    "--timeout", type=Finite(0, MAX_WAIT_SECONDS), help="Give up waiting after S seconds."
)
@click.option(
    "--from-file",
    "from_file",
    type=click.File("r", encoding="utf-8"),
    help="Queue one job per line of a JSON-lines file of inputs ('-': standard input), "
    "all in one transaction; prints the IDs in order.",
)
def submit(
    *,
    kind: str,
    input_json: str,
    job_id: str | None,
    max_attempts: int | None,
    delay: float | None,
    run_at: str | None,
    priority: int | None,
    wait: bool,
    timeout: float | None,
    from_file: TextIO | None,
    unique_for: float | None,
    unique_key: str | None,
    debounce: float | None,
) -> None:
    """Queue a job of KIND and print its ID (with --unique-for or --debounce, the ID of the
    job already holding its key, if one does)."""
    if timeout is not None and not wait:
        raise click.UsageError("--timeout only applies with --wait")
    if delay is not None and run_at is not None:
        raise InvalidInput("give --delay or --run-at, not both")
    start = None if run_at is None else parse_instant(run_at, "--run-at")
    try:
        if from_file is not None:
            if wait or job_id is not None or input_json != "{}":
                raise click.UsageError("--from-file does not combine with --input, --id or --wait")
            if unique_for is not None or unique_key is not None or debounce is not None:
                raise click.UsageError(
                    "--from-file does not combine with --unique-for, --unique-key or --debounce"
                )
            ids = jobs.submit_many(
                kind,
                read_inputs_file(from_file, runtime().settings.max_input_bytes),
                max_attempts=max_attempts,
                delay=delay,
                run_at=start,
                priority=priority,
            )
            click.echo("\n".join(ids))
            return
        new_id = jobs.submit(
            kind,
            parse_inputs(input_json),
            job_id=job_id,
            max_attempts=max_attempts,
            delay=delay,
            run_at=start,
            priority=priority,
            unique_for=unique_for,
            unique_key=unique_key,
            debounce=debounce,
        )
    except AdmissionRefused as err:
        # Not a mistake: the system is full. Scripts tell "try later" by the exit code.
        click.echo(f"Error: {err}", err=True)  # the message ends "retry in Ns"
        _exit(EX_TEMPFAIL)
    click.echo(new_id)
    if wait:
        _exit(follow(new_id, timeout))


def _exit(code: int) -> NoReturn:
    click.get_current_context().exit(code)


def progress_line(job: Job, steps: Sequence[Step]) -> str:
    names = ", ".join(step.name for step in steps) or "-"
    return (
        f"{job.id} {job.state.value} owner={shown(job.owner)} attempt {job.attempts} steps: {names}"
    )


def follow(job_id: str, timeout: float | None, sleep: Callable[[float], None] = time.sleep) -> int:
    """Print a line whenever state, owner or recorded steps change; return the exit code."""
    deadline = None if timeout is None else time.monotonic() + timeout
    seen: tuple[Any, ...] | None = None
    while True:
        job, steps = jobs.get(job_id), jobs.steps(job_id)
        now_seen = (job.state, job.owner, frozenset(step.name for step in steps))
        if now_seen != seen:
            click.echo(progress_line(job, steps))
            seen = now_seen
        if job.state in TERMINAL or job.state is State.WAITING_APPROVAL:
            return _ended(job)
        if deadline is not None and time.monotonic() >= deadline:
            click.echo(f"timed out after {timeout:g}s; {job_id} is {job.state.value}", err=True)
            return 2
        sleep(POLL_SECONDS)


def _ended(job: Job) -> int:
    if job.state is State.COMPLETED:
        click.echo(json.dumps(job.result))
        return 0
    if job.state is State.WAITING_APPROVAL:
        click.echo(f"waiting for approval: jobctl approve {shlex.quote(job.id)} --by NAME")
        return 0
    if job.state is State.FAILED:
        click.echo(f"{job.id} failed: {shown(job.last_error)}", err=True)
        return 1
    click.echo(f"{job.id} cancelled: {shown(job.last_error or _last_reason(job.id))}", err=True)
    return 1


def _last_reason(job_id: str) -> str:
    history = jobs.history(job_id)
    return (history[-1].reason or "") if history else ""


# -- show, list ----------------------------------------------------------------------------


PAGE_START = click.IntRange(0, 10**9)


@main.command()
@click.argument("job_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="The whole record as one JSON object.")
@click.option("--steps-from", type=PAGE_START, default=0, help="Steps from the Nth on (0 first).")
@click.option("--history-from", type=PAGE_START, default=0, help="Moves from the Nth on.")
@click.option("--children-from", type=PAGE_START, default=0, help="Children from the Nth on.")
def show(
    job_id: str, as_json: bool, steps_from: int, history_from: int, children_from: int
) -> None:
    """A job's record, then a page each of its children, recorded steps (outputs clipped)
    and history of moves; --json prints the whole record."""
    job = jobs.get(job_id)
    if as_json:
        echo_json(
            {
                **job_dict(job),
                "children": [child.id for child in jobs.children(job_id)],
                "steps": [step_dict(s) for s in jobs.steps(job_id)],
                "history": [transition_dict(t) for t in jobs.history(job_id)],
            }
        )
        return
    starts = {"steps": steps_from, "history": history_from, "children": children_from}
    show_text.show_text(runtime().store, job, starts)


@main.command("list")
@click.option(
    "--state",
    type=click.Choice([s.value for s in State], case_sensitive=False),
    help="Only jobs in this state.",
)
@click.option("--kind", help="Only jobs of this kind.")
@click.option(
    "--limit", type=click.IntRange(min=1, max=MAX_LIST_LIMIT), default=100, show_default=True
)
@filter_options
@click.option("--json", "as_json", is_flag=True, help="A JSON list, for scripts.")
def list_command(
    state: str | None,
    kind: str | None,
    limit: int,
    as_json: bool,
    since: str | None = None,
    error_like: str | None = None,
    queue: str | None = None,
) -> None:
    """Jobs, newest first."""
    where = job_filter(state, kind, since, error_like, queue)
    if as_json:
        found = jobs.list_jobs(
            where.state,
            where.kind,
            limit,
            since=where.since,
            error_like=where.error_like,
            queue=where.queue,
        )
        echo_json([job_dict(job) for job in found])
        return
    # The table's columns only: no inputs or results (300 jobs of 1 MiB inputs took 348 MB).
    summaries = _app().store.pages.list_summaries(where, limit)
    if not summaries:
        click.echo("no jobs")
        return
    table(
        ("ID", "KIND", "STATE", "PRIORITY", "OWNER", "ATTEMPTS", "UPDATED"),
        [
            (
                j.id,
                j.kind,
                j.state.value,
                str(j.priority),
                shown(j.owner),
                f"{j.attempts}/{j.max_attempts}",
                j.updated_at.isoformat(timespec="seconds"),
            )
            for j in summaries
        ],
    )


# -- operators -----------------------------------------------------------------------------


@main.command()
@click.argument("job_id", metavar="[ID]", required=False)
@click.option("--by", required=True, help="Who approves; recorded in the history.")
@click.option("--note", help="Why; recorded with the approval.")
@bulk_options
def approve(job_id: str | None, by: str, note: str | None, bulk: Bulk) -> None:
    """Let a job waiting for approval continue past its wait; or many, selected by filter
    (see jobctl retry)."""
    if bulk_approve(job_id, by, note, bulk):
        return
    assert job_id is not None  # bulk_approve refuses neither an ID nor a filter
    try:
        job = jobs.approve(job_id, by=by, note=note)
    except IllegalTransition as err:
        # The store names the move it refused; say which state approval needs.
        raise click.ClickException(
            f"{err} (only a {State.WAITING_APPROVAL.value} job can be approved)"
        ) from None
    click.echo(f"{job.id} {job.state.value}")


@main.command()
@click.argument("job_id", metavar="[ID]", required=False)
@click.option("--reason", default=reasons.CANCELLED, show_default=True)
@bulk_options
def cancel(job_id: str | None, reason: str, bulk: Bulk) -> None:
    """Stop a job that has not ended (a running owner hears it at its next heartbeat, a
    third of the lease, and stops); or many, selected by filter (see jobctl retry)."""
    if bulk_cancel(job_id, reason, bulk):
        return
    assert job_id is not None
    job = jobs.cancel(job_id, reason)
    click.echo(f"{job.id} {job.state.value}")


@main.command()
@click.argument("job_id", metavar="ID")
@click.option("--reason", default=reasons.WOKEN, show_default=True)
def wake(job_id: str, reason: str) -> None:
    """Make a QUEUED job waiting on a timer (a sleep, --delay/--run-at, a retry's backoff)
    due now, and ring its doorbell."""
    job = jobs.wake(job_id, reason)
    click.echo(f"{job.id} {job.state.value}, due now")


# -- db ------------------------------------------------------------------------------------


@main.group()
def db() -> None:
    """The jobs schema in JOBS_DATABASE_URL (Alembic migrations shipped in the package)."""


@db.command()
def upgrade() -> None:
    """Bring the schema to the version this code needs."""
    engine = runtime().engine
    schema.upgrade(engine)
    revision = schema.current_revision(engine)
    if schema.is_newer(revision):
        click.echo(
            f"database at revision {revision}, newer than this code's "
            f"{schema.head_revision(engine)}, and serving it (a newer release rolls out): "
            "nothing to do"
        )
        return
    click.echo(f"database at revision {revision} (head)")


@db.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for scripts.")
def current(as_json: bool) -> None:
    """Show the schema's revision and whether it is the one this code needs."""
    engine = runtime().engine
    revision, head = schema.current_revision(engine), schema.head_revision(engine)
    if as_json:
        echo_json({"revision": revision, "head": head, "at_head": revision == head})
    elif revision == head:
        click.echo(f"{revision} (head)")
    elif schema.is_newer(revision) and schema.serves_this_code(engine):
        click.echo(f"{revision} (newer than this code's head {head}, and serving it)")
    elif schema.is_newer(revision):
        click.echo(f"{revision} (newer than this code's head {head}: upgrade the code)")
    else:
        click.echo(f"{revision or 'none'} (head is {head}: run `jobctl db upgrade`)")


# -- simulate ------------------------------------------------------------------------------

SIMULATED_STEPS = click.IntRange(min=1, max=MAX_SIMULATED_STEPS)


@main.command(context_settings={"show_default": True})
@click.option(
    "--lease-steps", type=SIMULATED_STEPS, default=2, help="Each claim's lease, in steps."
)
@click.option(
    "--steps", type=SIMULATED_STEPS, default=4, help="Worker B takes over at step 1 … STEPS-1."
)
def simulate(lease_steps: int, steps: int) -> None:
    """Replay the crash-and-recover story on a private in-memory database, deterministically."""
    for line in replaying.simulate(lease_steps=lease_steps, steps=steps):
        click.echo(line)
