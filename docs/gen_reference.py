"""Reference tables generated from the code, for the documentation site.

Each ``*_table`` function returns Markdown built from what the code defines (the settings'
names and defaults, the state table, the explain reason codes, the metrics, the error
classes), so a reference page cannot leave one out. ``docs/hooks.py`` puts each table where
a page says ``<!-- gen:NAME -->``; ``tests/test_docs.py`` checks every table is complete.
A setting's meaning is its doc line in ``jobs/_config/setting_options.py``. Descriptions the
code does not carry (a reason's meaning) live in the dictionaries below: a name the code
defines without one here is reported as missing, and ``mkdocs build --strict`` fails on it.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable
from pathlib import Path

import jobs._core.errors as errors_module
from jobs._config import setting_options
from jobs._core.states import TERMINAL, TRANSITIONS, State

ROOT = Path(__file__).resolve().parent.parent

REASON_MEANINGS = {
    "sleeping": "a durable timer: until when, which timer",
    "not_due": "a retry's backoff or a start time: until when, and after which error",
    "paused": (
        "its kind or its queue is paused (`jobctl pause`): since when, by whom, why; "
        "`jobctl resume` runs it"
    ),
    "waiting_for_slot": "its kind's `max_running` is reached: n of m running",
    "waiting_for_key_slot": (
        "its kind's `max_running_per_key` is reached for its concurrency key: n of m running"
    ),
    "waiting_for_rate": (
        "its kind's `rate_limit` (or its key's `rate_limit_per_key`) allows no start yet: "
        "when the next start is allowed"
    ),
    "no_worker_on_queue": "no live worker consumes the job's queue",
    "kind_unknown_to_workers": (
        "the workers on its queue do not know its kind: they leave it QUEUED"
    ),
    "waiting_for_worker": "message sent, how long ago, the oldest due job's wait",
    "not_claimed": (
        "due for longer than `JOBS_RING_AGAIN_AFTER_SECONDS` with nothing running: check "
        "that a sweeper runs and that workers consume its queue and know its kind"
    ),
    "waiting_for_version": (
        "recorded under a version of its kind at its first claim, and sent longer than "
        "`JOBS_RING_AGAIN_AFTER_SECONDS` ago: waiting for a worker that runs that version "
        "(see [Changing job code](../guides/changing-code.md#versions))"
    ),
    "message_lost": (
        "sent longer than `JOBS_RING_AGAIN_AFTER_SECONDS` ago: the next sweep re-sends it"
    ),
    "not_sent": "its doorbell is not sent yet (or was lost): the next sweep sends it",
    "waiting_approval": "since when, why",
    "waiting_children": "parked until its children finish: how many are left",
    "waiting_event": "parked until an event arrives (or its deadline passes)",
    "running": "owner, alive or not, lease end",
    "owner_dead": "its owner's process is gone: the next sweep re-queues it",
    "lease_expired": "the next sweep re-queues it",
    "failed": "after n of m attempts, with the error",
    "completed": "finished",
    "cancelled": "stopped by an operator (or its parent's cancel), with the reason",
}

Problems = list[str]


def _cell(text: str) -> str:
    """``text`` as one Markdown table cell (reST roles and double backticks as Markdown)."""
    text = re.sub(r":(?:class|func|data|mod|meth):`~?([^`]+)`", r"`\1`", text)
    text = text.replace("``", "`")
    return text.replace("|", "\\|").replace("\n", " ")


def setting_names() -> list[str]:
    """Every ``JOBS_*`` name the settings table declares, the test-suite's own last."""
    return sorted(setting_options.KNOWN, key=lambda name: (name.startswith("TEST_"), name))


def _default(option: setting_options.Option) -> str:
    if option.shown_default is not None:
        return option.shown_default
    value = option.default
    if value is None or value == ():
        return "(none)"
    if isinstance(value, bool):
        return "`on`" if value else "`off`"
    return f"`{value}`"


