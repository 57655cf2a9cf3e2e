"""Durable jobs hear a worker's Celery signals only for the apps they are installed on:
nothing is connected at import, ``install(app)`` (and ``make_app``) connects each handler
once for its app, and a signal sent for another app's worker does nothing."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery, current_app, signals

from jobs._config.settings import from_env
from jobs._core.registry import Registry
from jobs._worker import signals as worker_signals
from jobs._worker.celery_setup import make_app
from jobs._worker.installed import installed_on
from jobs._worker.signals import WORKER_SIGNALS
from jobs.application import JobsApp
from jobs.contrib.celery import install

ROOT = Path(__file__).resolve().parent.parent

SIGNAL_NAMES = (
    "celeryd_init",
    "worker_init",
    "celeryd_after_setup",
    "worker_shutting_down",
    "worker_ready",
    "worker_process_init",
    "worker_process_shutdown",
    "worker_shutdown",
)


def receivers_for(celery: Any) -> dict[str, int]:
    """How many receivers each worker signal has for ``celery`` (their dispatch_uid names
    the app's id)."""
    suffix = f":{id(celery)}"
    return {
        name: sum(
            1
            for (uid, _sender), _receiver in getattr(signals, name).receivers
            if isinstance(uid, str) and uid.startswith("durable_jobs:") and uid.endswith(suffix)
        )
        for name in SIGNAL_NAMES
    }


def jobs_app(tmp_path: Path) -> JobsApp:
    return JobsApp(from_env({"JOBS_DATA_DIR": str(tmp_path)}), registry=Registry(imports=()))


@pytest.fixture
def as_current() -> Iterator[Any]:
    """Make an app the process's current one for the test (as a worker does), then put the
    one before back."""
    before = current_app._get_current_object()
    try:
        yield lambda app: app.set_current()
    finally:
        before.set_current()


def test_importing_the_celery_side_connects_no_signal() -> None:
    code = f"""
import json
from celery import signals
names = {list(SIGNAL_NAMES)!r}
before = {{name: len(getattr(signals, name).receivers) for name in names}}
import jobs._worker.celery_setup, jobs._worker.delivery, jobs.contrib.celery  # noqa
import jobs._worker.signals, jobs._worker.pool_child  # noqa
after = {{name: len(getattr(signals, name).receivers) for name in names}}
print(json.dumps([before, after]))
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    before, after = json.loads(out.stdout.splitlines()[-1])
    assert after == before


def test_install_twice_connects_each_handler_once(tmp_path: Path) -> None:
    app = Celery("proj", broker="memory://", set_as_current=False)
    assert set(receivers_for(app).values()) == {0}
    application = jobs_app(tmp_path)
    install(app, jobs_app=application)
    connected = receivers_for(app)
    # worker_shutdown and worker_process_shutdown each have one handler, as do the others.
    assert connected == dict.fromkeys(SIGNAL_NAMES, 1)
    assert len(WORKER_SIGNALS) == len(SIGNAL_NAMES)
    install(app, jobs_app=application)
    assert receivers_for(app) == connected


def test_make_app_connects_the_handlers_for_its_app_only(tmp_path: Path) -> None:
    application = jobs_app(tmp_path)
    dedicated = make_app(application.settings, application)
    plain = make_app(application.settings)  # no durable jobs on it
    assert receivers_for(dedicated) == dict.fromkeys(SIGNAL_NAMES, 1)
    assert set(receivers_for(plain).values()) == {0}


def test_a_signal_acts_only_for_the_worker_of_its_app(tmp_path: Path, as_current: Any) -> None:
    ours = Celery("ours", broker="memory://", set_as_current=False)
    theirs = Celery("theirs", broker="memory://", set_as_current=False)
    install(ours, jobs_app=jobs_app(tmp_path / "ours"))
    install(theirs, jobs_app=jobs_app(tmp_path / "theirs"))
    ours_flag = installed_on(ours).shutting_down  # type: ignore[union-attr]
    theirs_flag = installed_on(theirs).shutting_down  # type: ignore[union-attr]
    try:
        as_current(theirs)  # the worker of the other app shuts down
        signals.worker_shutting_down.send(sender="node@host", sig="TERM", how="Warm", exitcode=0)
        assert theirs_flag.is_set()
        assert not ours_flag.is_set()
        theirs_flag.clear()
        as_current(ours)
        signals.worker_shutting_down.send(sender="node@host", sig="TERM", how="Warm", exitcode=0)
        assert ours_flag.is_set()
        assert not theirs_flag.is_set()
    finally:
        ours_flag.clear()
        theirs_flag.clear()
    # celeryd_init of a worker of an app without durable jobs: nothing is added to its queues.
    plain = Celery("plain", broker="memory://", set_as_current=False)
    known = set(plain.amqp.queues)
    signals.celeryd_init.send(
        sender="node@host", instance=SimpleNamespace(app=plain), conf=plain.conf, options={}
    )
    assert set(plain.amqp.queues) == known


def test_an_app_collected_leaves_no_receiver_at_the_next_install(tmp_path: Path) -> None:
    app = Celery("gone", broker="memory://", set_as_current=False)
    install(app, jobs_app=jobs_app(tmp_path / "gone"))
    gone = weakref.ref(app)
    del app
    gc.collect()
    assert gone() is None  # the receivers hold the app weakly: it and its jobs are collected
    fresh = Celery("next", broker="memory://", set_as_current=False)
    install(fresh, jobs_app=jobs_app(tmp_path))
    assert receivers_for(fresh) == dict.fromkeys(SIGNAL_NAMES, 1)
    # The receivers of collected apps were disconnected at that install.
    assert all(celery() is not None for _signal, _uid, celery in worker_signals._connected)
    known = {uid for _signal, uid, _celery in worker_signals._connected}
    for name in SIGNAL_NAMES:
        for (uid, _sender), _receiver in getattr(signals, name).receivers:
            if isinstance(uid, str) and uid.startswith("durable_jobs:"):
                assert uid in known
