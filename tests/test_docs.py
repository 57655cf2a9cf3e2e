"""The documentation site: its generated references list everything the code defines, the
strict build passes, and the quickstart's commands complete a user's own job."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent
sys.path.insert(0, str(DOCS))

import gen_reference  # noqa: E402

from jobs._config import settings  # noqa: E402
from jobs._core import errors  # noqa: E402
from jobs._core.states import TRANSITIONS, State  # noqa: E402
from jobs.cli import main as jobctl  # noqa: E402

HISTORY = re.compile(r"\bissues? #?\d+|\bthis session\b|\bthis round\b|\bused to\b", re.I)


def table(name: str) -> str:
    problems: list[str] = []
    text = gen_reference.TABLES[name](problems)
    assert problems == []
    return text


def test_the_settings_table_names_every_setting_the_code_reads() -> None:
    text = table("settings")
    for name in settings.KNOWN | set(settings.RENAMED):
        assert f"`JOBS_{name}`" in text


def test_the_states_table_has_every_state_and_transition() -> None:
    text = table("states")
    for state in State:
        assert f"| `{state.value}` |" in text
    for (source, target), who in TRANSITIONS.items():
        origin = "(submit)" if source is None else f"`{source.value}`"
        assert f"| {origin} | `{target.value}` |" in text
        assert who.split(",")[0] in text


def test_the_explain_table_has_every_reason_the_explainer_returns() -> None:
    source = (ROOT / "jobs" / "_service" / "explain.py").read_text()
    # every short snake_case literal the explainer hands back as a reason
    literals = set(re.findall(r'(?:return \(?\s*|reason = )"([a-z_]+)"', source))
    assert len(literals) >= 15
    assert literals == set(gen_reference.explain_reasons())
    text = table("explain")
    for reason in literals:
        assert f"| `{reason}` |" in text


def test_the_metrics_table_has_every_metric_the_exporter_defines() -> None:
    from jobs._sweeper.metrics import SCRAPED_SERIES  # noqa: PLC0415

    source = (ROOT / "jobs" / "_sweeper" / "metrics.py").read_text()
    # The series each scrape reads, declared in one table, and those tailed from the history.
    tailed = set(re.findall(r'"(jobs(?:_[a-z_]+)?)",\s*\n?\s*"[A-Z]', source))
    names = set(SCRAPED_SERIES) | tailed
    assert len(tailed) >= 4
    assert len(names) >= 10
    text = table("metrics")
    for name in names:
        assert re.search(rf"\| `{name}(_total)?` \|", text), name


def test_the_errors_table_has_every_error_class() -> None:
    classes = [
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, errors.JobError)
    ]
    text = table("errors")
    for cls in classes:
        assert f"`jobs.{cls.__name__}`" in text


def _commands(group: click.Group, prefix: str) -> list[str]:
    found = []
    for name, command in group.commands.items():
        found.append(f"{prefix} {name}")
        if isinstance(command, click.Group):
            found += _commands(command, f"{prefix} {name}")
    return found


@pytest.mark.slow
def test_the_strict_build_passes_and_its_pages_list_everything(tmp_path: Path) -> None:
    site = tmp_path / "site"
    built = subprocess.run(
        [str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=240,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    assert "WARNING" not in built.stderr

    def page(path: str) -> str:
        return (site / path / "index.html").read_text()

    cli = page("reference/cli")
    for command in _commands(jobctl, "jobctl"):
        assert command in cli, command
    for name in settings.KNOWN:
        assert f"JOBS_{name}" in page("reference/settings")
    for reason in gen_reference.explain_reasons():
        assert f"<code>{reason}</code>" in page("reference/explain")
    for name, kind, *_ in gen_reference.metrics():
        assert name in page("reference/metrics")
        exported = f"{name}_total" if kind == "counter" else name
        assert f"<code>{exported}{{" in page("operations/monitoring") or (
            f"<code>{exported}</code>" in page("operations/monitoring")
        ), f"{exported} is not on the monitoring page"
    api = page("reference/api")
    for name in ("submit", "approve", "JobContext", "JobError", "job"):
        assert f'id="jobs.{name}"' in api
    assert 'id="jobs.testing.drain"' in page("reference/testing")


def test_no_page_speaks_of_issues_or_sessions() -> None:
    for path in sorted(DOCS.rglob("*.md")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not HISTORY.search(line), f"{path.relative_to(ROOT)}:{number}: {line}"


def test_the_quickstart_shows_the_files_the_test_runs() -> None:
    page = (DOCS / "quickstart.md").read_text()
    assert '--8<-- "docs/examples/shop_jobs.py"' in page
    script = (DOCS / "examples" / "quickstart.sh").read_text()
    for section in re.findall(r"\[start:(\w+)\]", script):
        assert f'--8<-- "docs/examples/quickstart.sh:{section}"' in page


@pytest.mark.acceptance
@pytest.mark.slow
def end_process_group(group: int, grace: float = 15.0) -> None:
    """Stop every process a page's commands left in ``group``: SIGTERM (a worker's warm
    shutdown), then SIGKILL for whatever is still there after ``grace`` seconds, such as a
    pool child forked while the group was being stopped, which the SIGTERM never reached."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


