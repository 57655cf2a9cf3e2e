"""The ``jobctl`` command group: every command module adds its commands to :data:`main`,
and one place turns user mistakes into one line on stderr and exit 1."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

import click

from jobs._core.errors import JobError
from jobs.cli.app_settings import read_the_app_settings

# SQLSTATEs of a role that may not write here: insufficient_privilege (a read-only role)
# and read_only_sql_transaction (a standby, default_transaction_read_only).
NOT_ALLOWED_TO_WRITE = frozenset({"42501", "25006"})


def _is_database_error(err: Exception) -> bool:
    """An unreachable or misnamed database, or a role that may not write the job tables, is
    a set-up mistake too. SQLAlchemy is only consulted if a command loaded it (``--help``
    must not pay for importing it)."""
    exc = sys.modules.get("sqlalchemy.exc")
    if exc is None:
        return False
    if (
        isinstance(err, exc.DBAPIError)
        and getattr(err.orig, "sqlstate", None) in NOT_ALLOWED_TO_WRITE
    ):
        return True
    return isinstance(err, (exc.OperationalError, exc.InterfaceError, exc.ArgumentError))


# How libpq lists each host it tried when every one of a host list failed.
_TRIED = re.compile(r"^- host: '([^']*)', port: '([^']*)'.*failed: (.*)$")


def _database_failure(err: Exception) -> click.ClickException:
    """One line for a database error; for a host list, every host tried and why it failed
    (libpq's own first line names only the last)."""
    orig = getattr(err, "orig", None)
    detail = str(orig if orig is not None else err).strip().splitlines()
    if getattr(orig, "sqlstate", None) in NOT_ALLOWED_TO_WRITE:
        first = detail[0] if detail else type(err).__name__
        return click.ClickException(
            f"database error: {first} (the role in JOBS_DATABASE_URL needs SELECT, INSERT, "
            "UPDATE and DELETE on the job tables, on a server that accepts writes)"
        )
    tried = [found.groups() for found in map(_TRIED.match, detail) if found is not None]
    if len(tried) > 1:
        hosts = "; ".join(f"{host}:{port}: {why.strip()}" for host, port, why in tried)
        return click.ClickException(f"database unreachable, every host tried failed ({hosts})")
    return click.ClickException(f"database error: {detail[0] if detail else type(err).__name__}")


class Finite(click.ParamType[float]):
    """A finite number from ``low`` to ``high``: ``click.FloatRange`` lets NaN through
    (every comparison with it is false) and infinity when there is no upper bound."""

    name = "number"

    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = low, high

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        """The value as a float, or a usage error naming the bounds."""
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{str(value)[:40]!r} is not a number", param, ctx)
        if not self.low <= number <= self.high:  # NaN fails both comparisons
            self.fail(
                f"{str(value)[:40]!r} must be a finite number from {self.low:g} to {self.high:g}",
                param,
                ctx,
            )
        return number


class SettingsFirst(click.Command):
    """A ``jobctl`` command that finds the app's settings (:mod:`jobs.cli.app_settings`)
    once its arguments are parsed (so ``--help`` sets nothing up) and before it runs; a
    group does so when it runs itself (``jobctl limits``), not before a subcommand."""

    def invoke(self, ctx: click.Context) -> Any:
        if not isinstance(self, click.Group) or ctx.invoked_subcommand is None:
            read_the_app_settings(ctx)
        return super().invoke(ctx)


class JobctlGroup(click.Group, SettingsFirst):
    """Every subcommand (and sub-group) runs inside this invoke, so one place turns user
    mistakes into one line. Its commands and sub-groups read the app's settings first."""

    command_class = SettingsFirst
    group_class = type

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except JobError as err:
            raise click.ClickException(str(err)) from None
        except UnicodeEncodeError:  # bytes that are not UTF-8 in an argument (an ID, a name)
            raise click.ClickException("an argument is not valid UTF-8 text") from None
        except Exception as err:
            if _is_database_error(err):
                raise _database_failure(err) from None
            raise


def import_from_the_working_folder() -> None:
    """Put the working folder first on ``sys.path``, as ``celery -A`` and ``flask --app``
    do: ``JOBS_IMPORTS=shop jobctl worker`` in the shop's folder imports ``shop.py``. The
    ``jobctl`` console script does not get it from Python (``python -m jobs`` does)."""
    folder = os.getcwd()
    if folder not in sys.path and "" not in sys.path:
        sys.path.insert(0, folder)


@click.group(cls=JobctlGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Durable jobs on Celery: the database is the ledger, the broker is a doorbell."""
    import_from_the_working_folder()
