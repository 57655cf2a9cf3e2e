"""jobctl commands over the core alone: submit, show, list, approve, cancel, db, simulate."""

from __future__ import annotations
