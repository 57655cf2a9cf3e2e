"""The transition table: what may follow what, and the error for everything else."""

from __future__ import annotations

import itertools

import pytest

from jobs._core import states
from jobs._core.errors import IllegalTransition, JobError
from jobs._core.states import TERMINAL, TRANSITIONS, State

S = State
LEGAL = {
    (None, S.QUEUED),
    (S.QUEUED, S.RUNNING),
    (S.RUNNING, S.RUNNING),
    (S.RUNNING, S.WAITING_APPROVAL),
    (S.WAITING_APPROVAL, S.QUEUED),
    (S.QUEUED, S.QUEUED),
    (S.RUNNING, S.QUEUED),
    (S.RUNNING, S.COMPLETED),
    (S.RUNNING, S.FAILED),
    (S.QUEUED, S.CANCELLED),
    (S.WAITING_APPROVAL, S.CANCELLED),
    (S.RUNNING, S.CANCELLED),
    (S.FAILED, S.QUEUED),  # an operator's retry
    (S.CANCELLED, S.QUEUED),  # an operator's retry
    # Workflows: a parent parked for its children, a job parked for an event.
    (S.RUNNING, S.WAITING),
    (S.WAITING, S.QUEUED),
    (S.WAITING, S.CANCELLED),
}
ALL_PAIRS = list(itertools.product([None, *State], list(State)))


def test_table_is_exactly_the_design() -> None:
    assert set(TRANSITIONS) == LEGAL
    assert all(isinstance(who, str) and who for who in TRANSITIONS.values())


@pytest.mark.parametrize(("source", "target"), sorted(LEGAL, key=str))
def test_every_legal_pair_is_legal_and_checks(source: State | None, target: State) -> None:
    assert states.is_legal(source, target)
    states.check(source, target)  # does not raise


@pytest.mark.parametrize(("source", "target"), [p for p in ALL_PAIRS if p not in LEGAL], ids=str)
def test_every_other_pair_is_refused(source: State | None, target: State) -> None:
    assert not states.is_legal(source, target)
    with pytest.raises(IllegalTransition) as info:
        states.check(source, target)
    assert info.value.source is source
    assert info.value.target is target


def test_waiting_approval_cannot_complete() -> None:
    assert not states.is_legal(S.WAITING_APPROVAL, S.COMPLETED)
    with pytest.raises(IllegalTransition, match=r"WAITING_APPROVAL -> COMPLETED"):
        states.check(S.WAITING_APPROVAL, S.COMPLETED)


@pytest.mark.parametrize("source", sorted(TERMINAL))
def test_nothing_leaves_a_terminal_state_but_an_operators_retry(source: State) -> None:
    for target in State:
        if source in states.RETRYABLE and target is S.QUEUED:
            assert states.is_legal(source, target)
            assert "retry" in TRANSITIONS[(source, target)]
            continue
        assert not states.is_legal(source, target)
        with pytest.raises(IllegalTransition):
            states.check(source, target)


def test_only_failed_and_cancelled_jobs_are_retryable() -> None:
    assert states.RETRYABLE == (S.FAILED, S.CANCELLED)


def test_terminal_states() -> None:
    assert frozenset({S.COMPLETED, S.FAILED, S.CANCELLED}) == TERMINAL


def test_birth_is_only_into_queued() -> None:
    assert states.is_legal(None, S.QUEUED)
    for target in State:
        if target is not S.QUEUED:
            assert not states.is_legal(None, target)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (S.QUEUED, {S.QUEUED, S.WAITING_APPROVAL, S.WAITING, S.RUNNING, S.FAILED, S.CANCELLED}),
        (S.RUNNING, {S.QUEUED, S.RUNNING}),
        (S.WAITING_APPROVAL, {S.RUNNING}),
        (S.WAITING, {S.RUNNING}),
        (S.COMPLETED, {S.RUNNING}),
        (S.FAILED, {S.RUNNING}),
        (S.CANCELLED, {S.QUEUED, S.WAITING_APPROVAL, S.WAITING, S.RUNNING}),
    ],
)
def test_sources_of(target: State, expected: set[State]) -> None:
    sources = states.sources_of(target)
    assert isinstance(sources, tuple)
    assert None not in sources
    assert set(sources) == expected
    assert len(sources) == len(set(sources))


def test_illegal_transition_message_is_clear() -> None:
    err = IllegalTransition(S.COMPLETED, S.QUEUED, "T-42")
    assert isinstance(err, JobError)
    assert str(err) == "job 'T-42': illegal transition COMPLETED -> QUEUED"
    assert err.job_id == "T-42"
    assert str(IllegalTransition(None, S.RUNNING)) == "illegal transition (new) -> RUNNING"
    with pytest.raises(IllegalTransition, match=r"^illegal transition CANCELLED -> RUNNING$"):
        states.check(S.CANCELLED, S.RUNNING)
