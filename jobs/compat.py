"""Every deprecated name still accepted, each until the version it is removed in.

- ``jobs.dispatch`` and ``jobs.set_dispatcher`` (below): the old names of :func:`jobs.ring`
  and :func:`jobs.set_doorbell`; they warn, then call them. Removed in 0.3.
- ``delay_seconds=`` on ``submit`` and ``submit_many``: the old name of ``delay=``, read by
  ``_chosen`` in :mod:`jobs.operations` (a keyword must stand in the signature it
  belongs to). Removed in 0.3.
- ``JOBS_REDISPATCH_AFTER_SECONDS``: the old name of ``JOBS_RING_AGAIN_AFTER_SECONDS``,
  declared as that option's ``old_name`` in :mod:`jobs.core.setting_options` and read by
  :mod:`jobs.core.settings` with a warning. Removed in 0.3.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from jobs.api import ring, set_doorbell

REMOVED_IN = "0.3"
"""The release that drops every name listed here."""


def dispatch(job_id: str) -> bool:
    """Deprecated (removed in 0.3): the old name of :func:`jobs.ring`; warns, then rings."""
    warnings.warn("jobs.dispatch is deprecated; use jobs.ring", DeprecationWarning, stacklevel=2)
    return ring(job_id)


def set_dispatcher(ring_one: Callable[[str], Any] | None) -> None:
    """Deprecated (removed in 0.3): the old name of :func:`jobs.set_doorbell`; warns, then
    sets it."""
    warnings.warn(
        "jobs.set_dispatcher is deprecated; use jobs.set_doorbell",
        DeprecationWarning,
        stacklevel=2,
    )
    set_doorbell(ring_one)
