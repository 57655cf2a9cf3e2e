"""What a handler sees while it runs: recorded steps, approvals, and its lease.

A handler is re-run from the top after a crash, an approval or a hand-back. Steps
already recorded return their recorded output without running, so the handler walks
quickly back to where the last owner stopped. Control-flow signals (wait for approval,
hand back) derive from BaseException so a handler's ``except Exception`` cannot
swallow them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from jobs.core.errors import InvalidInput, LeaseLost, StepError
from jobs.core.store import Claim, JobStore
from jobs.core.validate import check_name, check_text

T = TypeVar("T")


class JobInterrupt(BaseException):
    """Stops a handler at a step boundary; the runner turns it into a state change."""


class WaitingForApproval(JobInterrupt):
    def __init__(self, reason: str, step_name: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.step_name = step_name


class HandBack(JobInterrupt):
    """The run used up its time budget for one delivery: give the job back to the queue."""


class Unstorable(JobInterrupt):
    """A step name, step output or approval reason that can never be recorded: the job
    fails now with the reason; retrying would only run the step's side effect again."""


def _storable(check: Callable[[], object]) -> None:
    try:
        check()
    except InvalidInput as err:
        raise Unstorable(str(err)) from None


class JobContext:
    def __init__(
        self,
        store: JobStore,
        claim: Claim,
        recorded: dict[str, Any],
        *,
        lost: threading.Event | None = None,
        deadline: float | None = None,
        stopping: Callable[[], bool] | None = None,
    ) -> None:
        self.store = store
        self.claim = claim
        self._recorded = recorded
        self._used: set[str] = set()
        self._approvals = 0
        self._lost = lost or threading.Event()
        self.lost_reason: LeaseLost | None = None
        self._deadline = deadline
        self._stopping = stopping
        self.ran_steps: list[str] = []
        self.replayed_steps: list[str] = []

    @property
    def job_id(self) -> str:
        return self.claim.job_id

    @property
    def attempt(self) -> int:
        return self.claim.job.attempts

    @property
    def owner(self) -> str:
        return self.claim.owner

    def is_recorded(self, name: str) -> bool:
        return name in self._recorded

    def lease_lost(self, reason: LeaseLost) -> None:
        """Called by the heartbeat when a renewal is refused: the next step stops the handler."""
        self.lost_reason = reason
        self._lost.set()

    def _use(self, name: str) -> None:
        if name in self._used:
            raise StepError(
                f"job {self.job_id!r}: step name {name!r} used twice in one run; "
                "step names must be unique within a job"
            )
        self._used.add(name)

    def _check_lease(self) -> None:
        if self._lost.is_set():
            raise self.lost_reason or LeaseLost(self.job_id, self.owner, self.claim.fence)

    def step(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` once for this job and record its JSON output.

        On a re-run the recorded output is returned without calling ``fn``. A first run
        returns the output as it will be replayed (through JSON), so both paths see the
        same value. If the process dies after ``fn`` ran but before the record commits,
        ``fn`` runs again: make such steps idempotent.
        """
        _storable(lambda: check_name(name, "step name"))  # before the function runs
        self._use(name)
        if name in self._recorded:
            self.replayed_steps.append(name)
            replayed: T = self._recorded[name]
            return replayed
        self._check_lease()
        if self._deadline is not None and time.monotonic() >= self._deadline:
            raise HandBack(f"delivery time budget used up before step {name!r}")
        if self._stopping is not None and self._stopping():
            raise HandBack(f"worker shutting down; handed back before step {name!r}")
        output = fn(*args, **kwargs)
        self._check_lease()
        _storable(lambda: self.store.record_step(self.claim, name, output))
        self._recorded[name] = output
        self.ran_steps.append(name)
        result: T = json.loads(json.dumps(output))
        return result

    def wait_for_approval(self, reason: str, *, key: str | None = None) -> dict[str, Any]:
        """Park the job in WAITING_APPROVAL until :func:`jobs.approve`; returns who approved.

        The approval is recorded as a step (``key``, by default ``approval-1``, ``approval-2``
        … in call order), so the re-run after approval continues past this call.
        """
        self._approvals += 1
        name = key or f"approval-{self._approvals}"
        _storable(lambda: check_name(name, "approval key"))
        _storable(lambda: check_text(reason, "approval reason"))
        self._use(name)
        if name in self._recorded:
            self.replayed_steps.append(name)
            approval: dict[str, Any] = self._recorded[name]
            return approval
        self._check_lease()
        raise WaitingForApproval(reason, name)
