"""Child IDs: no two (parent, key) pairs, nor a map's (parent, key, index), derive one ID,
and no caller-chosen ID can take a child's before its parent spawns it. Keys without the
separator keep the ``<parent>.<key>`` form that earlier children were stored under."""

from __future__ import annotations

import itertools

import pytest
from click.testing import CliRunner

import jobs
from jobs._core.context import JobContext
from jobs._core.errors import InvalidInput
from jobs._core.states import State
from jobs._core.waits import child_id_of
from jobs.application import default_app
from jobs.cli import main
from jobs.testing import drain

ALPHABET = "a.%@0"


def test_no_two_parent_and_key_pairs_derive_one_id() -> None:
    keys = [
        "".join(letters)
        for size in range(1, 4)
        for letters in itertools.product(ALPHABET, repeat=size)
    ]
    parents = ["a", "a.b", "a.a", "a.0", child_id_of("a", "a.0"), child_id_of("a", "0")]
    derived: dict[str, tuple[str, str, int | None]] = {}
    for parent, key, index in itertools.product(parents, keys, [None, 0, 1]):
        child = child_id_of(parent, key, index)
        assert derived.setdefault(child, (parent, key, index)) == (parent, key, index), child
    assert len(derived) == len(parents) * len(keys) * 3


def test_the_issue_s_collisions_are_apart() -> None:
    assert child_id_of("a", "b.c") != child_id_of("a.b", "c")
    assert child_id_of("p", "x.0") != child_id_of("p", "x", 0)  # spawn against a map's child
    assert child_id_of("p.x", "0") != child_id_of("p", "x", 0)  # a grandchild against it
    assert child_id_of("a", "b@2030-01-01T00:00:00Z") != "a.b@2030-01-01T00:00:00Z"  # a tick
    long_parent = "p" * 195
    assert child_id_of(long_parent, "x.0") != child_id_of(long_parent, "x", 0)


def test_keys_without_the_separator_keep_the_stored_form() -> None:
    assert child_id_of("order-7", "charge") == "order-7.charge"
    assert child_id_of("p", "map", 0) == "p.map.0"
    assert child_id_of("p", "map:2", 11) == "p.map:2.11"
    assert child_id_of("order-7.charge", "c1") == "order-7.charge.c1"
    assert child_id_of("p" * 195, "charge").startswith("child-")


@jobs.job("collide_nester")
def collide_nester(ctx: JobContext) -> list[str]:
    return ctx.wait_for([ctx.spawn("collide_leaf", {"who": "grandchild"}, key="c")])


@jobs.job("collide_leaf")
def collide_leaf(ctx: JobContext, who: str) -> str:
    return who


@jobs.job("collide_parent")
def collide_parent(ctx: JobContext) -> list[object]:
    nester = ctx.spawn("collide_nester", key="b")  # a.b, which spawns a.b.c
    dotted = ctx.spawn("collide_leaf", {"who": "dotted"}, key="b.c")  # was a.b.c too
    mapped = ctx.map("collide_leaf", [{"who": "mapped"}], key="x")  # a.x.0
    digits = ctx.spawn("collide_leaf", {"who": "spawned"}, key="x.0")  # was a.x.0 too
    return [*ctx.wait_for([nester, dotted, digits]), mapped]


def test_a_parent_whose_keys_once_collided_finishes_with_every_child() -> None:
    with default_app().runtime.doorbell_off():
        parent = jobs.submit("collide_parent", job_id="a")
    for _ in range(6):
        drain()

    assert jobs.get(parent).state is State.COMPLETED, jobs.get(parent).last_error
    assert jobs.get(parent).result == [["grandchild"], "dotted", "spawned", ["mapped"]]
    children = {child.id for child in jobs.children(parent)}
    assert children == {"a.b", "a.b%2Ec", "a.x.0", "a.x%2E0"}
    assert [child.id for child in jobs.children("a.b")] == ["a.b.c"]


@pytest.mark.parametrize("squat", ["a.b", "order-7.charge", "child-" + "0" * 64, "me@example.com"])
def test_a_caller_cannot_take_a_child_s_id(squat: str) -> None:
    with pytest.raises(InvalidInput, match="reserved for child jobs"):
        jobs.submit("collide_leaf", {"who": "squat"}, job_id=squat)
    with pytest.raises(InvalidInput, match="reserved for child jobs"):
        jobs.submit_many("collide_leaf", [{"who": "squat"}], job_ids=[squat])
    result = CliRunner().invoke(
        main, ["submit", "collide_leaf", "--input", '{"who": "x"}', "--id", squat]
    )
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "reserved for child jobs" in result.stderr
    with pytest.raises(InvalidInput, match="reserved for child jobs"):
        default_app().jobs.check_submit("collide_leaf", {"who": "squat"}, job_id=squat)
    assert jobs.list_jobs(limit=10) == []
