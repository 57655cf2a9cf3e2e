"""``jobctl``: the command line (``python -m jobs`` runs the same).

User mistakes (unknown IDs, illegal transitions, bad JSON, bad settings) print one
line on stderr and exit 1; a traceback means a bug in jobctl.

The group lives in :mod:`jobs.cli.group`; importing this package imports the command
modules, which add their commands to it.
"""

from __future__ import annotations

from jobs.cli import (
    backpressure_commands,
    bulk_commands,
    core_commands,
    ops_commands,
    runtime_commands,
    workflow_commands,
)
from jobs.cli.group import main

__all__ = [
    "backpressure_commands",
    "bulk_commands",
    "core_commands",
    "main",
    "ops_commands",
    "runtime_commands",
    "workflow_commands",
]
