"""jobctl commands that run the Celery runtime: worker, sweeper, demo."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import sys
from collections.abc import Sequence

import click

from jobs._config.settings import Settings
from jobs._core.kind_versions import parse_run_versions
from jobs._core.validate import MAX_CONCURRENCY, MAX_WAIT_SECONDS
from jobs._worker.frameworks import set_up_for_job_modules
from jobs.application import default_app
from jobs.cli.command_modules import demo as demos
from jobs.cli.command_modules import metrics as prometheus
from jobs.cli.command_modules import outcome_events, queue_watch
from jobs.cli.command_modules import queues as queue_routes
from jobs.cli.command_modules import sweeper as sweeping
from jobs.cli.group import Finite, main


def settings_after_the_job_modules() -> Settings:
    """The settings in force once the job modules (``JOBS_IMPORTS``) are imported, a
    Django project set up first: importing a Flask app or setting Django up supplies its
    settings (``app.config``, ``settings.JOBS``), so reading them before would take the
    database from one place and the broker from another. Says on stderr, in one line,
    which setting came from where when they came from more than one place. A bad setting
    or module stops here with one line."""
    app = default_app()
    set_up_for_job_modules()  # a Django project's job modules import its models
    app.registry.names()  # so does a bad JOBS_IMPORTS module
    settings = app.settings
    mixed = app.mixed_settings_line()
    if mixed is not None:
        click.echo(mixed, err=True)
    return settings


def export_for_the_worker() -> None:
    """What the exec'd worker must see: the settings a framework supplied (set variables
    win; the worker's Celery app is built before it imports the framework) and the working
    folder on ``PYTHONPATH`` (``python -m`` adds it too, unless ``PYTHONSAFEPATH`` is set)."""
    for name, value in default_app().source_settings().items():
        os.environ.setdefault(name, value)
    folder = os.getcwd()
    paths = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    if folder not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, folder])


@main.command(context_settings={"ignore_unknown_options": True})
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(min=1, max=MAX_CONCURRENCY),
    help="Worker processes.",
)
@click.option(
    "--queues",
    "-Q",
    help="Comma-separated queues, each with its high band under quorum queues (default: "
    "JOBS_QUEUE and every queue a kind names with @jobs.job(queue=...)).",
)
@click.option("--pool", "-P", help="Celery pool: prefork (default), threads, solo.")
@click.option("--hostname", "-n", help="Node name, e.g. A@%h.")
@click.option("--loglevel", "-l", default="INFO", show_default=True)
@click.option(
    "--run-versions",
    metavar="KIND=V,V;…",
    help="The versions of each kind this worker runs, besides its own (JOBS_RUN_VERSIONS).",
)
@click.option(
    "--drain", is_flag=True, help="Claim no new job of a kind with a version (JOBS_DRAIN)."
)
@click.argument("celery_args", nargs=-1, type=click.UNPROCESSED)
def worker(
    concurrency: int | None,
    queues: str | None,
    pool: str | None,
    hostname: str | None,
    loglevel: str,
    run_versions: str | None,
    drain: bool,
    celery_args: tuple[str, ...],
) -> None:
    """Run a Celery worker daemon in the foreground (exec: signals reach Celery itself).

    Extra arguments are passed to Celery's `worker` command unchanged.
    """
    # The worker reads its settings from the environment it is exec'd with: a flag wins
    # over the variable, and a bad one stops here, in one line, before anything starts.
    if run_versions is not None:
        parse_run_versions(run_versions, "--run-versions")
        os.environ["JOBS_RUN_VERSIONS"] = run_versions
    if drain:
        os.environ["JOBS_DRAIN"] = "on"
    settings = settings_after_the_job_modules()
    export_for_the_worker()
    kinds = default_app().registry.kinds()
    consumed = (
        queue_routes.served_queues(settings, kinds)
        if not queues
        else queue_routes.with_bands(
            settings, [name.strip() for name in queues.split(",") if name.strip()]
        )
    )
    # Celery's worker command without Celery's command line (jobs/_worker/main.py):
    # the same worker, without the REPL and plugin commands in every process's memory.
    argv = [sys.executable, "-m", "jobs._worker.main"]
    if settings.celery_app is not None:  # the project's own app, with durable jobs installed
        argv += ["-A", settings.celery_app]
    argv += ["-Q", ",".join(consumed), "-l", loglevel]
    if settings.task_events:  # JOBS_TASK_EVENTS: what Flower's task views are made of
        argv.append("-E")
    if concurrency is not None:
        argv += ["-c", str(concurrency)]
    if pool:
        argv += ["-P", pool]
    if hostname:
        argv += ["-n", hostname]
    argv += list(celery_args)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)  # noqa: S606 - become the Celery process


@main.command()
@click.option("--once", is_flag=True, help="Run one pass, print what it did, and exit.")
@click.option("--json", "as_json", is_flag=True, help="With --once: the pass's job IDs as JSON.")
def sweeper(once: bool, as_json: bool) -> None:
    """Recover jobs without the broker: dead owners, expired leases, lost messages."""
    settings = settings_after_the_job_modules()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    runtime = default_app().runtime
    store = runtime.store
    default_app().schedules.sync()  # periodic kinds declared in code (JOBS_IMPORTS)
    watch = None if settings.is_embedded_broker else queue_watch.QueueWatch(settings)
    # Flower hears of the jobs the sweeper fails (no delivery reports them), on a broker.
    announce = outcome_events.OutcomeEvents(
        lambda: default_app().celery,
        enabled=settings.task_events and not settings.is_embedded_broker,
    )
    if once:
        report = sweeping.sweep_once(
            store, settings, runtime.ring_batch, runtime.waiting_doorbells, watch, announce
        )
        if as_json:
            click.echo(json.dumps(dataclasses.asdict(report), indent=2))
            return
        click.echo(
            f"dead owners re-queued: {len(report.dead_owner)}, "
            f"expired leases: {len(report.expired)}, rung: {len(report.rung)}, "
            f"ticks submitted: {len(report.ticks)}, finished jobs pruned: {report.pruned}"
        )
        return
    if settings.metrics_port is not None:
        prometheus.serve(
            store, settings.metrics_port, settings.lease_seconds, default_queue=settings.queue
        )
    sweeping.run_forever(
        store,
        settings,
        runtime.ring_batch,
        waiting=runtime.waiting_doorbells,
        watch=watch,
        announce=announce,
    )


@main.command()
@click.option("--job-id", default="T-42", show_default=True)
@click.option(
    "--timeout",
    type=Finite(1, MAX_WAIT_SECONDS),
    default=90.0,
    show_default=True,
    help="Seconds before giving up.",
)
def demo(job_id: str, timeout: float) -> None:
    """The T-42 story with real processes: worker A is SIGKILLed mid-job, worker B finishes it."""
    ok = demos.run_demo(job_id=job_id, timeout=timeout, echo=click.echo)
    if not ok:
        raise SystemExit(1)


def refuse_spaced_values(flower_args: Sequence[str]) -> None:
    """Flower (Tornado) reads its options only as ``--name=value``: ``--port 5555`` ended
    in a Tornado traceback. Say how to write it instead."""
    for option, following in itertools.pairwise(flower_args):
        if option.startswith("--") and "=" not in option and not following.startswith("-"):
            raise click.ClickException(
                f"Flower takes its options as --name=value: write {option}={following} "
                f"instead of {option} {following}"
            )


@main.command(context_settings={"ignore_unknown_options": True})
@click.option(
    "--basic-auth",
    "basic_auth",
    envvar="FLOWER_BASIC_AUTH",
    help="user:password (several, comma-separated); also read from FLOWER_BASIC_AUTH.",
)
@click.option(
    "--insecure-no-auth",
    is_flag=True,
    help="Start without credentials (a private network you trust, or auth in a proxy).",
)
@click.argument("flower_args", nargs=-1, type=click.UNPROCESSED)
def flower(basic_auth: str | None, insecure_no_auth: bool, flower_args: tuple[str, ...]) -> None:
    """Run Flower on this app, with the Jobs pages under /jobs; refuses to start without
    --basic-auth unless told otherwise.

    Flower shows every job ID, can revoke tasks and shut workers down, and its Jobs pages
    approve, wake, retry and cancel jobs: never expose it without credentials. Extra
    arguments go to Flower's command unchanged (`celery flower`'s options).
    """
    if basic_auth is None and not insecure_no_auth:
        raise click.ClickException(
            "Flower needs --basic-auth user:password (or FLOWER_BASIC_AUTH); "
            "--insecure-no-auth starts it without credentials"
        )
    refuse_spaced_values(flower_args)
    flower_options = []
    if basic_auth is not None:
        pairs = [pair.strip() for pair in basic_auth.split(",")]
        if not all(user and password for user, _, password in (p.partition(":") for p in pairs)):
            raise click.ClickException("--basic-auth must be user:password (comma-separated)")
        flower_options.append(f"--basic-auth={basic_auth}")
    settings = settings_after_the_job_modules()
    export_for_the_worker()  # the Jobs pages read the settings a framework supplied
    celery_app = settings.celery_app or "jobs.celery_app"  # a project's own app, if set
    # Flower's own command, starting Flower with the Jobs pages (jobs/contrib/flower_jobs).
    argv = [sys.executable, "-m", "jobs.contrib.flower_jobs", "-A", celery_app, *flower_options]
    argv += list(flower_args)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)  # noqa: S606 - become the Flower process