def settings_table(problems: Problems) -> str:
    """The ``JOBS_*`` settings: name, default, meaning (all from the settings table)."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for name in setting_names():
        option = setting_options.BY_NAME[name]
        if not option.doc:
            problems.append(f"setting JOBS_{name} has no doc in jobs/_config/setting_options.py")
        rows.append(f"| `JOBS_{name}` | {_default(option)} | {_cell(option.doc)} |")
    for option in setting_options.OPTIONS:
        if option.old_name:
            rows.append(
                f"| `JOBS_{option.old_name}` | | the old name of `JOBS_{option.name}`, read as it"
                f" with a warning (removed in {option.removed_in}) |"
            )
    return "\n".join(rows)


def states_table(problems: Problems) -> str:
    """The states, and every transition with who makes it."""
    lines = ["| state | final |", "| --- | --- |"]
    for state in State:
        lines.append(f"| `{state.value}` | {'yes' if state in TERMINAL else ''} |")
    lines += ["", "| from | to | who makes the move |", "| --- | --- | --- |"]
    for (source, target), who in TRANSITIONS.items():
        origin = "(submit)" if source is None else f"`{source.value}`"
        lines.append(f"| {origin} | `{target.value}` | {_cell(who)} |")
    return "\n".join(lines)


def explain_reasons() -> list[str]:
    """Every reason code :func:`jobs._service.explain.explain` can give, read from its source:
    the string first in a returned tuple, or assigned to ``reason``."""
    tree = ast.parse((ROOT / "jobs" / "_service" / "explain.py").read_text())
    found: list[str] = []
    for node in ast.walk(tree):
        value: ast.expr | None = None
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple):
            value = node.value.elts[0] if node.value.elts else None
        elif isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "reason" for target in node.targets
        ):
            value = node.value
        text = value.value if isinstance(value, ast.Constant) else None
        if isinstance(text, str) and text not in found:
            found.append(text)
    return found


def explain_table(problems: Problems) -> str:
    """The reason codes of ``jobctl explain --json``."""
    rows = ["| reason | what it means |", "| --- | --- |"]
    for reason in explain_reasons():
        meaning = REASON_MEANINGS.get(reason)
        if meaning is None:
            problems.append(f"explain reason {reason!r} has no meaning in docs/gen_reference.py")
            meaning = ""
        rows.append(f"| `{reason}` | {_cell(meaning)} |")
    for reason in REASON_MEANINGS:
        if reason not in explain_reasons():
            problems.append(f"explain reason {reason!r} is documented but not in the code")
    return "\n".join(rows)


METRIC_CALLS = {
    "Counter": "counter",
    "CounterMetricFamily": "counter",
    "Histogram": "histogram",
    "GaugeMetricFamily": "gauge",
    "Gauge": "gauge",
}


def _metric_calls(tree: ast.Module) -> list[tuple[str, ast.expr, ast.expr, list[ast.expr]]]:
    """(constructor, name, help, other arguments) of each metric in ``tree``: a call of a
    metric's constructor, or an entry ``"name": ScrapedSeries(Family, help, labels)`` of
    the table of series a scrape reads."""
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(key, ast.Constant)
                    and isinstance(value, ast.Call)
                    and isinstance(value.func, ast.Name)
                    and value.func.id == "ScrapedSeries"
                    and isinstance(value.args[0], ast.Name)
                ):
                    calls.append((value.args[0].id, key, value.args[1], value.args[2:]))
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if len(node.args) >= 2:
                rest = [*node.args[2:], *(keyword.value for keyword in node.keywords)]
                calls.append((called, node.args[0], node.args[1], rest))
    return calls


def metrics() -> list[tuple[str, str, str, list[str]]]:
    """Every metric :mod:`jobs._sweeper.metrics` defines: (name, type, help, labels), read
    from its source (the name and help of each metric's constructor, or of its entry in
    the table of scraped series)."""
    tree = ast.parse((ROOT / "jobs" / "_sweeper" / "metrics.py").read_text())
    found = []
    for called, name, doc, rest in _metric_calls(tree):
        if called not in METRIC_CALLS:
            continue
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            continue
        text = ast.literal_eval(doc) if isinstance(doc, ast.Constant | ast.JoinedStr) else ""
        labels: list[str] = []
        for candidate in rest:
            if isinstance(candidate, ast.List) and all(
                isinstance(item, ast.Constant) for item in candidate.elts
            ):
                labels = [str(ast.literal_eval(item)) for item in candidate.elts]
        found.append((name.value, METRIC_CALLS[called], str(text), labels))
    return found


def metrics_table(problems: Problems) -> str:
    """The Prometheus metrics: name as exported, type, labels, help."""
    rows = ["| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    for name, kind, text, labels in metrics():
        exported = f"{name}_total" if kind == "counter" and not name.endswith("_total") else name
        if not text:
            problems.append(f"metric {name} has no help text")
        shown = ", ".join(f"`{label}`" for label in labels)
        rows.append(f"| `{exported}` | {kind} | {shown} | {_cell(text)} |")
    return "\n".join(rows)


def error_classes() -> list[type[Exception]]:
    """Every error class of :mod:`jobs._core.errors`, base first."""
    return [
        value
        for _, value in inspect.getmembers(errors_module, inspect.isclass)
        if issubclass(value, Exception) and value.__module__ == errors_module.__name__
    ]


def errors_table(problems: Problems) -> str:
    """The error classes, each under :class:`jobs.JobError`."""
    rows = ["| error | is a | when |", "| --- | --- | --- |"]
    for error in sorted(
        error_classes(), key=lambda cls: (cls is not errors_module.JobError, cls.__name__)
    ):
        doc = inspect.getdoc(error) or ""
        if not doc:
            problems.append(f"error {error.__name__} has no docstring")
        base = error.__mro__[1].__name__
        rows.append(f"| `jobs.{error.__name__}` | `{base}` | {_cell(doc)} |")
    return "\n".join(rows)


TABLES: dict[str, Callable[[Problems], str]] = {
    "settings": settings_table,
    "states": states_table,
    "explain": explain_table,
    "metrics": metrics_table,
    "errors": errors_table,
}
