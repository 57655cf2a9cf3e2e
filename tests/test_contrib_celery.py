"""``jobs.contrib.celery.install(app)`` on a user's own Celery app: what it adds (the runner
and a task per kind, with what durability needs as task options; the doorbell gate where the
app uses Celery's default consumer; the app's broker for the doorbells) and what it leaves
exactly as the user set it. The same app with real workers, Flower and two queues:
tests/acceptance/test_celery_project.py."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from jobs._config.settings import from_env
from jobs._core.registry import Registry
from jobs._worker.installed import JOB_TASK_OPTIONS, installed_on, register_kind_tasks
from jobs.application import JobsApp
from jobs.contrib.celery import GATED_CONSUMER, install

USER_CONF: dict[str, Any] = {
    "task_serializer": "yaml",
    "accept_content": ["json", "yaml"],
    "task_acks_late": False,
    "task_reject_on_worker_lost": False,
    "result_backend": "redis://127.0.0.1:6379/9",
    "task_routes": {"proj.tasks.*": {"queue": "default"}},
    "task_default_queue": "default",
    "worker_prefetch_multiplier": 4,
}


def user_app(**conf: Any) -> Celery:
    app = Celery("proj", broker="amqp://guest:guest@127.0.0.1:5672/proj", set_as_current=False)
    app.conf.update({**USER_CONF, **conf})

    @app.task(name="proj.tasks.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    return app


def jobs_app(tmp_path: Path) -> JobsApp:
    """An application of the test's own: its settings given, one kind on its own queue."""
    registry = Registry(imports=())
    registry.register("transcode", lambda ctx, video_id: video_id, queue="video")
    return JobsApp(from_env({"JOBS_DATA_DIR": str(tmp_path)}), registry=registry)


def test_install_adds_the_runner_and_a_task_per_kind_with_durability_options(
    tmp_path: Path,
) -> None:
    app = user_app()
    installed = install(app, jobs_app=jobs_app(tmp_path))
    tasks = app.tasks
    for name in ("jobs.run", "jobs.transcode"):
        task = tasks[name]
        assert task.acks_late is True
        assert task.reject_on_worker_lost is True
        assert task.acks_on_failure_or_timeout is True
        assert task.serializer == "json"
        assert task.ignore_result is True
    assert installed_on(app) is not None
    assert installed_on(app).host is installed  # type: ignore[union-attr]
    # A kind registered after install gets its task at once, in any process of the app.
    installed.registry.register("send_email", lambda ctx, to: to, queue="mail")
    assert tasks["jobs.send_email"].acks_late is True
    added = register_kind_tasks(app, installed_on(app), installed.registry.names())  # type: ignore[arg-type]
    assert added == []  # nothing left to add


def test_install_leaves_the_users_settings_and_tasks_as_they_were(tmp_path: Path) -> None:
    app = user_app()
    before = {key: app.conf[key] for key in USER_CONF}
    install(app, jobs_app=jobs_app(tmp_path))
    routes = app.conf.task_routes  # the kinds' routes first, then the app's own as they were
    assert routes[1:] == (before.pop("task_routes"),)
    assert {key: app.conf[key] for key in USER_CONF if key != "task_routes"} == before
    add = app.tasks["proj.tasks.add"]
    assert add.acks_late is False  # the app's own default, not ours
    assert add.serializer == "yaml"
    assert add.reject_on_worker_lost is False
    assert app.conf.worker_consumer == GATED_CONSUMER  # it used Celery's default consumer
    assert set(JOB_TASK_OPTIONS) >= {"acks_late", "reject_on_worker_lost", "serializer"}


def test_a_custom_consumer_is_kept_and_said_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = user_app(worker_consumer="proj.consumer:Mine")
    with caplog.at_level(logging.WARNING, logger="jobs"):
        install(app, jobs_app=jobs_app(tmp_path))
    assert app.conf.worker_consumer == "proj.consumer:Mine"
    assert "without the gate" in caplog.text


def test_installing_twice_is_a_no_op_and_another_jobs_app_is_refused(tmp_path: Path) -> None:
    app = user_app()
    first = jobs_app(tmp_path)
    assert install(app, jobs_app=first) is first
    assert install(app, jobs_app=first) is first
    with pytest.raises(ValueError, match="another jobs application"):
        install(app, jobs_app=jobs_app(tmp_path))


