"""The claim's clauses for kinds that declare a version (:mod:`jobs._core.kind_versions`):
the first claim records the claiming worker's version of the job's kind, and the claim's
WHERE refuses a job recorded under a version this worker does not run.

Both are built once per registry into the claim's reusable statement, with the kinds and
versions written in as constants (no parameter): a ``CASE`` over the versioned kinds in the
``SET`` (``code_version = COALESCE(code_version, CASE kind WHEN … END)``) and one
equality per kind in the WHERE. A process whose kinds declare no version adds neither: its
claim is the statement it was before versions meant anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, case, false, func, literal, or_

from jobs._core.kind_versions import KindVersions
from jobs._store.clauses import kind_in
from jobs._store.row_changes import KEEP
from jobs._store.tables import JobsTable


def _version(value: str) -> ColumnElement[Any]:
    return literal(value, JobsTable.code_version.type)


def first_claim_version(versions: KindVersions | None) -> ColumnElement[Any] | None:
    """The claim's ``code_version`` value: kept once recorded, else this worker's version of
    the job's kind (``NULL`` for a kind without one). ``None`` (the column left alone) when
    no kind here declares a version."""
    if versions is None or not versions.kinds:
        return None
    own = case(
        *(
            (JobsTable.kind == literal(each.kind, JobsTable.kind.type), _version(each.version))
            for each in versions.kinds
        ),
        else_=literal(None, JobsTable.code_version.type),
    )
    return func.coalesce(JobsTable.code_version, own)


def claim_key(kinds: Sequence[str] | None, versions: KindVersions | None) -> Any:
    """What tells apart the claim's reusable statements: its kinds, as before versions, and
    their versions when one declares a version."""
    kinds_key = None if kinds is None else tuple(kinds)
    if versions is None or not versions.kinds:
        return kinds_key
    return (kinds_key, versions.key)


def version_change(versions: KindVersions | None) -> Any:
    """The claim's :class:`RowChanges` ``code_version`` (:data:`KEEP`: left alone)."""
    value = first_claim_version(versions)
    return KEEP if value is None else value


def recording_versions(versions: KindVersions | None) -> dict[str, Any]:
    """The claim's ``SET`` for versions: ``{"code_version": …}``, or nothing."""
    value = first_claim_version(versions)
    return {} if value is None else {"code_version": value}


def runs_recorded_version(versions: KindVersions | None) -> list[ColumnElement[bool]]:
    """The claim's WHERE for versions: a job of a kind without a version here, or one whose
    recorded version this worker runs (or none recorded yet, unless it drains). Empty when
    no kind here declares a version."""
    if versions is None or not versions.kinds:
        return []
    unversioned = ~kind_in([each.kind for each in versions.kinds])
    accepted = []
    for each in versions.kinds:
        runs = or_(false(), *(JobsTable.code_version == _version(run) for run in each.runs))
        if not versions.drain:
            runs = or_(JobsTable.code_version.is_(None), runs)
        accepted.append((JobsTable.kind == literal(each.kind, JobsTable.kind.type)) & runs)
    return [or_(unversioned, *accepted)]


__all__ = [
    "claim_key",
    "first_claim_version",
    "recording_versions",
    "runs_recorded_version",
    "version_change",
]
