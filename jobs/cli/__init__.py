"""``jobctl``: the command line (``python -m jobs`` runs the same).

User mistakes (unknown IDs, illegal transitions, bad JSON, bad settings) print one
line on stderr and exit 1; a traceback means a bug in jobctl.
"""

from __future__ import annotations

from typing import Any

import click

from jobs.core.errors import JobError


class JobctlGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except JobError as err:
            raise click.ClickException(str(err)) from None


@click.group(cls=JobctlGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Durable jobs on Celery: the database is the ledger, the broker is a doorbell."""


def _register() -> None:
    from jobs.cli import core_commands, runtime_commands  # noqa: F401, PLC0415


_register()