def test_the_apps_broker_carries_the_doorbells(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for key in ("JOBS_BROKER_URL", "JOBS_DATABASE_URL", "JOBS_CELERY_APP"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("JOBS_DATA_DIR", str(tmp_path))
    registry = Registry(imports=())
    quiet = JobsApp(registry=registry)
    assert quiet.settings.is_embedded_broker  # the default, before the app is adopted
    install(user_app(), jobs_app=quiet)
    assert quiet.settings.broker_url == "amqp://guest:guest@127.0.0.1:5672/proj"
    assert not quiet.settings.is_embedded_broker
    monkeypatch.setenv("JOBS_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672/other")
    quiet.reset_settings()
    with caplog.at_level(logging.WARNING, logger="jobs"):
        assert quiet.settings.broker_url == "amqp://guest:guest@127.0.0.1:5672/proj"
    assert "differs from the broker of the Celery app" in caplog.text
    assert "guest:guest" not in caplog.text  # the password is masked


def test_jobs_celery_app_is_checked_and_must_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jobs  # noqa: PLC0415

    monkeypatch.setenv("JOBS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("JOBS_CELERY_APP", "not a module")
    with pytest.raises(jobs.SettingsError, match="is not a module path"):
        JobsApp(registry=Registry(imports=())).settings  # noqa: B018
    (tmp_path / "plainproj.py").write_text(
        "from celery import Celery\napp = Celery('plain', set_as_current=False)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("JOBS_CELERY_APP", "plainproj")
    with pytest.raises(jobs.SettingsError, match=r"call jobs.contrib.celery.install\(app\)"):
        JobsApp(registry=Registry(imports=())).import_celery_app()
    monkeypatch.setenv("JOBS_CELERY_APP", "no_such_project_module")
    with pytest.raises(jobs.SettingsError, match="cannot import it"):
        JobsApp(registry=Registry(imports=())).import_celery_app()


def test_install_puts_every_durable_queue_with_its_arguments_into_the_apps_config(
    tmp_path: Path,
) -> None:
    app = user_app()
    application = install(app, jobs_app=jobs_app(tmp_path))
    queues = {queue.name: queue for queue in app.conf.task_queues}
    # The app listed no queues: Celery's default queue stays, beside the durable ones.
    assert set(queues) == {"default", "jobs", "video"}
    assert queues["default"].queue_arguments is None
    for name in ("jobs", "video"):
        assert queues[name].queue_arguments == {"x-max-priority": 9}
    # What a worker with no -Q consumes, and how every process of the app declares them.
    assert set(app.amqp.queues.consume_from) == {"default", "jobs", "video"}
    # A kind defined after install, with the app's queues already built: there at once.
    application.registry.register("send_email", lambda ctx, to: to, queue="mail")
    assert app.amqp.queues["mail"].queue_arguments == {"x-max-priority": 9}
    assert "mail" in [queue.name for queue in app.conf.task_queues]
    # Each kind's task is routed to its queue; the app's own routes still route its tasks.
    router = app.amqp.router
    assert router.route({}, "jobs.transcode")["queue"].name == "video"
    assert router.route({}, "jobs.send_email")["queue"].name == "mail"
    assert router.route({}, "jobs.run")["queue"].name == "jobs"
    assert router.route({}, "proj.tasks.add")["queue"].name == "default"


def test_a_projects_own_queue_of_the_same_name_is_declared_as_the_app_declares_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from jobs._doorbell.queues import declared_queue  # noqa: PLC0415

    app = user_app(task_default_queue="jobs")
    with caplog.at_level(logging.WARNING, logger="jobs"):
        application = install(app, jobs_app=jobs_app(tmp_path))
    assert "set JOBS_QUEUE to another name" in caplog.text
    queues = [queue for queue in app.conf.task_queues if queue.name == "jobs"]
    assert len(queues) == 1
    assert queues[0].queue_arguments is None  # the app's own declaration, kept
    # The doorbells declare it the same way, so no process is refused (PRECONDITION_FAILED).
    assert declared_queue(app, application.settings, "jobs").queue_arguments is None
    assert declared_queue(app, application.settings, "video").queue_arguments == {
        "x-max-priority": 9
    }


def test_install_leaves_the_app_unfinalized_so_its_later_settings_reach_its_own_tasks(
    tmp_path: Path,
) -> None:
    # A project (or Celery's own suite: its security test) configures the app after
    # install; Celery binds a task's serializer from the app's settings when the app is
    # finalized, so an install that finalized the app would freeze its tasks as they were.
    app = user_app()
    install(app, jobs_app=jobs_app(tmp_path))  # with a kind: its task is registered
    assert not app.finalized
    app.conf.update(task_serializer="yaml")
    assert app.tasks["proj.tasks.add"].serializer == "yaml"


def test_sharing_the_apps_own_quorum_queue_warns_of_the_delivery_limit_not_priorities(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from kombu import Queue  # noqa: PLC0415

    # Celery's own suite on quorum queues: the app's queue ``celery`` is a quorum queue
    # without a delivery limit, and durable jobs share it (JOBS_QUEUE=celery).
    app = user_app(
        task_queues=[Queue("celery", queue_arguments={"x-queue-type": "quorum"})],
    )
    settings = from_env(
        {"JOBS_DATA_DIR": str(tmp_path), "JOBS_QUEUE": "celery", "JOBS_QUEUE_TYPE": "quorum"}
    )
    with caplog.at_level(logging.WARNING, logger="jobs"):
        install(app, jobs_app=JobsApp(settings, registry=Registry(imports=())))
    assert "share the Celery app's own queue 'celery'" in caplog.text
    assert "sets no doorbell aside" in caplog.text
    assert "priorities" not in caplog.text  # a quorum queue of ours has none either


def test_a_kind_looked_up_imports_the_apps_task_modules_once_and_a_broken_one_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jobs  # noqa: PLC0415

    (tmp_path / "shop_tasks.py").write_text(
        "from jobs import REGISTRY\nimport shop_counter\nshop_counter.imported += 1\n"
    )
    (tmp_path / "shop_counter.py").write_text("imported = 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    app = user_app(include=["shop_tasks", "shop_kinds"])
    application = install(app, jobs_app=jobs_app(tmp_path))
    (tmp_path / "shop_kinds.py").write_text("raise RuntimeError('no database configured')\n")
    with pytest.raises(jobs.SettingsError, match="cannot import its task modules: RuntimeError"):
        application.registry.get("ship")
    (tmp_path / "shop_kinds.py").write_text(  # fixed: the next look-up imports again
        "import jobs.contrib.celery\n"
        "from tests.test_contrib_celery import INSTALLED\n"
        "INSTALLED[0].registry.register('ship', lambda ctx, order: order)\n"
    )
    INSTALLED[:] = [application]
    assert application.registry.get("ship").name == "ship"
    assert app.tasks["jobs.ship"].acks_late is True
    with pytest.raises(jobs.UnknownKind):
        application.registry.get("not_a_kind")  # no second import of the app's modules
    import shop_counter  # noqa: PLC0415

    assert shop_counter.imported == 1


INSTALLED: list[JobsApp] = []
