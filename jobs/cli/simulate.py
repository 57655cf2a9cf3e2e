"""The seed scenario, replayed step by step on the real store.

Why a replay and not a diagram: the claim, the fence and the lease check shown here are
the production statements of :class:`jobs._store.JobStore`, run on a private
in-memory SQLite database under a :class:`LogicalClock` (one tick is one step). So the
story "a worker crashes holding a lease; another takes the job over once the lease runs
out; the first worker's late write is refused" is checked, not just told, and it prints
the same lines every time on every machine: no wall-clock time reaches the output, and
``JOBS_DATABASE_URL`` is never touched.
"""

from __future__ import annotations

from typing import Any

from jobs._core.errors import InvalidInput, LeaseLost
from jobs._store import Claim, Job, JobStore, Transition
from jobs._store.clock import LogicalClock
from jobs._store.db import make_engine
from jobs._store.schema import upgrade

JOB_ID = "T-42"
KIND = "check_order"
INPUTS = {"order_id": 42}
STEP_NAME = "lookup"
STEP_OUTPUT = {"order_id": 42, "status": "paid"}
MAX_ATTEMPTS = 3


class _Scene:
    """The store, its logical clock and the lines told so far."""

    def __init__(self, store: JobStore, clock: LogicalClock) -> None:
        self.store = store
        self.clock = clock
        self.lines: list[str] = []

    def step(self) -> int:
        return self.ticks(self.clock.instant())

    def ticks(self, instant: Any) -> int:
        value = self.clock.ticks_of(instant)
        assert value is not None
        return round(value)

    def say(self, text: str) -> None:
        self.lines.append(f"step {self.step()}: {text}")

    def view(self, job: Job) -> dict[str, Any]:
        """The job's fields with instants in steps, so the output carries no real time."""
        lease = None if job.lease_until is None else self.ticks(job.lease_until)
        return {
            "task_id": job.id,
            "state": job.state.value,
            "owner": job.owner,
            "lease_until": lease,
            "fence": job.fence,
            "attempts": job.attempts,
        }


def simulate(lease_steps: int = 2, steps: int = 4) -> list[str]:
    """Replay the seed scenario and return its lines.

    ``lease_steps`` is the lease both workers claim with; ``steps`` bounds the run: worker B
    tries to take the job over at steps 1 … ``steps - 1``.
    """
    if lease_steps < 1:
        raise InvalidInput("--lease-steps must be at least 1")
    if steps < 1:
        raise InvalidInput("--steps must be at least 1")
    engine = make_engine("sqlite://")
    try:
        upgrade(engine)
        clock = LogicalClock()
        scene = _Scene(JobStore(engine, clock=clock), clock)
        _play(scene, lease_steps, steps)
        return scene.lines
    finally:
        engine.dispose()


def _play(scene: _Scene, lease_steps: int, steps: int) -> None:
    store = scene.store
    store.submissions.create(KIND, INPUTS, job_id=JOB_ID, max_attempts=MAX_ATTEMPTS)
    claim_a = store.ownership.claim(JOB_ID, "A", lease_seconds=lease_steps)
    assert claim_a is not None, "a fresh QUEUED job must be claimable"
    scene.say(f"A claimed {scene.view(claim_a.job)}")
    # A crashes here: it never renews, records nothing, and only comes back too late.
    claim_b = _take_over(scene, lease_steps, steps)
    if claim_b is None:
        return
    _refuse_late_write(scene, claim_a)
    _finish(scene, claim_b)
    _tell_history(scene)


def _take_over(scene: _Scene, lease_steps: int, steps: int) -> Claim | None:
    """B retries the claim once per step; only an expired lease lets it through."""
    for _ in range(1, steps):
        scene.clock.advance()
        claim = scene.store.ownership.claim(JOB_ID, "B", lease_seconds=lease_steps)
        if claim is not None:
            scene.say(f"B recovered {scene.view(claim.job)}")
            return claim
        held = scene.store.reads.get(JOB_ID)
        scene.say(f"B blocked (A's lease runs until step {scene.ticks(held.lease_until)})")
    scene.say(f"{JOB_ID} not recovered within {steps} steps; run more with --steps")
    return None


def _refuse_late_write(scene: _Scene, stale: Claim) -> None:
    """A wakes up and writes with its old claim: the fence no longer matches."""
    try:
        scene.store.ownership.record_step(stale, STEP_NAME, STEP_OUTPUT)
    except LeaseLost as lost:
        scene.say(f"A's late write refused: LeaseLost {lost}")
        return
    raise RuntimeError("the store accepted a write from a fenced-out owner")


def _finish(scene: _Scene, claim: Claim) -> None:
    """B works on in the next step when its lease still covers it (a lease of N steps
    claimed at step s covers steps s … s+N-1), else at once."""
    lease_end = scene.ticks(claim.job.lease_until)
    if scene.step() + 1 < lease_end:
        scene.clock.advance()
    scene.store.ownership.record_step(claim, STEP_NAME, STEP_OUTPUT)
    scene.say(f"B recorded step {STEP_NAME!r}: {STEP_OUTPUT}")
    done = scene.store.ownership.complete(claim, {"order_id": 42, "checked": True}).job
    scene.say(f"B completed {scene.view(done)}")


def _tell_history(scene: _Scene) -> None:
    history = scene.store.reads.history(JOB_ID)
    scene.lines.append("history: " + " -> ".join(_label(t) for t in history))
    for move in history:
        scene.lines.append("  " + _describe(scene, move))
    for step in scene.store.reads.steps(JOB_ID):
        scene.lines.append(
            f"recorded step {step.name!r} by {step.owner} (fence {step.fence}) "
            f"at step {scene.ticks(step.recorded_at)}: {step.output}"
        )


def _label(move: Transition) -> str:
    state = move.to_state.value
    return f"{state}({move.owner})" if state == "RUNNING" else state


def _describe(scene: _Scene, move: Transition) -> str:
    source = move.from_state.value if move.from_state is not None else "(new)"
    who = f" owner={move.owner} fence={move.fence}" if move.owner is not None else ""
    return f"at step {scene.ticks(move.at)}: {source} -> {move.to_state.value}{who} ({move.reason})"