def test_the_quickstart_completes_a_users_own_job_in_a_fresh_folder(tmp_path: Path) -> None:
    shutil.copy(DOCS / "examples" / "shop_jobs.py", tmp_path)
    env = {key: value for key, value in os.environ.items() if not key.startswith("JOBS_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)
    process = subprocess.Popen(
        ["bash", str(DOCS / "examples" / "quickstart.sh")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=240)
    finally:
        end_process_group(process.pid)
        for log in tmp_path.glob("*.log"):
            print(log.name, log.read_text()[-2000:])
    assert process.returncode == 0, output
    assert '{"sent": "receipt for order 42"}' in output
    assert re.search(r"^state: +COMPLETED$", output, re.M), output
    assert "died (process" in output  # the crash was recovered from, not dodged
    worker_b = (tmp_path / "worker-b.log").read_text()
    assert "replayed ['fetch_order']" in worker_b
    assert "fetching order 43" not in worker_b  # the recorded step did not run again


def test_every_python_block_on_every_page_is_python() -> None:
    blocks = 0
    for path in sorted(DOCS.rglob("*.md")):
        for block in re.findall(r"```python\n(.*?)```", path.read_text(), re.S):
            blocks += 1
            if block.startswith("--8<--"):  # an included file, compiled where it lives
                continue
            try:
                compile(block, str(path), "exec")
            except SyntaxError as err:
                pytest.fail(f"{path.relative_to(ROOT)}: {err.msg}: {err.text}")
    assert blocks >= 15


README = ROOT / "README.md"


def test_the_readme_is_short_starts_with_the_set_up_and_links_to_pages_that_exist() -> None:
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 200
    assert lines[2] == "```sh", lines[:6]  # the set-up commands come first
    assert lines[3].startswith("make demo "), lines[:6]
    assert lines[4].startswith("make test "), lines[:6]
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert len([target for target in targets if target.startswith("docs/")]) >= 40
    for target in targets:
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).is_file(), f"README.md links to {target}, which is not there"
    linked = {target for target in targets if target.startswith("docs/")}
    pages = {str(path.relative_to(ROOT)) for path in DOCS.rglob("*.md")}
    assert pages - linked == {"docs/index.md"}, "a page the README does not link to"


@pytest.mark.acceptance
@pytest.mark.slow
def test_the_short_readmes_first_job_completes_in_a_fresh_folder(tmp_path: Path) -> None:
    text = README.read_text()
    python = re.search(r"```python\n# shop_jobs.py\n(.*?)```", text, re.S)
    shell = re.search(r"```sh\n(export JOBS_IMPORTS=.*?)```", text, re.S)
    assert python is not None
    assert shell is not None
    (tmp_path / "shop_jobs.py").write_text(python.group(1))
    script = f"set -eu\n{shell.group(1)}".replace(
        "jobctl submit receipt --input '{\"order_id\": 42}' --wait",
        "jobctl submit receipt --input '{\"order_id\": 42}' --wait --timeout 120",
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("JOBS_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    log = tmp_path / "output.log"
    with log.open("w") as sink:  # a file, not a pipe: the worker and sweeper keep it open
        process = subprocess.Popen(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            process.wait(timeout=180)
        finally:
            end_process_group(process.pid)  # the worker and sweeper it left running
    output = log.read_text()
    assert process.returncode == 0, output
    assert '{"sent": "receipt for order 42"}' in output
