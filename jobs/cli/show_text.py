"""``jobctl show``'s text: a job's record and one page each of its children, recorded steps
and history, read a page at a time (:mod:`jobs._store.page_reads`), so a job of 100,000 steps
prints a screenful, not the whole of them. ``jobctl show --json`` stays the whole record."""

from __future__ import annotations

from typing import Any

import click

from jobs._core.progress import progress_text
from jobs._core.records import Job, Transition
from jobs._store import JobStore
from jobs._store.page_reads import PREVIEW_CHARS, Page
from jobs.cli.render import compact, iso, shown

#: Rows of each table ``jobctl show`` prints at a time (``--steps-from`` and the like page on).
SHOW_ROWS = {"children": 20, "steps": 50, "history": 100}


def clipped(text: str, limit: int = PREVIEW_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how long the whole is."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters; the whole with --json)"


def _heading(name: str, page: Page[Any], option: str) -> str:
    """``steps:`` (``steps: -`` when there are none) for a table that fits on one page, else
    which rows of how many follow, and the option that shows the next ones."""
    if page.total == 0:
        return f"{name}: -"
    if page.offset == 0 and page.next_offset is None:
        return f"{name}:"
    last = page.offset + len(page.rows)
    shown_rows = f"{page.offset + 1}-{last}" if page.rows else "none"
    more = "" if page.next_offset is None else f"; next: {option} {page.next_offset}"
    return f"{name} ({shown_rows} of {page.total}{more}):"


def show_text(store: JobStore, job: Job, starts: dict[str, int]) -> None:
    """Print ``job``'s fields, then a page of its children, steps and history, each from
    ``starts[table]`` (0 when absent)."""
    pages = store.pages
    fields = [
        ("id", job.id),
        ("kind", job.kind),
        ("state", job.state.value),
        ("owner", shown(job.owner)),
        ("lease_until", iso(job.lease_until) or "-"),
        ("fence", str(job.fence)),
        ("attempts", f"{job.attempts}/{job.max_attempts}"),
        ("priority", str(job.priority)),
        (
            "version",
            "- (none recorded: not claimed yet, or its kind declares no version)"
            if job.code_version is None
            else f"{shown(job.code_version)} (recorded at first claim)",
        ),
        ("inputs", clipped(compact(job.inputs))),
        ("result", clipped(compact(job.result))),
        ("last_error", clipped(shown(job.last_error))),
    ]
    progress = progress_text(job.progress)
    if progress is not None:
        fields.append(("progress", progress))
    if job.waiting_for:
        fields.append(("waiting_for", job.waiting_for))
    if job.parent_id is not None:  # workflows: links both ways
        fields.append(("parent", job.parent_id))
    for name, value in fields:
        click.echo(f"{name + ':':<13}{value}")
    children = pages.children_page(job.id, starts.get("children", 0), SHOW_ROWS["children"])
    if children.total:
        click.echo(_heading("children", children, "--children-from"))
        for child in children.rows:
            click.echo(f"  {child.id} {child.state.value}")
    steps = pages.steps_page(job.id, starts.get("steps", 0), SHOW_ROWS["steps"])
    click.echo(_heading("steps", steps, "--steps-from"))
    for step in steps.rows:
        output = step.preview
        if step.length > len(step.preview):
            output += f"… ({step.length:,} characters; the whole with --json)"
        at_end = progress_text(step.progress)
        position = "-" if step.position is None else str(step.position)
        click.echo(
            f"  {step.name}  {output}  (position={position} owner={shown(step.owner)} "
            f"fence={step.fence} at {iso(step.recorded_at)}"
            + ("" if at_end is None else f"; progress {at_end}")
            + ")"
        )
    history = pages.history_page(job.id, starts.get("history", 0), SHOW_ROWS["history"])
    click.echo(_heading("history", history, "--history-from"))
    for move in history.rows:
        click.echo("  " + history_line(move))


def history_line(move: Transition) -> str:
    """One state change as ``jobctl show`` prints it."""
    source = move.from_state.value if move.from_state is not None else "(new)"
    parts = [f"{iso(move.at)}  {source} -> {move.to_state.value}"]
    if move.owner is not None:
        parts.append(f"owner={shown(move.owner)} fence={move.fence}")
    if move.approved_by is not None:
        parts.append(f"approved_by={shown(move.approved_by)}")
    if move.reason:
        parts.append(f"({shown(move.reason)})")
    return "  ".join(parts)
