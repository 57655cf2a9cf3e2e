"""Prometheus metrics read from the job tables, so any process can export them.

``jobctl metrics --port P`` serves them on its own; a sweeper serves them when
``JOBS_METRICS_PORT`` is set. Workers never import this module (``prometheus-client`` is
the optional ``metrics`` extra). Every scrape reads the tables:

- gauges: jobs by state and kind, QUEUED jobs by kind and priority (from the same grouped
  read), pauses in force and the QUEUED jobs they hold, the jobs a limit holds back
  (``jobs_throttled{kind,reason}``) and the concurrency keys at their limit, the oldest
  due QUEUED job's age,
  RUNNING jobs whose lease ends within half a lease (or has ended), schedules' seconds
  since their last tick, and the progress (``done / total``, 0 to 1) of at most
  :data:`PROGRESS_SERIES` RUNNING jobs that report it;
- counters from ``job_counters`` (monotonic, written by sweepers and submitters):
  recoveries by cause (dead owner, expired lease, lost message) and admission refusals;
- counters and histograms that tail the history and the step records from the moment the
  exporter started (so a restart is an ordinary counter reset and retention never makes
  them go down): completions and failures, takeovers (a worker's claim of a RUNNING job
  whose owner died or whose lease expired, before any sweeper moved it), job run
  durations (the final attempt's claim to its end) and step durations (from the claim or
  the previous step of the same run).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from jobs._core.errors import SettingsError
from jobs._core.progress import fraction_of
from jobs._core.states import State
from jobs._store import JobStore
from jobs._store.depth_reads import without_priority

try:
    from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as err:  # pragma: no cover - exercised without the extra installed
    raise SettingsError(
        "metrics need prometheus-client: pip install 'durable-jobs[metrics]'"
    ) from err

RECOVERY_CAUSES = {
    "recovery_dead_owner": "dead_owner",
    "recovery_expired_lease": "expired_lease",
    "recovery_lost_message": "lost_message",
}
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400)
#: Rows read per scrape from the history and the steps; the rest waits for the next scrape.
TAIL_LIMIT = 20_000
#: RUNNING jobs whose progress ``jobs_progress`` exports, the longest-lived first. Every
#: other series here is labelled by kind, state, queue or schedule (bounded by the code);
#: a job ID label is not, so the per-job gauge is capped: at most this many series at any
#: scrape, gone once the job stops RUNNING (``jobctl show`` has every job's progress).
PROGRESS_SERIES = 20


class ScrapedSeries(NamedTuple):
    """A series each scrape reads from the tables: its family (a gauge, or a counter of
    ``job_counters``), help text and labels."""

    family: type[GaugeMetricFamily] | type[CounterMetricFamily]
    documentation: str
    labels: list[str]


#: The series each scrape reads from the tables, by name (docs/operations/monitoring.md
#: and the generated reference list them all).
SCRAPED_SERIES: dict[str, ScrapedSeries] = {
    "jobs": ScrapedSeries(
        GaugeMetricFamily, "Jobs in the table by state and kind.", ["state", "kind"]
    ),
    "jobs_oldest_due_queued_age_seconds": ScrapedSeries(
        GaugeMetricFamily,
        "How long the oldest due QUEUED job has waited (0 when none is due).",
        [],
    ),
    "jobs_queued_by_queue": ScrapedSeries(
        GaugeMetricFamily,
        "QUEUED jobs (due or not) by the queue their doorbells go to.",
        ["queue"],
    ),
    "jobs_queued_not_due": ScrapedSeries(
        GaugeMetricFamily,
        "QUEUED jobs not due yet: sleeping on a durable timer, delayed, or backing off.",
        ["kind"],
    ),
    "jobs_leases_near_expiry": ScrapedSeries(
        GaugeMetricFamily,
        "RUNNING jobs whose lease ends within half a lease (expired: already ended).",
        ["kind", "expired"],
    ),
    "jobs_schedule_last_tick_age_seconds": ScrapedSeries(
        GaugeMetricFamily,
        "Seconds since each schedule's last submitted tick (grows if no sweeper fires it).",
        ["schedule", "kind"],
    ),
    "jobs_progress": ScrapedSeries(
        GaugeMetricFamily,
        "A RUNNING job's ctx.progress as done/total, 0 to 1 (at most 20 jobs, the "
        "longest-lived first; jobs reporting no total are left out).",
        ["kind", "job_id"],
    ),
    "jobs_paused": ScrapedSeries(
        GaugeMetricFamily,
        "1 for each paused kind or queue (jobctl pause): no worker claims its jobs.",
        ["scope", "name"],
    ),
    "jobs_paused_seconds": ScrapedSeries(
        GaugeMetricFamily,
        "Seconds since each pause in force began.",
        ["scope", "name"],
    ),
    "jobs_held_by_pause": ScrapedSeries(
        GaugeMetricFamily,
        "QUEUED jobs (due or not) that a paused kind or queue holds, by kind.",
        ["kind"],
    ),
    "jobs_throttled": ScrapedSeries(
        GaugeMetricFamily,
        "QUEUED jobs no claim may take now, by kind and reason: concurrency_key (due, "
        "their key has max_running_per_key RUNNING), max_running (their kind has "
        "max_running RUNNING), rate (due, their kind's or key's rate limit allows "
        "no start yet), paused (held by a pause).",
        ["kind", "reason"],
    ),
    "jobs_concurrency_keys_at_limit": ScrapedSeries(
        GaugeMetricFamily,
        "Concurrency keys with max_running_per_key jobs RUNNING and due jobs waiting.",
        ["kind"],
    ),
    "jobs_queued_by_priority": ScrapedSeries(
        GaugeMetricFamily,
        "QUEUED jobs (due or not) by kind and priority (0 to 9, higher goes first).",
        ["kind", "priority"],
    ),
    "jobs_recoveries": ScrapedSeries(
        CounterMetricFamily,
        "Jobs a sweeper recovered, by cause (dead owner, expired lease, lost message).",
        ["cause", "kind"],
    ),
    "jobs_admission_refusals": ScrapedSeries(
        CounterMetricFamily,
        "Submits refused because the kind's max_queued was reached.",
        ["kind"],
    ),
}


def _scraped(name: str, value: float | None = None) -> GaugeMetricFamily | CounterMetricFamily:
    """The family :data:`SCRAPED_SERIES` declares as ``name``, empty (with ``value``: the
    one sample of a series without labels)."""
    series = SCRAPED_SERIES[name]
    return series.family(name, series.documentation, value=value, labels=series.labels or None)


class TableCollector(Collector):
    """Collects every series from the database at scrape time (thread-safe)."""

    def __init__(self, store: JobStore, lease_seconds: float, default_queue: str = "jobs") -> None:
        self.store = store
        self.lease_seconds = lease_seconds
        self.default_queue = default_queue  # the queue of jobs that name none (JOBS_QUEUE)
        self._lock = threading.Lock()
        self._tailed = CollectorRegistry(auto_describe=True)
        self.finished = Counter(
            "jobs_finished",
            "Jobs that reached COMPLETED or FAILED since this exporter started.",
            ["kind", "outcome"],
            registry=self._tailed,
        )
        self.job_seconds = Histogram(
            "jobs_run_duration_seconds",
            "Run time of a finished job's final attempt: its claim to COMPLETED or FAILED.",
            ["kind", "outcome"],
            buckets=DURATION_BUCKETS,
            registry=self._tailed,
        )
        self.step_seconds = Histogram(
            "jobs_step_duration_seconds",
            "Time from the claim (or the previous step of the same run) to a step's record.",
            ["kind"],
            buckets=DURATION_BUCKETS,
            registry=self._tailed,
        )
        self.takeovers = Counter(
            "jobs_takeovers",
            "RUNNING jobs a worker's claim took from an owner that was gone or whose lease "
            "had expired (the sweeper's recoveries are jobs_recoveries_total).",
            ["kind"],
            registry=self._tailed,
        )
        self._last_transition: int | None = None
        self._last_step_at: dt.datetime | None = None

    # -- scrape ----------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield from self._gauges()
            yield from self._counters()
            self._tail_transitions()
            self._tail_steps()
            yield from self._tailed.collect()

    def _gauges(self) -> Iterable[Metric]:
        store = self.store
        by_state = _scraped("jobs")
        by_priority = store.depth.counts_by_priority()  # one grouped read for both gauges
        counts = without_priority(by_priority)
        kinds = sorted({kind for kind, _ in counts})
        for kind in kinds:
            for state in State:
                by_state.add_metric([state.value, kind], counts.get((kind, state.value), 0))
        yield by_state
        yield self._queued_by_priority(by_priority)
        by_queue = _scraped("jobs_queued_by_queue")
        totals: dict[str, int] = {}
        for queue, count in store.depth.queued_by_queue().items():
            name = self.default_queue if queue is None else queue
            totals[name] = totals.get(name, 0) + count
        for name, count in sorted(totals.items()):
            by_queue.add_metric([name], count)
        yield by_queue
        yield from self._pauses()
        yield from self._throttled(counts)
        oldest = store.depth.oldest_queued()
        yield _scraped("jobs_oldest_due_queued_age_seconds", 0.0 if oldest is None else oldest[1])
        waiting = _scraped("jobs_queued_not_due")
        for kind, count in sorted(store.depth.not_due().items()):
            waiting.add_metric([kind], count)
        yield waiting
        near = _scraped("jobs_leases_near_expiry")
        rows = store.depth.leases_ending(self.lease_seconds / 2)
        for kind, expired, count in rows:
            near.add_metric([kind, "true" if expired else "false"], count)
        yield near
        since = _scraped("jobs_schedule_last_tick_age_seconds")
        instant = store.reads.now()
        for schedule in store.reads.schedules():
            anchor = schedule.last_tick or schedule.created_at or instant
            since.add_metric([schedule.name, schedule.kind], (instant - anchor).total_seconds())
        yield since
        yield self._progress()

    def _progress(self) -> Metric:
        """``done / total`` of the longest-lived RUNNING jobs that report progress with a
        total (:data:`PROGRESS_SERIES` at most)."""
        progress = _scraped("jobs_progress")
        for job_id, kind, value in self.store.depth.running_progress(PROGRESS_SERIES):
            fraction = fraction_of(value)
            if fraction is not None:
                progress.add_metric([kind, job_id], fraction)
        return progress

    def _pauses(self) -> Iterable[Metric]:
        """Each pause in force (1, with the seconds since it began beside it) and the QUEUED
        jobs they hold, by kind."""
        paused = _scraped("jobs_paused")
        paused_for = _scraped("jobs_paused_seconds")
        pauses = self.store.reads.pauses()
        instant = self.store.reads.now() if pauses else None
        for pause in pauses:
            paused.add_metric([pause.scope, pause.name], 1)
            if instant is not None:
                seconds = max(0.0, (instant - pause.paused_at).total_seconds())
                paused_for.add_metric([pause.scope, pause.name], seconds)
        yield paused
        yield paused_for
        held = _scraped("jobs_held_by_pause")
        for kind, count in sorted(self.store.depth.held_by_pauses().items()):
            held.add_metric([kind], count)
        yield held

    def _throttled(self, counts: dict[tuple[str, str], int]) -> Iterable[Metric]:
        """QUEUED jobs held back by a limit, by kind and reason, and the concurrency keys
        at their ``max_running_per_key``, by kind."""
        throttled = _scraped("jobs_throttled")
        full_keys = _scraped("jobs_concurrency_keys_at_limit")
        limits = self.store.reads.limits()
        for kind, (keys, held) in sorted(self.store.depth.held_by_keys().items()):
            throttled.add_metric([kind, "concurrency_key"], held)
            full_keys.add_metric([kind], keys)
        for kind, limit in sorted(limits.items()):
            running = counts.get((kind, State.RUNNING.value), 0)
            queued = counts.get((kind, State.QUEUED.value), 0)
            if limit.max_running is not None and running >= limit.max_running and queued:
                throttled.add_metric([kind, "max_running"], queued)
        for kind, count in sorted(self.store.depth.held_by_rates().items()):
            throttled.add_metric([kind, "rate"], count)
        for kind, count in sorted(self.store.depth.held_by_pauses().items()):
            throttled.add_metric([kind, "paused"], count)
        yield throttled
        yield full_keys

    @staticmethod
    def _queued_by_priority(by_priority: dict[tuple[str, str, int], int]) -> Metric:
        """QUEUED jobs by kind and priority, for each priority a kind's jobs have in the
        table (0 when none of them waits): at most ten series a kind."""
        queued = _scraped("jobs_queued_by_priority")
        for kind, priority in sorted({(kind, priority) for kind, _, priority in by_priority}):
            waiting = by_priority.get((kind, State.QUEUED.value, priority), 0)
            queued.add_metric([kind, str(priority)], waiting)
        return queued

    def _counters(self) -> Iterable[Metric]:
        recoveries = _scraped("jobs_recoveries")
        refusals = _scraped("jobs_admission_refusals")
        for (name, kind), value in sorted(self.store.depth.counters().items()):
            if name in RECOVERY_CAUSES:
                recoveries.add_metric([RECOVERY_CAUSES[name], kind], value)
            elif name == "admission_refused":
                refusals.add_metric([kind], value)
        yield recoveries
        yield refusals

    # -- tails -----------------------------------------------------------------------------

    def _tail_transitions(self) -> None:
        moves, self._last_transition = self.store.depth.moves_after(
            self._last_transition, TAIL_LIMIT
        )
        for move in moves:
            if move.to_state is State.RUNNING:
                if move.from_state is State.RUNNING:  # a claim took over a RUNNING job
                    self.takeovers.labels(move.kind).inc()
                continue
            outcome = "completed" if move.to_state is State.COMPLETED else "failed"
            self.finished.labels(move.kind, outcome).inc()
            if move.run_started_at is not None:
                self.job_seconds.labels(move.kind, outcome).observe(
                    _seconds(move.at, move.run_started_at)
                )

    def _tail_steps(self) -> None:
        timings, self._last_step_at = self.store.depth.steps_after(self._last_step_at, TAIL_LIMIT)
        for step in timings:
            self.step_seconds.labels(step.kind).observe(_seconds(step.recorded_at, step.began_at))


def _seconds(end: Any, start: Any) -> float:
    return max(0.0, float((end - start).total_seconds()))


def registry_for(
    store: JobStore, lease_seconds: float, default_queue: str = "jobs"
) -> CollectorRegistry:
    """A registry holding only the job metrics (no process metrics of the exporter);
    ``default_queue`` names the queue of jobs that name none (``JOBS_QUEUE``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TableCollector(store, lease_seconds, default_queue))
    return registry


def serve(
    store: JobStore,
    port: int,
    lease_seconds: float = 30.0,
    addr: str = "0.0.0.0",  # noqa: S104 - a metrics port is meant to be scraped
    default_queue: str = "jobs",
) -> Any:
    """Serve ``/metrics`` on ``port`` from a daemon thread; returns the server."""
    server, _thread = start_http_server(
        port, addr=addr, registry=registry_for(store, lease_seconds, default_queue)
    )
    return server
