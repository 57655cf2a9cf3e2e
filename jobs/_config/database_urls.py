"""Database and broker URLs: their checks, their masking and libpq's host lists.

What :mod:`jobs._config.settings` calls to refuse a URL that would lose jobs or fail later
with a traceback, and what logs and errors call to show a URL without its password.
Parsed with urllib: a worker's main process loads no SQLAlchemy.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from jobs._core.errors import SettingsError

BROKER_SCHEMES = ("amqp", "amqps", "pyamqp", "filesystem", "memory")
"""The broker URL schemes accepted: RabbitMQ's, and kombu's embedded transports."""

DATABASE_VARIABLE = "JOBS_DATABASE_URL"
BROKER_VARIABLE = "JOBS_BROKER_URL"


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***``: what error messages and logs show.

    Everything between the user's ``:`` and the URL's *last* ``@`` is hidden, so a password
    with an unencoded ``@`` or ``/`` is hidden whole (a parser would end it at the first)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    credentials, at, host = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    user = credentials.split(":", 1)[0]
    if "/" in user:  # no user:password before the host (an '@' in a path): nothing to hide
        return url
    return f"{scheme}://{user}:***@{host}"


def _check_authority(url: str, variable: str) -> urllib.parse.SplitResult:
    """Split a server URL (PostgreSQL, AMQP) and check its user, password, host and port,
    never quoting any part of the password: a password holding an unencoded ``@``, ``/``,
    ``?`` or ``#`` would be cut where a parser ends it, and its tail taken for the host."""
    shown = mask_url(url)
    rest = url.partition("://")[2]
    authority = rest
    for end in "/?#":
        authority = authority.partition(end)[0]
    if rest.count("@") > authority.count("@") or authority.count("@") > 1:
        raise SettingsError(
            f"{variable}={shown!r}: the user or password holds an unencoded '@', '/', '?' or "
            "'#'; percent-encode it (@ as %40, / as %2F, ? as %3F, # as %23)"
        )
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises for a port that is not a number in 0..65535
    except ValueError:
        raise SettingsError(
            f"{variable}={shown!r} is not a valid URL: the port must be a number from 1 to 65535"
        ) from None
    host = parts.hostname or ""
    if port == 0:
        raise SettingsError(f"{variable}={shown!r}: port 0 is out of range")
    if any(ch.isspace() or not ch.isprintable() for ch in host) or (port and not host):
        raise SettingsError(f"{variable}={shown!r}: the host is not a valid host name")
    return parts


