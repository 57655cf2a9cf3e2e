"""What a process runtime is given, it gets through its constructor and its own methods: the
doorbell from the factory it was built with (on first need, once), a pool child's way of
ending stuck runs reaching a heartbeat already running, the outage log told the target."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs._config.settings import Settings, from_env
from jobs._core.outage import OutageLog
from jobs._core.records import Batch
from jobs._core.registry import Registry
from jobs._worker.process import ProcessRuntime


def test_the_doorbell_is_made_once_by_the_runtimes_factory(tmp_path: Path) -> None:
    made: list[tuple[Settings, Callable[[list[str]], None]]] = []
    rung: list[list[str]] = []

    def factory(settings: Settings, on_lost: Callable[[list[str]], None]) -> Any:
        made.append((settings, on_lost))
        return lambda batch: rung.append(list(batch.job_ids))

    settings = from_env({"JOBS_DATA_DIR": str(tmp_path)})
    runtime = ProcessRuntime(settings, Registry(imports=()), factory)
    assert made == []  # nothing made before the first ring
    assert runtime.ring_batch(Batch(("a",)))
    assert runtime.ring_batch(Batch(("b",)))
    assert rung == [["a"], ["b"]]
    assert len(made) == 1
    assert made[0][0] is settings
    runtime.close()


def test_ending_stuck_runs_reaches_a_heartbeat_already_built(tmp_path: Path) -> None:
    runtime = ProcessRuntime(
        from_env({"JOBS_DATA_DIR": str(tmp_path)}), Registry(imports=()), lambda s, lost: None
    )
    try:
        heartbeat = runtime.heartbeat
        assert heartbeat.stop_process is None
        assert heartbeat.backstop is None

        def stop(why: str) -> None: ...

        def backstop(seconds: float | None) -> None: ...

        runtime.stop_on_timeout(stop, backstop)
        assert heartbeat.stop_process is stop
        assert heartbeat.backstop is backstop
        runtime.stop_on_timeout(None)
        assert heartbeat.stop_process is None
        assert heartbeat.backstop is None
    finally:
        runtime.close()


def test_the_outage_log_names_what_it_was_told(caplog: Any) -> None:
    outages = OutageLog()
    outages.describe("db1:5432, db2:5432")
    with caplog.at_level("WARNING", logger="jobs"):
        outages.unreachable(OSError("connection refused"))
    assert "database unreachable (db1:5432, db2:5432)" in caplog.text
