"""``jobctl`` commands for workflows: send an event to a job (``jobctl send-event``).
``jobctl show`` links a job with its parent and children (:mod:`jobs.cli.core_commands`)."""

from __future__ import annotations

import json

import click

import jobs
from jobs.cli.group import main


@main.command("send-event")
@click.argument("job_id", metavar="ID")
@click.argument("name")
@click.argument("payload", required=False, default="null")
def send_event(job_id: str, name: str, payload: str) -> None:
    """Send event NAME with a JSON PAYLOAD (default null) to job ID. A job waiting for it
    (``ctx.wait_for_event(NAME)``) is queued now; any other unfinished job keeps it for
    its next wait of that name."""
    try:
        value = json.loads(payload)
    except ValueError as err:
        raise click.ClickException(f"PAYLOAD is not JSON: {err}") from None
    woken = jobs.send_event(job_id, name, value)
    click.echo(f"{job_id}: event {name!r} " + ("delivered; job QUEUED" if woken else "kept"))


__all__ = ["send_event"]
