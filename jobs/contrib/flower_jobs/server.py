"""Flower with the Jobs pages: :class:`JobsFlower`, and the ``flower`` command that starts
it (what ``jobctl flower`` execs: ``python -m jobs.contrib.flower_jobs``)."""

from __future__ import annotations

import atexit
import contextlib
import signal
import sys
from typing import Any

import click
from celery.bin.base import CeleryCommand
from flower.app import Flower

from jobs.contrib.flower_jobs.views import jobs_handlers

DEFAULT_APP = "jobs.celery_app"


class JobsFlower(Flower):  # type: ignore[misc] # Flower ships no type hints
    """Flower's application with the Jobs pages added under ``/jobs`` (after Flower's
    ``--url_prefix``, if any), served by handlers derived from Flower's own, so Flower's
    authentication covers them. ``jobs_app``: the :class:`jobs.application.JobsApp` the
    pages read and act through (default: the process's, whose Celery app is a project's
    own when ``JOBS_CELERY_APP`` names it)."""

    def __init__(self, *args: Any, jobs_app: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if jobs_app is None:
            from jobs.application import default_app  # noqa: PLC0415

            jobs_app = default_app()
        self.jobs_app = jobs_app
        self.add_handlers(r".*", jobs_handlers(self.options.url_prefix))


@click.command(cls=CeleryCommand, context_settings={"ignore_unknown_options": True})
@click.argument("tornado_argv", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def flower_command(ctx: click.Context, tornado_argv: tuple[str, ...]) -> None:
    """Flower's own ``flower`` command (its options, environment variables, ``--conf``
    file, logging, banner and signals), starting :class:`JobsFlower`."""
    from flower import command  # noqa: PLC0415

    command.apply_env_options()
    command.apply_options(sys.argv[0], tornado_argv)
    command.extract_settings()
    command.setup_logging()
    app = ctx.obj.app
    flower_app = JobsFlower(capp=app, options=command.options, **command.settings)
    atexit.register(flower_app.stop)
    signal.signal(signal.SIGTERM, command.sigterm_handler)
    port = flower_app.start_http_server()
    if not ctx.obj.quiet:
        command.print_banner(app, "ssl_options" in command.settings, port)
    with contextlib.suppress(KeyboardInterrupt, SystemExit):  # SIGTERM, Ctrl-C: a clean end
        flower_app.start()


def main(argv: list[str], app_name: str = DEFAULT_APP) -> None:
    """Run Flower with the Jobs pages on the Celery app ``app_name`` names (``module`` or
    ``module:attribute``, as ``celery -A`` takes it), with Flower's options ``argv``."""
    from celery.app.utils import find_app  # noqa: PLC0415
    from celery.bin.base import CLIContext  # noqa: PLC0415

    app = find_app(app_name)
    flower_command.main(
        args=argv,
        prog_name="jobctl flower",
        obj=CLIContext(app=app, no_color=None, workdir=None, quiet=False),
    )
