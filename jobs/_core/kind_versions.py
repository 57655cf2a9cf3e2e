"""Versions of job kinds (``@jobs.job(version=…, runs_versions=…)``, ``JOBS_RUN_VERSIONS``,
``JOBS_DRAIN``): the version a worker records with a job at its first claim, and the recorded
versions it resumes. No SQL: :mod:`jobs._store.version_clauses` turns a :class:`KindVersions`
into the claim's clauses.

A job is recorded under the claiming worker's version of its kind at its first claim (submit
records none: a web process may run other code than the workers). From then on only a worker
that runs that version of the kind claims it; by default a worker runs only its own version.
A kind without a version, and a job not claimed yet, are claimed by any worker that knows the
kind (unless it drains: then it takes no new job of a kind with a version).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from jobs._core.errors import InvalidInput, SettingsError
from jobs._core.validate import check_name

RunVersions = tuple[tuple[str, tuple[str, ...]], ...]
"""``JOBS_RUN_VERSIONS`` read: each kind named with the versions a worker runs of it."""


@dataclasses.dataclass(frozen=True)
class KindVersion:
    """One kind that declares a version, as this process runs it: the ``version`` it records
    at a first claim, and the recorded versions it resumes (``runs``, its own among them)."""

    kind: str
    version: str
    runs: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class KindVersions:
    """The versioned kinds of one process's registry (a kind without a version is not in
    it), and whether the process drains (``drain``: it claims no job not claimed yet of
    those kinds). Hashable: the claim's reusable statement is built once per value."""

    kinds: tuple[KindVersion, ...] = ()
    drain: bool = False

    @property
    def key(self) -> tuple[object, ...]:
        """What the claim's statement cache adds to its key: nothing without a version."""
        return () if not self.kinds else ("versions", self.kinds, self.drain)

    def of(self, kind: str) -> KindVersion | None:
        """Kind ``kind``'s versions here (``None``: it declares no version)."""
        for versioned in self.kinds:
            if versioned.kind == kind:
                return versioned
        return None

    def runs(self, kind: str, version: str | None) -> bool:
        """Whether this process claims a job of ``kind`` recorded under ``version`` (``None``:
        not claimed yet); the claim's WHERE says the same in SQL."""
        versioned = self.of(kind)
        if versioned is None:
            return True
        if version is None:
            return not self.drain
        return version in versioned.runs


def kind_versions(
    kinds: Iterable[tuple[str, str | None, tuple[str, ...] | None]],
    run_versions: Mapping[str, tuple[str, ...]] | RunVersions = (),
    drain: bool = False,
) -> KindVersions:
    """The :class:`KindVersions` of ``kinds`` (each ``(name, version, runs_versions)`` as
    ``@jobs.job`` declared it): a kind runs the versions ``JOBS_RUN_VERSIONS`` names for it,
    else its ``runs_versions``, else only its own, and always its own (the version it
    records at a first claim)."""
    setting = dict(run_versions)
    versioned = []
    for name, version, declared in sorted(kinds, key=lambda kind: kind[0]):
        if version is None:
            continue
        chosen = setting.get(name, declared or ())
        runs = (version, *sorted(set(chosen) - {version}))
        versioned.append(KindVersion(name, version, runs))
    return KindVersions(tuple(versioned), drain)


def check_runs_versions(
    kind: str, version: str | None, runs_versions: Iterable[str] | None
) -> tuple[str, ...] | None:
    """``@jobs.job(version=…, runs_versions=…)`` checked: the version a name (at most
    :data:`jobs._core.validate.NAME_LENGTH` characters, no spaces), and ``runs_versions`` a
    list of them, which needs the kind's own ``version``."""
    if version is not None:
        check_name(version, f"job kind {kind!r}: version")
    if runs_versions is None:
        return None
    if isinstance(runs_versions, str):
        raise InvalidInput(f"job kind {kind!r}: runs_versions must be a list of versions")
    if version is None:
        raise InvalidInput(f"job kind {kind!r}: runs_versions needs a version= of its own")
    chosen = tuple(runs_versions)
    for each in chosen:
        if not isinstance(each, str):
            raise InvalidInput(f"job kind {kind!r}: runs_versions holds strings only")
        check_name(each, f"job kind {kind!r}: runs_versions entry")
    return chosen


def parse_run_versions(raw: str, name: str) -> RunVersions:
    """``JOBS_RUN_VERSIONS`` (``kind=1,2;other=3``) read, each kind once."""
    found: dict[str, tuple[str, ...]] = {}
    for part in raw.split(";"):
        if not part.strip():
            continue
        kind, equals, versions = part.partition("=")
        kind = kind.strip()
        chosen = tuple(each.strip() for each in versions.split(",") if each.strip())
        if not equals or not kind or not chosen:
            raise SettingsError(
                f"{name}={raw[:80]!r}: expected kind=version,version;kind=version (e.g. "
                "'ship_order=1,2')"
            )
        if kind in found:
            raise SettingsError(f"{name}: kind {kind[:80]!r} is named twice")
        try:
            check_name(kind, "job kind")
            for each in chosen:
                check_name(each, "version")
        except InvalidInput as err:
            raise SettingsError(f"{name}: {err}") from None
        found[kind] = chosen
    return tuple(sorted(found.items()))


__all__ = [
    "KindVersion",
    "KindVersions",
    "RunVersions",
    "check_runs_versions",
    "kind_versions",
    "parse_run_versions",
]
