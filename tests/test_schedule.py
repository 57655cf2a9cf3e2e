"""Schedules as pure values: parsing, ticks in a time zone across DST, catch-up policies."""

from __future__ import annotations

import datetime as dt

import pytest

from jobs._core.errors import InvalidInput
from jobs._core.schedule_ticks import (
    Schedule,
    check_schedule,
    latest_tick,
    next_tick,
    normalize_spec,
    tick_job_id,
)

UTC = dt.UTC


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("0 * * * *", "0 * * * *"),
        ("  */15   9-17 * * MON-FRI ", "*/15 9-17 * * MON-FRI"),
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("every 90s", "every 90s"),
        ("every 5m", "every 300s"),
        ("every 2h", "every 7200s"),
        ("every 1d", "every 86400s"),
        (45, "every 45s"),
        (dt.timedelta(minutes=2), "every 120s"),
    ],
)
def test_specs_are_normalized(given: object, stored: str) -> None:
    assert normalize_spec(given) == stored  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad", ["", "* * * *", "61 * * * *", "every 0s", "every 5w", "0 * * * * *", 0, 1.5, True]
)
def test_bad_specs_are_refused_with_the_reason(bad: object) -> None:
    with pytest.raises(InvalidInput, match="schedule"):
        normalize_spec(bad)  # type: ignore[arg-type]


def test_names_time_zones_and_policies_are_checked() -> None:
    with pytest.raises(InvalidInput, match="time zone"):
        check_schedule("r", "@hourly", "Mars/Olympus", "latest")
    with pytest.raises(InvalidInput, match="catch_up"):
        check_schedule("r", "@hourly", "UTC", "some")
    with pytest.raises(InvalidInput, match="'@'"):
        check_schedule("a@b", "@hourly", "UTC", "latest")


def test_cron_ticks_are_strictly_after_and_in_utc() -> None:
    assert next_tick("0 * * * *", "UTC", at("2026-11-30 21:00:00")) == at("2026-11-30 22:00:00")
    assert next_tick("0 * * * *", "UTC", at("2026-11-30 21:00:00.5")) == at("2026-11-30 22:00:00")
    assert latest_tick("0 * * * *", "UTC", at("2026-11-30 21:59:59")) == at("2026-11-30 21:00:00")
    assert latest_tick("0 * * * *", "UTC", at("2026-11-30 21:00:00")) == at("2026-11-30 21:00:00")


def test_cron_is_read_in_its_time_zone_across_daylight_saving() -> None:
    # 09:00 in Berlin is 08:00 UTC in winter and 07:00 UTC in summer (DST began 29 March).
    assert next_tick("0 9 * * *", "Europe/Berlin", at("2026-03-27 12:00")) == at("2026-03-28 08:00")
    assert next_tick("0 9 * * *", "Europe/Berlin", at("2026-03-28 12:00")) == at("2026-03-29 07:00")
    assert latest_tick("0 9 * * *", "Europe/Berlin", at("2026-03-30 06:59")) == at(
        "2026-03-29 07:00"
    )


def test_intervals_tick_on_multiples_of_the_interval_since_the_epoch() -> None:
    assert next_tick("every 300s", "UTC", at("2026-11-30 21:02:10")) == at("2026-11-30 21:05:00")
    assert next_tick("every 300s", "UTC", at("2026-11-30 21:05:00")) == at("2026-11-30 21:10:00")
    assert latest_tick("every 300s", "UTC", at("2026-11-30 21:09:59")) == at("2026-11-30 21:05:00")


def test_catch_up_all_returns_every_missed_tick_and_latest_only_the_last() -> None:
    base = Schedule("r", "k", "0 * * * *", last_tick=at("2026-11-30 18:00"))
    now = at("2026-11-30 21:30")
    every = Schedule(**{**base.__dict__, "catch_up": "all"})
    assert every.due_ticks(now) == [
        at("2026-11-30 19:00"),
        at("2026-11-30 20:00"),
        at("2026-11-30 21:00"),
    ]
    assert base.due_ticks(now) == [at("2026-11-30 21:00")]
    assert Schedule(**{**base.__dict__, "last_tick": at("2026-11-30 21:00")}).due_ticks(now) == []


def test_a_new_schedule_starts_after_its_creation_not_in_the_past() -> None:
    fresh = Schedule("r", "k", "0 * * * *", catch_up="all", created_at=at("2026-11-30 20:30"))
    assert fresh.due_ticks(at("2026-11-30 20:59")) == []
    assert fresh.due_ticks(at("2026-11-30 21:00")) == [at("2026-11-30 21:00")]


def test_a_tick_has_exactly_one_job_id() -> None:
    tick = dt.datetime(2026, 11, 30, 22, 0, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert tick_job_id("report", tick) == "report@2026-11-30T21:00:00Z"