def check_broker_url(url: str) -> None:
    """Refuse a broker URL no doorbell could ever be sent to, at start-up (not at the first
    publish, where a submit would succeed and the worker die with a traceback)."""
    variable = BROKER_VARIABLE
    shown = mask_url(url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise SettingsError(f"{variable}={shown!r} is not a URL")
    if scheme not in BROKER_SCHEMES:
        raise SettingsError(
            f"{variable}={shown!r}: use amqp:// (RabbitMQ) or filesystem:// (embedded)"
        )
    if scheme in ("filesystem", "memory"):
        if rest.strip("/"):
            raise SettingsError(
                f"{variable}={shown!r}: {scheme}:// takes no host or path "
                "(the embedded broker lives in JOBS_DATA_DIR)"
            )
        return
    parts = _check_authority(url, variable)
    if not parts.hostname:
        raise SettingsError(
            f"{variable}={shown!r}: the host is missing (amqp://USER:PASSWORD@HOST:5672/VHOST)"
        )


def check_database_url(url: str, data_dir: Path, given: bool) -> None:
    """Refuse URLs that would lose jobs silently or fail later with a traceback. (Parsed
    with urllib: a worker's main process loads no SQLAlchemy.)"""
    shown = mask_url(url)
    if not url.startswith(("sqlite", "postgresql")):
        raise SettingsError(
            f"{DATABASE_VARIABLE}={shown!r}: only sqlite:/// and postgresql:// URLs are supported"
        )
    backend, _, driver = url.partition("://")[0].partition("+")
    if backend == "postgresql":
        if driver != "psycopg":
            raise SettingsError(
                f"{DATABASE_VARIABLE}={shown!r}: the driver {driver[:40]!r} is not supported "
                "(use postgresql:// for psycopg 3)"
            )
        _check_authority(url, f"{DATABASE_VARIABLE}")
        try:
            hosts = database_hosts(url)
        except ValueError as err:
            raise SettingsError(f"{DATABASE_VARIABLE}={shown!r}: {err}") from None
        for host, _port in hosts:
            if any(ch.isspace() or not ch.isprintable() for ch in host):
                raise SettingsError(f"{DATABASE_VARIABLE}={shown!r}: the host is not valid")
        return
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        raise SettingsError(f"{DATABASE_VARIABLE}={shown!r} is not a valid URL") from None
    if backend != "sqlite" or driver not in ("", "pysqlite"):
        raise SettingsError(f"{DATABASE_VARIABLE}={shown!r}: use sqlite:///PATH")
    database = urllib.parse.unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
    if _in_memory_sqlite(database, parts.query):
        raise SettingsError(
            f"{DATABASE_VARIABLE}={shown!r}: an in-memory database would lose every job "
            "when the process exits; use sqlite:///PATH"
        )
    folder = Path(database).absolute().parent
    if given and folder != data_dir and not folder.is_dir():
        raise SettingsError(
            f"{DATABASE_VARIABLE}={shown!r}: the folder {str(folder)!r} does not exist"
        )


def _in_memory_sqlite(database: str, query: str) -> bool:
    """Whether SQLite would keep ``database`` in memory (or in a temporary file deleted on
    close): ``:memory:``, an empty name, and the URI forms ``file::memory:``,
    ``file:NAME?mode=memory``, ``vfs=memdb`` and ``file:`` with no name, whether their
    options sit in the URL's query (SQLAlchemy passes them on) or in the file name."""
    name, _, own_query = database.partition("?")
    options = {
        key.lower(): [value.lower() for value in values]
        for key, values in {
            **urllib.parse.parse_qs(own_query),
            **urllib.parse.parse_qs(query),
        }.items()
    }
    if "memory" in options.get("mode", []) or "memdb" in options.get("vfs", []):
        return True
    bare = name.removeprefix("file:") if name.lower().startswith("file:") else name
    return bare.strip("/") in ("", ":memory:") or name.lower() == ":memory:"


def normalize_database_url(url: str) -> str:
    """Send plain ``postgresql://`` URLs to psycopg 3, the driver we install, and write
    libpq's URI host list (``postgresql://u@h1:5441,h2:5442/db``, which no URL parser reads)
    in libpq's query form (``postgresql://u@/db?host=h1,h2&port=5441,5442``), which psycopg
    and SQLAlchemy take as it is."""
    for plain in ("postgres://", "postgresql://"):
        if url.startswith(plain):
            url = "postgresql+psycopg://" + url[len(plain) :]
    if url.startswith("postgresql"):
        url = _host_list_as_query(url)
    return url


def _split_authority(url: str) -> tuple[str, str, str, str]:
    """``scheme://``, ``user:password@`` (or ""), ``host:port`` and the rest of ``url``."""
    scheme, sep, rest = url.partition("://")
    ends = [index for index in (rest.find(end) for end in "/?#") if index >= 0]
    end = min(ends, default=len(rest))
    # A password holding '/' is refused by the checks (it must be percent-encoded).
    authority, tail = rest[:end], rest[end:]
    userinfo, at, hostport = authority.rpartition("@")
    return scheme + sep, userinfo + at, hostport, tail


def _host_and_port(item: str) -> tuple[str, str]:
    """``host:port`` (or ``[v6]:port``, or a bare host) as (host, port or "")."""
    if item.startswith("["):
        host, _, after = item[1:].partition("]")
        return host, after.removeprefix(":")
    host, _, port = item.partition(":")
    return host, port


def _host_list_as_query(url: str) -> str:
    scheme, userinfo, hostport, tail = _split_authority(url)
    if "," not in hostport:
        return url
    pairs = [_host_and_port(item) for item in hostport.split(",")]
    path, _, query = tail.partition("?")
    fields = [("host", ",".join(host for host, _ in pairs))]
    if any(port for _, port in pairs):
        fields.append(("port", ",".join(port or "5432" for _, port in pairs)))
    listed = "&".join(f"{key}={value}" for key, value in fields)
    return f"{scheme}{userinfo}{path or '/'}?{listed}{'&' + query if query else ''}"


def database_hosts(url: str) -> list[tuple[str, int | None]]:
    """The servers a PostgreSQL URL names, in the order libpq tries them: the URL's own
    host and port, or libpq's ``host=``/``port=`` lists (comma-separated, or SQLAlchemy's
    repeated ``host=h:p``). A port of None is libpq's default (5432). Raises ValueError for
    a port that is not a number or lists of mismatched lengths."""
    url = normalize_database_url(url)
    _scheme, _userinfo, hostport, tail = _split_authority(url)
    query = urllib.parse.parse_qs(tail.partition("?")[2].partition("#")[0])
    hosts = [host for value in query.get("host", []) for host in value.split(",")]
    ports = [port for value in query.get("port", []) for port in value.split(",")]
    if not hosts:
        host, port = _host_and_port(hostport)
        hosts, ports = [host], [port] if port else ports
    pairs = [_host_and_port(host) if ":" in host and not ports else (host, "") for host in hosts]
    if ports:
        if len(ports) not in (1, len(hosts)):
            raise ValueError(f"{len(hosts)} hosts but {len(ports)} ports")
        ports = ports * len(hosts) if len(ports) == 1 else ports
        pairs = [(host, port) for (host, _), port in zip(pairs, ports, strict=True)]
    found: list[tuple[str, int | None]] = []
    for host, port in pairs:
        number = None
        if port:
            number = int(port) if port.isdigit() else -1
            if not 0 < number < 65536:
                raise ValueError(f"port {port[:20]!r} is not a number from 1 to 65535")
        found.append((host, number))
    return found


def describe_hosts(url: str) -> str:
    """The servers of a database URL for a log line or an error (``h1:5441, h2:5442``),
    never its password; the masked URL when it names no server (SQLite, a socket)."""
    try:
        hosts = database_hosts(url) if url.startswith("postgres") else []
    except ValueError:
        hosts = []
    named = [f"{host or 'localhost'}:{port or 5432}" for host, port in hosts]
    return ", ".join(named) if named else mask_url(url)


def same_database(first: str, second: str) -> bool:
    """Whether two SQLAlchemy URLs name the same database (backend, host, port, name):
    passwords and drivers aside, so the jobs' URL and a framework's for one database agree."""
    from sqlalchemy.engine import make_url  # noqa: PLC0415 - settings load no SQLAlchemy

    one, other = make_url(first), make_url(second)
    return (one.get_backend_name(), one.host or "", one.port or 5432, one.database) == (
        other.get_backend_name(),
        other.host or "",
        other.port or 5432,
        other.database,
    )
