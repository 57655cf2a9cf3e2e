"""A run's replay log: the steps its job recorded, where each stands in the handler's
sequence of calls, and the calls this run has made.

A handler is re-run from the top after a crash, a timer, an approval or a hand-back; each
call it makes (a step, a timer, a wait, a spawn, a patch marker) takes the next place in
its sequence. On a replay the call at each place must ask for the step recorded there:
one that asks for another ends the run as :class:`jobs.NonDeterministic` before anything
of that call runs or is recorded (:class:`jobs._core.interrupts.Diverged`). A job with a
step recorded before positions existed replays by name only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobs._core import tracing
from jobs._core.errors import NonDeterministic, StepError
from jobs._core.interrupts import Diverged

#: The recorded name of ``ctx.patched("<change id>")``'s marker: ``patch:<change id>``.
PATCH_PREFIX = "patch:"


class ReplayLog:
    """What job ``job_id`` recorded (``outputs``, by step name, with ``positions``) and the
    calls of this run: which names it used, the place of each, which steps ran and which
    replayed (:attr:`ran`, :attr:`replayed`), and the divergence that ended it, if any."""

    def __init__(
        self,
        job_id: str,
        outputs: dict[str, Any],
        positions: Mapping[str, int | None] | None = None,
    ) -> None:
        self.job_id = job_id
        self.outputs = outputs
        known = dict(positions or {})
        # Checked on replay only when every recorded step has a place.
        self.ordered = all(known.get(name) is not None for name in outputs)
        self._recorded_at: dict[str, int] = {
            name: place for name, place in known.items() if place is not None and name in outputs
        }
        self._name_at: dict[int, str] = {place: name for name, place in self._recorded_at.items()}
        # The next call's place; each call takes one, recorded or not (a step whose
        # function raised leaves its place empty, and fills it once it runs to an end on a
        # later run), so the same code makes the same calls at the same places.
        self.next_position = 0
        self._called_at: dict[str, int] = {}
        self._used: set[str] = set()
        self._patches: dict[str, bool] = {}
        self._counters: dict[str, int] = {}
        self.ran: list[str] = []
        self.replayed: list[str] = []
        self.diverged: NonDeterministic | None = None

    def is_recorded(self, name: str) -> bool:
        """Whether step ``name`` has a recorded output."""
        return name in self.outputs

    def take(self, name: str) -> int:
        """Give the call asking for step ``name`` the next place and return it; on a replay
        the step recorded there must be ``name`` (else :class:`Diverged`). A name used
        twice in one run is a :class:`jobs.StepError`."""
        if name in self._used:
            raise StepError(
                f"job {self.job_id!r}: step name {name!r} used twice in one run; "
                "step names must be unique within a job"
            )
        place = self.next_position
        if self.ordered:
            there = self._name_at.get(place)
            elsewhere = self._recorded_at.get(name)
            if there is not None and there != name:
                self.diverge(place, there, name)
            if there is None and elsewhere is not None:
                self.diverge(
                    place, None, name, f"step {name!r} is recorded at position {elsewhere}"
                )
        self.next_position = place + 1
        self._called_at[name] = place
        self._used.add(name)
        return place

    def place_of(self, name: str) -> int:
        """The place of the call that took step ``name`` in this run."""
        return self._called_at[name]

    def diverge(
        self, position: int, recorded: str | None, asked: str | None, detail: str = ""
    ) -> None:
        """Stop the run: the code does not make the calls this job recorded."""
        error = NonDeterministic(self.job_id, position, recorded, asked, detail)
        self.diverged = error
        raise Diverged(error)

    def check_all_asked(self) -> None:
        """At the handler's return: a recorded step it never asked for means the code no
        longer makes the calls this job recorded (:class:`Diverged`)."""
        if self.diverged is not None:
            raise Diverged(self.diverged)
        if not self.ordered:
            return
        unasked = sorted(place for place in self._name_at if place >= self.next_position)
        if unasked:
            self.diverge(unasked[0], self._name_at[unasked[0]], None)

    def replay(self, name: str) -> Any:
        """The recorded output of step ``name``, counted as replayed by this run."""
        self.replayed.append(name)
        if tracing.ENABLED:
            tracing.replayed_step(name)
        return self.outputs[name]

    def ran_now(self, name: str, output: Any) -> None:
        """Step ``name`` ran in this run and ``output`` is what will be recorded."""
        self.outputs[name] = output
        self.ran.append(name)

    def count(self, prefix: str) -> int:
        """How many calls of ``prefix`` (``approval``, ``wait``) this run has made, this
        one included: the number in a default step name."""
        self._counters[prefix] = self._counters.get(prefix, 0) + 1
        return self._counters[prefix]

    def patch_is_new(self, change_id: str) -> tuple[bool, bool]:
        """Whether this run takes change ``change_id``'s new path at this point, and
        whether it was asked already in this run (then the first answer stands and nothing
        more is to be done). New on a run that reaches this point first; old on the replay
        of a job that passed it before the change; :class:`Diverged` when the marker is
        recorded elsewhere."""
        if change_id in self._patches:
            return self._patches[change_id], True
        marker = PATCH_PREFIX + change_id
        place = self.next_position
        if not self.ordered:
            # Recorded before positions existed: this job cannot tell, so keeps the old code.
            new = marker in self.outputs
        elif self._name_at.get(place) == marker:
            new = True
        elif marker in self._recorded_at:
            self.diverge(
                place,
                self._name_at.get(place),
                marker,
                f"marker {marker!r} is recorded at position {self._recorded_at[marker]}",
            )
        else:
            new = not any(recorded >= place for recorded in self._name_at)
        self._patches[change_id] = new
        return new, False

    def pass_deprecated_patch(self, change_id: str) -> None:
        """Walk past the marker of patch ``change_id`` if this job recorded it here; record
        nothing otherwise (the patch's old path is gone)."""
        if change_id in self._patches:
            return
        self._patches[change_id] = True
        marker = PATCH_PREFIX + change_id
        if self.ordered and self._name_at.get(self.next_position) == marker:
            self.take(marker)
            self.replayed.append(marker)
        elif not self.ordered and marker in self.outputs:
            self._used.add(marker)
            self.replayed.append(marker)


__all__ = ["PATCH_PREFIX", "ReplayLog"]
