"""The metrics endpoint of a real sweeper (JOBS_METRICS_PORT) and of ``jobctl metrics``,
scraped over HTTP while real workers run jobs, and after one was SIGKILLed mid-step."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobs._core.states import State
from tests.acceptance.conftest import BOTH, Stack, wait_until
from tests.acceptance.test_crash import victim_in_second_step

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scrape(port: int) -> Samples:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_metrics_while_jobs_run_and_after_a_crash(stack: Stack) -> None:
    sweeper_port, cli_port = free_port(), free_port()
    stack.configure(JOBS_METRICS_PORT=sweeper_port)
    exporter = stack.start("metrics", ["metrics", "--port", str(cli_port), "--addr", "127.0.0.1"])
    workers = [stack.worker("A", wait=False), stack.worker("B", wait=False)]
    stack.sweeper()
    for worker in workers:
        worker.wait_ready()
    job_id = stack.submit("check_order", {"order_id": 42, "check_seconds": 8.0})
    victim = victim_in_second_step(stack, job_id, workers)
    survivor = next(worker for worker in workers if worker is not victim)

    running = wait_until(
        lambda: scrape(sweeper_port).get(("jobs", (("kind", "check_order"), ("state", "RUNNING")))),
        30,
        "the sweeper's endpoint to show the RUNNING job",
    )
    assert running == 1
    wait_until(lambda: scrape(cli_port), 30, "jobctl metrics to answer")

    victim.kill()
    assert stack.wait_state(job_id, timeout=60).state is State.COMPLETED
    assert survivor.owns(stack.job(job_id).owner)

    def settled() -> Samples | None:
        samples = scrape(cli_port)
        done = value(samples, "jobs_finished_total", kind="check_order", outcome="completed")
        return samples if done == 1 else None

    samples = wait_until(settled, 30, "jobctl metrics to count the completion")
    for port_samples in (samples, scrape(sweeper_port)):
        assert value(port_samples, "jobs", kind="check_order", state="COMPLETED") == 1
        assert value(port_samples, "jobs", kind="check_order", state="RUNNING") == 0
    # One recovery, whoever made it: the sweeper (dead owner, expired lease) re-queued the
    # job, or the survivor's claim took it over when the broker redelivered the message.
    recoveries = [
        value(samples, "jobs_recoveries_total", cause=cause, kind="check_order")
        for cause in ("dead_owner", "expired_lease", "lost_message")
    ]
    assert sum(recoveries) + value(samples, "jobs_takeovers_total", kind="check_order") == 1
    # The survivor's run recorded check_payment (8 s after its claim) and finished.
    assert value(samples, "jobs_step_duration_seconds_count", kind="check_order") >= 1
    assert value(samples, "jobs_step_duration_seconds_sum", kind="check_order") >= 7.5
    assert (
        value(samples, "jobs_run_duration_seconds_count", kind="check_order", outcome="completed")
        == 1
    )
    exporter.terminate()
    assert exporter.popen.wait(20) == 0
