"""Fan-out and fan-in (issue 17): a durable parent that maps N one-step children against a
Celery ``chord`` of N no-op tasks with a Redis result backend, on the same broker, with
the same worker settings and concurrency.

- durable: ``jobs.submit`` of a ``bench_fanout`` parent, which spawns its N children with
  one bulk insert and parks WAITING; the last child's finishing transaction queues it; it
  records the results and completes. Timed from the submit to the parent's ``finished_at``.
- plain: ``chord([member] * N)(callback)`` from a client with the Redis result backend
  (its own database number), run by a plain worker started with that backend. Timed from
  the chord's apply to the callback's run.

Also, on the durable side: PostgreSQL write transactions per child (distinct transaction
IDs on the family's job, history and step rows, divided by N) and what touched the parent
while it was parked (claims, moves and dropped deliveries between its park and its wake:
each one would be a poll; the children's countdowns of its counter are not counted).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from sqlalchemy import text

import jobs
from bench import kinds, plain_app
from bench.procs import Child
from bench.scenarios import BackendRun, _wait
from jobs._core.states import State


def writes_per_child(run: BackendRun, parent_id: str, children: int) -> float:
    """Distinct transaction IDs on the rows of the parent and its children (jobs, history,
    steps), per child: every transaction that wrote one of them and is still visible."""
    with run.store.engine.connect() as conn:
        writers = conn.execute(
            text(
                "SELECT count(DISTINCT x) FROM ("
                "SELECT xmin::text AS x FROM jobs WHERE id = :parent OR parent_id = :parent "
                "UNION ALL SELECT xmin::text FROM job_transitions WHERE job_id LIKE :family "
                "UNION ALL SELECT xmin::text FROM job_steps WHERE job_id LIKE :family"
                ") AS writers"
            ),
            {"parent": parent_id, "family": f"{parent_id}%"},
        ).scalar_one()
    return int(writers) / children


def touches_while_parked(run: BackendRun, parent_id: str, worker: Child) -> dict[str, int]:
    """What reached the parent between its park (→ WAITING) and its wake (WAITING →):
    moves other than the wake, claims, and deliveries the worker dropped (its log)."""
    history = jobs.history(parent_id)
    park = next(n for n, move in enumerate(history) if move.to_state is State.WAITING)
    wake = next(n for n, move in enumerate(history) if move.from_state is State.WAITING)
    log = worker.log.read_text(errors="replace")
    return {
        "moves": wake - park - 1,
        "claims": sum(1 for move in history[park:wake] if move.to_state is State.RUNNING),
        "dropped": log.count(f"job {parent_id}: delivery dropped"),
        "claims in all": sum(1 for move in history if move.to_state is State.RUNNING),
    }


def phases(run: BackendRun, parent_id: str, started: float) -> dict[str, float]:
    """Where the durable fan-out's time went, in seconds, from the parent's history and its
    children's rows (database clock): submit → the parent's claim, its run up to the park
    (the spawn: one bulk insert and N doorbells), the park → the last child's finish (the
    children's runs), that finish → the parent's second claim (its wake and delivery), and
    that claim → the parent's completion."""
    history = jobs.history(parent_id)
    claims = [run._db_time(move.at) for move in history if move.to_state is State.RUNNING]
    park = next(run._db_time(m.at) for m in history if m.to_state is State.WAITING)
    done = next(run._db_time(m.at) for m in history if m.to_state is State.COMPLETED)
    with run.store.engine.connect() as conn:
        first_claim, last_finish = conn.execute(
            text(
                "SELECT min(t.at), max(j.finished_at) FROM jobs AS j JOIN job_transitions AS t "
                "ON t.job_id = j.id AND t.to_state = 'RUNNING' WHERE j.parent_id = :parent"
            ),
            {"parent": parent_id},
        ).one()
    return {
        "to claim": claims[0] - started,
        "spawn": park - claims[0],
        "first child": run._db_time(first_claim) - claims[0],
        "children": run._db_time(last_finish) - park,
        "wake": claims[-1] - run._db_time(last_finish),
        "finish": done - claims[-1],
    }


class FanOut:
    """The fan-out measurements of one backend run (PostgreSQL and RabbitMQ only)."""

    def __init__(self, run: BackendRun, redis_url: str) -> None:
        self.run = run
        self.redis_url = redis_url

    def durable(self, n: int) -> dict[str, float]:
        run = self.run
        worker = run.durable_worker
        assert worker is not None
        parent_id = f"fan{uuid.uuid4().hex[:12]}"
        started = time.time()
        jobs.submit(kinds.FANOUT, {"children": n}, job_id=parent_id)

        def finished() -> bool:
            state = run.store.reads.get(parent_id).state
            if state.value in ("FAILED", "CANCELLED"):
                raise RuntimeError(f"fan-out parent {parent_id} ended {state.value}")
            return state is State.COMPLETED

        _wait(finished, 60 + n * 0.2, f"fan-out parent {parent_id} to complete", interval=0.02)
        parent = run.store.reads.get(parent_id)
        seconds = run._db_time(parent.finished_at) - started
        touched = touches_while_parked(run, parent_id, worker)
        split = phases(run, parent_id, started)
        run.say("    durable fan-out: " + ", ".join(f"{k} {v:.3f} s" for k, v in split.items()))
        return {
            "seconds": seconds,
            "writes": writes_per_child(run, parent_id, n),
            "polls": touched["moves"] + touched["claims"] + touched["dropped"],
            "claims": touched["claims in all"],
        }

    def plain(self, n: int) -> float:
        """Seconds from a chord's apply to its callback, on a plain worker that has the
        Redis result backend (started for it, stopped after)."""
        from celery import Celery, chord  # noqa: PLC0415

        run = self.run
        if run.plain_worker is not None:
            run.procs.stop_many([run.plain_worker])
        saved = run.plain_env
        run.plain_env = {**saved, plain_app.RESULT_BACKEND_ENV: self.redis_url}
        client = Celery("bench_chord_client", set_as_current=False)
        try:
            worker = run._start_worker("p")
            run.procs.wait_ready(worker)
            config = plain_app.from_json(json.loads(saved[plain_app.CONFIG_ENV]))
            client.conf.update(config, result_backend=self.redis_url, result_expires=600)
            tag = f"chord{uuid.uuid4().hex[:10]}"
            queue = run.plain_queue
            header = [client.signature(plain_app.CHORD_MEMBER, queue=queue) for _ in range(n)]
            callback = client.signature(plain_app.CHORD_DONE, args=(tag,), queue=queue)
            started = time.time()
            chord(header, app=client)(callback)

            def ran() -> bool:
                run.reader.poll()
                return bool(run.reader.marks(tag, "done"))

            _wait(ran, 60 + n * 0.2, f"the chord of {n} to call back", interval=0.02)
            seconds = run.reader.marks(tag, "done")[0].at - started
            run.procs.stop_many([worker])
        finally:
            client.close()
            run.plain_env = saved
        run.plain_worker = run._start_worker("p")
        run.procs.wait_ready(run.plain_worker)
        return seconds

    def measure(self, n: int, repeat: int) -> dict[str, Any]:
        """Both sides back to back (their order alternates by repeat)."""
        if repeat % 2:
            plain = self.plain(n)
            durable = self.durable(n)
        else:
            durable = self.durable(n)
            plain = self.plain(n)
        return {**durable, "plain": plain}


__all__ = ["FanOut", "touches_while_parked", "writes_per_child"]
