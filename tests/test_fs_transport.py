"""The embedded broker's transport: a message file appears whole or not at all, and a file
that cannot be decoded is dropped with one log line instead of stopping the worker (kombu's
own filesystem transport raises, and a Celery worker's main process dies of it)."""

from __future__ import annotations

import json
from pathlib import Path
from queue import Empty

import pytest
from kombu import Connection

from jobs._doorbell.fs_transport import TRANSPORT


def connection(folder: Path, transport: str = TRANSPORT) -> Connection:
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder)}
    return Connection("filesystem://", transport=transport, transport_options=options)


def test_a_half_written_or_garbled_file_never_stops_the_consumer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with connection(tmp_path) as conn:
        channel = conn.default_channel
        first = {"body": "first", "properties": {"delivery_tag": "t1"}}  # a minimal envelope
        channel._put("jobs", first)
        # What kombu's in-place write leaves for a moment: the file, still empty.
        (tmp_path / "0_torn.jobs.msg").write_bytes(b"")
        # A message of ours still being written: not a name any consumer takes.
        (tmp_path / ".9_partial.jobs.msg.part").write_bytes(b'{"bo')
        got = [channel._get("jobs")]
        with pytest.raises(Empty):
            channel._get("jobs")
    assert got == [first]
    assert "dropped an unreadable message file" in caplog.text
    assert (tmp_path / ".9_partial.jobs.msg.part").exists()


def test_kombus_own_transport_dies_on_the_same_file(tmp_path: Path) -> None:
    """The control: the defect the transport above removes."""
    with connection(tmp_path, "filesystem") as conn:
        (tmp_path / "0_torn.jobs.msg").write_bytes(b"")
        with pytest.raises(json.JSONDecodeError):
            conn.default_channel._get("jobs")


def test_messages_are_renamed_into_place(tmp_path: Path) -> None:
    with connection(tmp_path) as conn:
        for n in range(20):
            conn.default_channel._put("jobs", {"n": n})
    names = [path.name for path in tmp_path.iterdir()]
    assert len(names) == 20
    assert all(name.endswith(".jobs.msg") and not name.startswith(".") for name in names)


def test_json_that_is_no_envelope_is_dropped_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 8: anyone who can write to the folder can leave valid JSON that kombu cannot
    turn into a message (kombu raised in the worker's loop on it)."""
    with connection(tmp_path) as conn:
        for number, content in enumerate([b"{}", b"[1, 2]", b'{"properties": {}}']):
            (tmp_path / f"{number}_x.jobs.msg").write_bytes(content)
        with pytest.raises(Empty):
            conn.default_channel._get("jobs")
    assert caplog.text.count("that is not a message envelope") == 3
