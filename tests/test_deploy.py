"""The deployment files (docker-compose.yml, deploy/, config/) parsed and checked.

No Docker engine is needed: the files are read as data. Where a tool that can check a
file without a daemon exists on the machine (`docker compose config`, or the older
`docker-compose`; `systemd-analyze verify`; RabbitMQ's own config schema), it is run too,
and the test skips with the reason when it is absent. Under CI=true it fails instead:
.ci/run installs Debian's docker-compose, and the machine image has systemd and RabbitMQ.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from jobs._config import settings
from tests.conftest import IN_CI

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DEPLOY_README = ROOT / "deploy" / "README.md"
RABBITMQ_CONF = ROOT / "config" / "rabbitmq" / "rabbitmq.conf"
EMBEDDED_ENV = ROOT / "config" / "embedded.env"
PRODUCTION_ENV = ROOT / "config" / "production.env.example"
WORKER_UNIT = ROOT / "deploy" / "systemd" / "jobs-worker@.service"
SWEEPER_UNIT = ROOT / "deploy" / "systemd" / "jobs-sweeper.service"
UNITS = (WORKER_UNIT, SWEEPER_UNIT)
ENV_FILES = (EMBEDDED_ENV, PRODUCTION_ENV)
DEPLOY_FILES = (COMPOSE, DOCKERFILE, DEPLOY_README, RABBITMQ_CONF, *ENV_FILES, *UNITS)

DEPLOYABLE_SETTINGS = {name for name in settings.KNOWN if not name.startswith("TEST_")}
CELERY_APP = "jobs.celery_app"
# jobctl worker's own options (long and short); anything else would go to celery unchecked.
WORKER_OPTIONS = {
    "--concurrency",
    "-c",
    "--queues",
    "-Q",
    "--hostname",
    "-n",
    "--pool",
    "-P",
    "--loglevel",
    "-l",
}


# --- helpers --------------------------------------------------------------------------


def tool_missing(reason: str) -> NoReturn:
    """Skip a check whose tool is not on this machine, saying so; fail under CI=true, where
    .ci/run installs every tool these checks use."""
    print(reason)
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: every deployment check must run)")
    pytest.skip(reason)


def load_compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict), "docker-compose.yml is not a mapping"
    return data


def services() -> dict[str, dict[str, Any]]:
    found = load_compose().get("services")
    assert isinstance(found, dict), "docker-compose.yml has no services mapping"
    assert found, "docker-compose.yml has no services"
    return found


def argv_of(command: str | list[str] | None) -> list[str]:
    if command is None:
        return []
    if isinstance(command, str):
        return shlex.split(command)
    return [str(part) for part in command]


def command_problem(argv: list[str]) -> str | None:
    """None if argv is one of the commands users run, else what is wrong with it."""
    if not argv:
        return "empty command"
    program = Path(argv[0]).name
    args = argv[1:]
    if program == "jobctl":
        return _jobctl_problem(args)
    if program == "celery":
        return _celery_problem(args)
    return f"{argv[0]!r} is neither jobctl nor celery"


def _jobctl_problem(args: list[str]) -> str | None:
    if args == ["sweeper"]:
        return None
    if args == ["db", "upgrade"]:
        return None
    if args and args[0] == "flower":
        # jobctl flower refuses to start without credentials: the file must give them.
        if not any(arg.startswith("--basic-auth=") for arg in args[1:]):
            return "jobctl flower without --basic-auth= would refuse to start"
        return None
    if not args or args[0] != "worker":
        return f"jobctl {' '.join(args)!r} is not worker, sweeper, flower or db upgrade"
    rest = args[1:]
    while rest:
        option, _, inline = rest[0].partition("=")
        if option not in WORKER_OPTIONS:
            return f"jobctl worker does not take {rest[0]!r}"
        if inline:
            rest = rest[1:]
        elif len(rest) < 2 or rest[1].startswith("-"):
            return f"jobctl worker {option} needs a value"
        else:
            rest = rest[2:]
    return None


def _celery_problem(args: list[str]) -> str | None:
    spelled = args[:3] in (["-A", CELERY_APP, "flower"], ["--app", CELERY_APP, "flower"])
    if not spelled and args[:2] != [f"--app={CELERY_APP}", "flower"]:
        return f"celery {' '.join(args)!r} is not `celery -A {CELERY_APP} flower`"
    auth = [arg for arg in args if arg.startswith("--basic-auth=")]
    if len(auth) != 1:
        return "flower without exactly one --basic-auth=user:password"
    user, sep, password = auth[0].removeprefix("--basic-auth=").partition(":")
    if not (user and sep and password):
        return f"{auth[0]!r} is not --basic-auth=user:password"
    return None


INTERPOLATION = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} against env."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        value = env.get(name)
        if op in (":-", "-"):
            return value if value else arg
        if op in (":?", "?"):
            if not value:
                raise KeyError(f"{name}: {arg}")
            return value
        return value or ""

    return INTERPOLATION.sub(one, text)


def read_env_file(path: Path) -> list[tuple[int, str, str]]:
    """(line number, key, value) of every KEY=value line of a shell/systemd env file."""
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = stripped.partition("=")
        assert sep, f"{path.name}:{number}: not KEY=value: {line!r}"
        entries.append((number, key, value))
    return entries


def jobs_names(text: str) -> set[str]:
    return set(re.findall(r"\bJOBS_([A-Z][A-Z0-9_]*)\b", text))


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            continue  # also inside a continued instruction, as Docker reads it
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        if full:
            instruction, _, args = full.partition(" ")
            result.append((instruction.upper(), args.strip()))
    return result


def unit_entries(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Section name -> (key, value) in order; systemd allows repeated keys."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";")):
            continue
        if stripped.startswith("[") and stripped.endswith("]"):
            current = sections.setdefault(stripped[1:-1], [])
            continue
        assert current is not None, f"{path.name}:{number}: a setting before any [Section]"
        key, sep, value = stripped.partition("=")
        assert sep, f"{path.name}:{number}: not Key=value: {line!r}"
        current.append((key.strip(), value.strip()))
    return sections


def unit_value(sections: dict[str, list[tuple[str, str]]], section: str, key: str) -> str:
    values = [value for name, value in sections.get(section, []) if name == key]
    assert values, f"no {key}= in [{section}]"
    return values[-1]


def seconds(duration: str | int | float) -> float:
    """Compose/systemd durations: 300, "300", "5m", "1m30s", "90s"."""
    if isinstance(duration, int | float):
        return float(duration)
    text = str(duration).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    units = {"h": 3600.0, "min": 60.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(ms|min|h|m|s)", text)
    assert parts, f"not a duration: {text!r}"
    assert "".join(f"{n}{u}" for n, u in parts) == text.replace(" ", ""), text
    return sum(float(number) * units[unit] for number, unit in parts)


# --- the command checker itself -------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        "jobctl worker",
        "jobctl worker --concurrency 4",
        "jobctl worker --concurrency=4 --queues jobs --hostname w1@%h",
        "jobctl worker -c 2 -Q jobs -P threads -l WARNING",
        "/opt/durable-jobs/venv/bin/jobctl sweeper",
        "jobctl db upgrade",
        "celery -A jobs.celery_app flower --basic-auth=admin:secret",
        "celery -A jobs.celery_app flower --port=5555 --basic-auth=${U:-admin}:${P:?set P}",
    ],
)
def test_command_checker_accepts_the_documented_commands(command: str) -> None:
    assert command_problem(shlex.split(command)) is None


@pytest.mark.parametrize(
    "command",
    [
        "jobctl",
        "jobctl wrker",
        "jobctl worker --beat",
        "jobctl worker --autoscale 8,2",
        "jobctl sweeper --once",
        "jobctl worker --concurrency",
        "jobctl db downgrade base",
        "jobctl demo",
        "celery -A jobs.celery_app worker -Q jobs",
        "celery -A jobs.celery_app flower",
        "celery -A jobs.celery_app flower --basic-auth=admin",
        "celery -A other.app flower --basic-auth=a:b",
        "python -m jobs worker",
        "sh -c 'jobctl worker'",
    ],
)
def test_command_checker_refuses_anything_else(command: str) -> None:
    assert command_problem(shlex.split(command)) is not None


# --- docker-compose.yml ---------------------------------------------------------------


def example_services() -> dict[str, Any]:
    """Services only started with ``--profile example`` (the example Django shop)."""
    return {name: s for name, s in services().items() if "example" in s.get("profiles", [])}


def test_compose_has_the_documented_services() -> None:
    assert set(services()) - set(example_services()) == {
        "postgres",
        "rabbitmq",
        "migrate",
        "worker",
        "sweeper",
        "flower",
    }
    assert set(example_services()) == {"shop", "shop-worker"}


def test_the_example_shop_runs_the_django_example_and_its_worker() -> None:
    shop, worker = example_services()["shop"], example_services()["shop-worker"]
    assert shop["build"]["dockerfile"] == "examples/django/Dockerfile"
    assert (ROOT / shop["build"]["dockerfile"]).is_file()
    assert "manage.py migrate" in " ".join(argv_of(shop["command"]))
    assert argv_of(worker["command"])[:3] == ["python", "manage.py", "jobs_worker"]
    assert worker["image"] == shop["image"]
    for service in (shop, worker):
        env = {key: interpolate(str(value), {}) for key, value in service["environment"].items()}
        assert env["SHOP_DATABASE_URL"].split("@")[1] == env["JOBS_DATABASE_URL"].split("@")[1]
        assert settings.from_env({k: v for k, v in env.items() if k.startswith("JOBS_")})


def test_every_compose_command_is_a_documented_jobctl_or_celery_command() -> None:
    roles: dict[str, str] = {}
    for name, service in services().items():
        argv = argv_of(service.get("command"))
        if name in example_services():
            continue  # the example's own commands, checked above
        if not argv and "build" not in service:
            continue  # a third-party image running its own entrypoint (postgres, rabbitmq)
        problem = command_problem(argv)
        assert problem is None, f"service {name}: {problem}"
        roles[name] = " ".join(argv[:2] if argv[0] == "jobctl" else argv[3:4])
    assert roles == {
        "migrate": "jobctl db",
        "worker": "jobctl worker",
        "sweeper": "jobctl sweeper",
        "flower": "jobctl flower",
    }


def test_worker_command_and_shutdown_settings() -> None:
    worker = services()["worker"]
    argv = argv_of(worker["command"])
    assert argv[:2] == ["jobctl", "worker"]
    assert "--concurrency" in argv
    assert argv[argv.index("--concurrency") + 1] == "4"
    assert worker["deploy"]["replicas"] == 2
    assert worker.get("init") is True, "worker needs init: true (tini forwards SIGTERM)"
    grace = seconds(worker["stop_grace_period"])
    assert grace >= 60, f"stop_grace_period {grace}s is too short for a warm shutdown"
    assert "container_name" not in worker, "container_name forbids replicas"
    assert seconds(services()["sweeper"].get("stop_grace_period", 10)) >= 10


def test_worker_waits_for_migrations_and_a_healthy_broker() -> None:
    all_services = services()
    worker = all_services["worker"]["depends_on"]
    assert isinstance(worker, dict), "depends_on must use the long form with conditions"
    assert worker["migrate"]["condition"] == "service_completed_successfully"
    assert worker["rabbitmq"]["condition"] == "service_healthy"
    sweeper = all_services["sweeper"]["depends_on"]
    assert sweeper["migrate"]["condition"] == "service_completed_successfully"
    migrate = all_services["migrate"]
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert str(migrate.get("restart", "no")) == "no", "a one-shot migration must not restart"


@pytest.mark.parametrize(
    ("name", "image_prefix", "probe"),
    [("postgres", "postgres:16", "pg_isready"), ("rabbitmq", "rabbitmq:3.13", "rabbitmq-")],
)
def test_servers_pin_their_version_and_have_healthchecks(
    name: str, image_prefix: str, probe: str
) -> None:
    service = services()[name]
    assert str(service["image"]).startswith(image_prefix)
    check = service.get("healthcheck")
    assert isinstance(check, dict), f"{name} has no healthcheck"
    assert not check.get("disable"), f"{name}'s healthcheck is disabled"
    test = argv_of(check["test"]) if isinstance(check["test"], str) else check["test"]
    assert test, f"{name}: empty healthcheck test"
    assert test[0] in ("CMD", "CMD-SHELL"), f"{name}: healthcheck test {test!r}"
    assert any(probe in part for part in test[1:]), f"{name}: healthcheck does not run {probe}"
    volumes = [str(volume) for volume in service.get("volumes", [])]
    assert any(":/var/lib/" in volume for volume in volumes), f"{name} keeps no data volume"


def test_rabbitmq_config_is_mounted_from_an_existing_file() -> None:
    mounts = []
    for volume in services()["rabbitmq"].get("volumes", []):
        if isinstance(volume, dict):
            source, target = volume.get("source", ""), volume.get("target", "")
        else:
            source, target = [*str(volume).split(":"), ""][:2]
        if source.endswith("rabbitmq.conf"):
            mounts.append((source, target))
    assert len(mounts) == 1, f"expected one rabbitmq.conf mount, found {mounts}"
    source, target = mounts[0]
    path = (COMPOSE.parent / source).resolve()
    assert path == RABBITMQ_CONF.resolve(), f"mounted {path}, expected {RABBITMQ_CONF}"
    assert path.is_file(), f"{source} does not exist"
    assert target.startswith("/etc/rabbitmq/"), target
    assert target.endswith(".conf"), target


def test_flower_requires_a_password_and_stays_on_this_host() -> None:
    flower = services()["flower"]
    auth = [arg for arg in argv_of(flower["command"]) if arg.startswith("--basic-auth=")]
    assert len(auth) == 1, "Flower without --basic-auth"
    assert "${FLOWER_PASSWORD:?" in auth[0], "Flower must refuse to start unprotected"
    ports = [str(port) for port in flower.get("ports", [])]
    assert any(port.endswith(":5555") for port in ports), ports
    with pytest.raises(KeyError, match="FLOWER_PASSWORD"):
        interpolate(auth[0], {})


def test_jobs_services_share_one_image_and_the_common_environment() -> None:
    compose = load_compose()
    common = compose.get("x-jobs-env")
    assert isinstance(common, dict), "no x-jobs-env anchor"
    for name in ("migrate", "worker", "sweeper", "flower"):
        service = services()[name]
        assert service["build"]["dockerfile"] == "deploy/Dockerfile", name
        assert (ROOT / service["build"].get("context", ".") / "pyproject.toml").is_file(), name
        assert service["environment"] == common, f"{name} does not use x-jobs-env"
        assert service.get("image") == services()["worker"].get("image"), name


def test_compose_urls_point_at_the_compose_services_and_validate() -> None:
    common = load_compose()["x-jobs-env"]
    env = {key: interpolate(str(value), {}) for key, value in common.items()}
    parsed = settings.from_env(env)
    assert parsed.database_url.startswith("postgresql+psycopg://")
    assert re.search(r"@postgres:5432/", parsed.database_url), parsed.database_url
    assert re.match(r"amqp://[^@]+@rabbitmq:5672/", parsed.broker_url), parsed.broker_url
    assert not parsed.is_embedded_broker


# --- JOBS_* names everywhere ----------------------------------------------------------


def test_jobs_name_collector_sees_names_it_must_refuse() -> None:
    text = "JOBS_QUEUE=jobs\nx: ${JOBS_LEASE_SECOND:-30}\n# JOBS_TEST_AMQP_URL"
    assert jobs_names(text) == {"QUEUE", "LEASE_SECOND", "TEST_AMQP_URL"}
    assert jobs_names(text) - DEPLOYABLE_SETTINGS == {"LEASE_SECOND", "TEST_AMQP_URL"}


@pytest.mark.parametrize("path", DEPLOY_FILES, ids=lambda path: path.name)
def test_every_jobs_variable_in_deploy_files_is_a_known_setting(path: Path) -> None:
    names = jobs_names(path.read_text())
    unknown = sorted(names - DEPLOYABLE_SETTINGS)
    assert not unknown, f"{path.name}: unknown settings " + ", ".join(f"JOBS_{n}" for n in unknown)


def test_compose_environment_keys_are_known_settings() -> None:
    seen = set()
    compose = load_compose()
    blocks: list[Any] = [compose.get("x-jobs-env")]
    blocks += [service.get("environment") for service in services().values()]
    for block in blocks:
        keys = block if isinstance(block, list) else list((block or {}).keys())
        for key in keys:
            name = str(key).split("=", 1)[0]
            if name.startswith(settings.PREFIX):
                seen.add(name.removeprefix(settings.PREFIX))
    assert {"DATABASE_URL", "BROKER_URL"} <= seen
    assert seen <= DEPLOYABLE_SETTINGS, sorted(seen - DEPLOYABLE_SETTINGS)


# --- env files ------------------------------------------------------------------------


@pytest.mark.parametrize("path", ENV_FILES, ids=lambda path: path.name)
def test_env_file_is_plain_documented_and_complete(path: Path) -> None:
    lines = path.read_text().splitlines()
    keys = []
    for number, key, value in read_env_file(path):
        assert key.startswith(settings.PREFIX), f"{path.name}:{number}: {key} is not JOBS_*"
        assert key.removeprefix(settings.PREFIX) in DEPLOYABLE_SETTINGS, f"unknown {key}"
        assert not value.startswith(("'", '"')), f"{path.name}:{number}: quotes differ by reader"
        assert " #" not in value, f"{path.name}:{number}: no comment after a value"
        assert lines[number - 2].startswith("# "), f"{path.name}:{number}: {key} says not why"
        keys.append(key)
    assert len(keys) == len(set(keys)), f"{path.name}: a setting is given twice"
    missing = {settings.PREFIX + name for name in DEPLOYABLE_SETTINGS} - set(keys)
    assert not missing, f"{path.name} does not document " + ", ".join(sorted(missing))


def test_embedded_env_validates_as_an_embedded_setup() -> None:
    env = {key: value for _, key, value in read_env_file(EMBEDDED_ENV)}
    parsed = settings.from_env(env)
    assert parsed.database_url.startswith("sqlite:")
    assert parsed.is_embedded_broker


def test_production_env_validates_as_postgres_and_rabbitmq() -> None:
    env = {key: value for _, key, value in read_env_file(PRODUCTION_ENV)}
    parsed = settings.from_env(env)
    assert parsed.database_url.startswith("postgresql+psycopg://")
    assert not parsed.is_embedded_broker
    assert "CHANGE_ME" in env["JOBS_DATABASE_URL"], "the example must not carry a real password"


# --- rabbitmq.conf --------------------------------------------------------------------


def rabbitmq_settings() -> dict[str, str]:
    found = {}
    for number, line in enumerate(RABBITMQ_CONF.read_text().splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = stripped.partition("=")
        assert sep, f"rabbitmq.conf:{number}: not key = value: {line!r}"
        assert key.strip(), f"rabbitmq.conf:{number}: no key: {line!r}"
        assert value.strip(), f"rabbitmq.conf:{number}: no value: {line!r}"
        assert key.strip() not in found, f"rabbitmq.conf:{number}: {key.strip()} twice"
        found[key.strip()] = value.strip()
    return found


def test_rabbitmq_consumer_timeout_is_explicit_and_explained() -> None:
    conf = rabbitmq_settings()
    assert "consumer_timeout" in conf, "consumer_timeout must be written out"
    timeout_ms = int(conf["consumer_timeout"])
    assert 60_000 <= timeout_ms <= 1_800_000, "keep RabbitMQ's 30 min default (or below)"
    # One delivery lasts at most the budget plus one step: leave steps at least 10 minutes.
    budgets = {
        "default": settings.Settings.delivery_budget_seconds,
        "docker-compose.yml": float(load_compose()["x-jobs-env"]["JOBS_DELIVERY_BUDGET_SECONDS"]),
    }
    for path in ENV_FILES:
        env = {key: value for _, key, value in read_env_file(path)}
        budgets[path.name] = settings.from_env(env).delivery_budget_seconds
    for where, budget in budgets.items():
        room_ms = timeout_ms - budget * 1000
        assert room_ms >= 600_000, f"{where}: budget {budget}s leaves steps only {room_ms} ms"
    text = RABBITMQ_CONF.read_text()
    comment = text[: text.index("consumer_timeout =")]
    for word in ("acks_late", "step", "JOBS_DELIVERY_BUDGET_SECONDS"):
        assert word in comment, f"the consumer_timeout comment does not mention {word}"


def _schema_keys() -> list[re.Pattern[str]]:
    schemas = Path("/usr/lib/rabbitmq/lib").glob("rabbitmq_server-*/plugins/*/priv/schema/*.schema")
    patterns = []
    for schema in schemas:
        for key in re.findall(r'\{mapping,\s*"([^"]+)"', schema.read_text(errors="replace")):
            parts = [r"[^.]+" if p.startswith("$") else re.escape(p) for p in key.split(".")]
            patterns.append(re.compile(r"\.".join(parts)))
    return patterns


def test_rabbitmq_conf_keys_exist_in_the_installed_rabbitmq_schema() -> None:
    patterns = _schema_keys()
    if not patterns:
        tool_missing("no RabbitMQ schema files under /usr/lib/rabbitmq (RabbitMQ not installed)")
    unknown = [key for key in rabbitmq_settings() if not any(p.fullmatch(key) for p in patterns)]
    assert not unknown, f"rabbitmq.conf keys RabbitMQ does not know: {unknown}"
    assert not any(p.fullmatch("consumer_timeut") for p in patterns)


# --- Dockerfile -----------------------------------------------------------------------


def test_dockerfile_installs_the_package_and_runs_a_worker_as_non_root() -> None:
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    froms = [args for name, args in instructions if name == "FROM"]
    assert froms, "no FROM"
    assert all(args.split()[0] == "python:3.11-slim" for args in froms), froms
    runs = [args for name, args in instructions if name == "RUN"]
    assert any(re.search(r"\bpip install \.(\s|$)", run) for run in runs), "no `pip install .`"
    copies = " ".join(args for name, args in instructions if name == "COPY")
    for needed in ("pyproject.toml", "README.md", "jobs"):
        assert needed in copies, f"the build does not copy {needed}"

    final_stage = instructions[max(i for i, (n, _) in enumerate(instructions) if n == "FROM") :]
    users = [args for name, args in final_stage if name == "USER"]
    assert users, "the final stage runs as root (no USER)"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"USER {users[-1]} is root"

    cmds = [args for name, args in instructions if name == "CMD"]
    assert cmds, "no CMD"
    assert json.loads(cmds[-1]) == ["jobctl", "worker"], "CMD must be exec-form jobctl worker"


def test_dockerfile_healthcheck_pings_this_worker() -> None:
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    checks = [args for name, args in instructions if name == "HEALTHCHECK"]
    assert len(checks) == 1, checks
    check = checks[0]
    assert " CMD " in f" {check} ", check
    assert f"celery -A {CELERY_APP} inspect ping" in check
    assert "$HOSTNAME" in check, "ping this container's node, not any node"
    assert "--timeout" in check.split(" CMD ", 1)[1], "bound the ping's wait"


def test_dockerfile_parser_joins_continuations_and_drops_comments() -> None:
    text = "FROM a\n# note\nRUN one \\\n  # inside\n  two\nUSER 1\n"
    assert dockerfile_instructions(text) == [("FROM", "a"), ("RUN", "one two"), ("USER", "1")]


# --- systemd units --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "subcommand"),
    [(WORKER_UNIT, "worker"), (SWEEPER_UNIT, "sweeper")],
    ids=["worker", "sweeper"],
)
def test_systemd_unit_runs_jobctl_safely(path: Path, subcommand: str) -> None:
    unit = unit_entries(path)
    exec_start = shlex.split(unit_value(unit, "Service", "ExecStart"))
    assert Path(exec_start[0]).name == "jobctl"
    assert exec_start[0].startswith("/"), "systemd wants an absolute ExecStart path"
    assert exec_start[1] == subcommand
    problem = command_problem(exec_start)
    assert problem is None, problem
    assert unit_value(unit, "Service", "Restart") == "always"
    assert unit_value(unit, "Service", "EnvironmentFile") == "/etc/durable-jobs/env"
    assert unit_value(unit, "Service", "User") not in ("root", "0")
    assert unit_value(unit, "Service", "KillMode") == "mixed", "SIGTERM to the main process only"
    assert unit_value(unit, "Service", "KillSignal") == "SIGTERM"
    assert seconds(unit_value(unit, "Service", "TimeoutStopSec")) >= 10
    assert unit_value(unit, "Install", "WantedBy") == "multi-user.target"


def test_worker_unit_allows_a_warm_shutdown_as_long_as_compose() -> None:
    unit = unit_entries(WORKER_UNIT)
    timeout = seconds(unit_value(unit, "Service", "TimeoutStopSec"))
    assert timeout >= seconds(services()["worker"]["stop_grace_period"])
    exec_start = unit_value(unit, "Service", "ExecStart")
    assert "%i" in exec_start, "each instance needs its own Celery node name"


def test_systemd_units_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        tool_missing("systemd-analyze is not installed: unit files checked by parsing only")
    copies = []
    for unit in UNITS:
        # verify wants an instance name and an executable that exists on this machine.
        name = unit.name.replace("@.service", "@1.service")
        text = unit.read_text().replace("/opt/durable-jobs/venv/bin/jobctl", sys.executable)
        (tmp_path / name).write_text(text)
        copies.append(str(tmp_path / name))
    result = subprocess.run(
        [analyze, "verify", *copies], capture_output=True, text=True, timeout=60, check=False
    )
    ours = [line for line in result.stderr.splitlines() if str(tmp_path) in line]
    assert not ours, "\n".join(ours)


# --- a real Compose implementation, where one is installed ------------------------------


def compose_cli() -> Iterator[list[str]]:
    docker = shutil.which("docker")
    if docker:
        probe = subprocess.run(
            [docker, "compose", "version"], capture_output=True, text=True, timeout=30, check=False
        )
        if probe.returncode == 0:
            yield [docker, "compose"]
    legacy = shutil.which("docker-compose")
    if legacy:
        yield [legacy]


def run_compose_config(
    tmp_path: Path, extra_env: Mapping[str, str]
) -> subprocess.CompletedProcess[str]:
    clis = list(compose_cli())
    if not clis:
        tool_missing(
            "no Compose implementation: the docker CLI is "
            + ("present without its compose plugin" if shutil.which("docker") else "absent")
            + " and docker-compose is not installed"
        )
    empty_env_file = tmp_path / "empty.env"  # keeps a developer's .env out of the check
    empty_env_file.write_text("")
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("FLOWER_", "POSTGRES_", "RABBITMQ_", "COMPOSE_", "JOBS_"))
    }
    env.update(extra_env)
    return subprocess.run(
        [*clis[0], "--env-file", str(empty_env_file), "-f", str(COMPOSE), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
        cwd=ROOT,
    )


def test_docker_compose_config_accepts_the_file(tmp_path: Path) -> None:
    result = run_compose_config(tmp_path, {"FLOWER_PASSWORD": "test-only"})
    assert result.returncode == 0, result.stderr + result.stdout


def test_docker_compose_config_refuses_to_run_without_a_flower_password(tmp_path: Path) -> None:
    result = run_compose_config(tmp_path, {})
    assert result.returncode != 0
    assert "FLOWER_PASSWORD" in result.stderr + result.stdout
