"""The Jobs view in Flower, driven in a real browser (Debian's Chromium, headless, through
selenium and the system chromedriver) against a real Celery worker on PostgreSQL and
RabbitMQ: a job waiting for approval is found, opened and approved, then seen completed; a
job that failed at its third step is retried from the page and completes without its first
two steps running again; a hostile job's inputs and error render inert. A screenshot of a
job's page is saved under the test's tmp folder (its path is printed)."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from jobs import testing
from jobs._core.states import State
from jobs.application import default_app
from tests.acceptance.conftest import BOTH, KINDS, PG_RABBITMQ, Stack, free_port
from tests.conftest import (
    HOSTILE,
    IN_CI,
    PAGE_BIG_STEPS,
    PAGE_CHILDREN,
    PAGE_OUTPUT_CHARS,
    assert_children_paged,
    assert_outputs_escaped,
    page_probe_kinds,
    peak_rss_mib,
    whole_output,
)

IMPORTS = f"{KINDS},jobs.examples.ship_order"
AUTH = ("oncall", "s3cret-pw")
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def _browser() -> Any:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        message = "Chromium and chromedriver are not installed (.ci/run installs them)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver  # noqa: PLC0415
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1400,1800")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    # Flower's basic auth, on every request the browser makes (form posts too).
    token = base64.b64encode(f"{AUTH[0]}:{AUTH[1]}".encode()).decode()
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd(
        "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {token}"}}
    )
    return driver


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = _browser()
    try:
        yield driver
    finally:
        driver.quit()


def _until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = check()
        except Exception:  # a page still loading; Flower still starting
            found = None
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _click_and_load(driver: Any, element: Any) -> None:
    """Click a link or button that loads a page, and wait until the new page replaced
    the old one (else the old page's elements answer) and has loaded."""
    from selenium.common.exceptions import WebDriverException  # noqa: PLC0415
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    old = driver.find_element(By.TAG_NAME, "html")
    element.click()

    def replaced() -> bool:
        try:
            old.tag_name  # noqa: B018 - asks the browser about the old page's root
        except WebDriverException:  # stale, or "does not belong to the document"
            return driver.execute_script("return document.readyState") == "complete"
        return False

    _until(replaced, 20, "the next page")


def _text(driver: Any, css: str) -> str:
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    return str(driver.find_element(By.CSS_SELECTOR, css).text)


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_operator_approves_retries_and_reads_hostile_jobs_in_flower(
    stack: Stack, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By  # noqa: PLC0415
    from selenium.webdriver.support.ui import Select  # noqa: PLC0415

    stack.configure(JOBS_IMPORTS=IMPORTS)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    stack.start(
        "flower",
        ["flower", f"--port={port}", "--address=127.0.0.1", f"--basic-auth={AUTH[0]}:{AUTH[1]}"],
    )
    stack.worker("w1")
    waiting = stack.submit("check_order", {"order_id": 1, "check_seconds": 0.1, "approval": True})
    broken = stack.submit("ship_order", {"order_id": 7})
    hostile = stack.submit("ship_order", {"order_id": HOSTILE})
    stack.wait_state(waiting, (State.WAITING_APPROVAL,))
    stack.wait_state(broken, (State.FAILED,))
    stack.wait_state(hostile, (State.FAILED,))
    _until(lambda: requests.get(f"{base}/healthcheck", timeout=2).ok, 30, "Flower to start")

    # Flower's authentication covers the pages, and a write needs the XSRF token.
    assert requests.get(f"{base}/jobs", timeout=5).status_code == 401
    assert requests.get(f"{base}/jobs", auth=AUTH, timeout=10).status_code == 200
    forged = requests.post(
        f"{base}/jobs/job/{waiting}", data={"action": "approve"}, auth=AUTH, timeout=10
    )
    assert forged.status_code == 403
    assert stack.job(waiting).state is State.WAITING_APPROVAL

    # 1. Find the job waiting for approval, open it, approve it, see it completed.
    browser.get(f"{base}/jobs")
    assert "check_order" in _text(browser, "#counts")
    assert stack.queue in _text(browser, "#queues") or "no queued jobs" in _text(browser, "#queues")
    Select(browser.find_element(By.ID, "f-state")).select_by_value("WAITING_APPROVAL")
    _click_and_load(browser, browser.find_element(By.ID, "filter-go"))
    links = browser.find_elements(By.CSS_SELECTOR, "#job-list a.job-link")
    assert [link.text for link in links] == [waiting]
    _click_and_load(browser, links[0])
    assert _text(browser, "#job-state") == "WAITING_APPROVAL"
    assert "waiting for approval" in _text(browser, "#explain")
    _click_and_load(browser, browser.find_element(By.ID, "do-approve"))
    assert "Approved" in _text(browser, "#done")

    def completed() -> bool:
        browser.refresh()
        return _text(browser, "#job-state") == "COMPLETED"

    _until(completed, 60, f"{waiting} to complete")
    assert stack.job(waiting).result["approved_by"] == "oncall (Flower)"
    assert "oncall (Flower)" in _text(browser, "#history")

    # 2. Open the failed job by its ID, keep a screenshot, fix the bug, retry from the page.
    browser.get(f"{base}/jobs")
    browser.find_element(By.ID, "search-id").send_keys(broken)
    _click_and_load(browser, browser.find_element(By.ID, "search-go"))
    assert _text(browser, "#job-id") == broken
    assert _text(browser, "#job-state") == "FAILED"
    assert [cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "#steps .step-name")] == [
        "charge",
        "ship",
    ]
    assert "ConnectionTimeout" in _text(browser, "#last-error")
    assert "parcel-7" in _text(browser, "#steps")
    screenshot = tmp_path / "flower-job-page.png"
    assert browser.save_screenshot(str(screenshot))
    print(f"screenshot of the job page: {screenshot}")
    (stack.data_dir / "mailer.fixed").write_text("deployed\n")
    browser.find_element(By.CSS_SELECTOR, "#actions input[name=note]").send_keys("mailer fixed")
    _click_and_load(browser, browser.find_element(By.ID, "do-retry"))
    assert "Retried" in _text(browser, "#done")
    _until(completed, 60, f"{broken} to complete")
    assert stack.effect_count(broken, "charge") == 1  # not charged again
    assert stack.effect_count(broken, "ship") == 1
    assert stack.effect_count(broken, "email") == 2
    [retry] = [move for move in stack.history(broken) if move.from_state is State.FAILED]
    assert "oncall (Flower)" in (retry.reason or "")
    assert "mailer fixed" in (retry.reason or "")

    # 3. A hostile job: its HTML shows as text, nothing in it runs, escapes show escaped.
    for page in (f"{base}/jobs?state=FAILED", f"{base}/jobs/job/{hostile}"):
        browser.get(page)
        assert browser.find_elements(By.TAG_NAME, "script") == []
        assert browser.find_elements(By.TAG_NAME, "img") == []
        assert browser.find_elements(By.TAG_NAME, "b") == []
        assert browser.execute_script("return window.__pwned === undefined") is True
        assert "\x1b" not in browser.page_source
    assert "<script>window.__pwned = 1</script>" in _text(browser, "#inputs")
    assert '<img src=x onerror="window.__pwned = 2">' in _text(browser, "#last-error")
    assert "\\x1b[31mred" in _text(browser, "#last-error")
    assert browser.title.startswith("Job ")


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_job_pages_are_paged_and_clipped_with_flowers_memory_flat(stack: Stack) -> None:
    """A parent with 20,000 children and a job with sixty 1 MiB step outputs: each page is
    a page of rows (links to the next), outputs clipped with a link to the whole value
    (served as plain text), stored HTML escaped, and Flower's peak memory flat."""
    # In-process runs that write 20,000 children or 60 MiB in one go: a lease to match.
    stack.configure(JOBS_IMPORTS=IMPORTS, JOBS_LEASE_SECONDS=600)
    page_probe_kinds()
    with default_app().runtime.doorbell_off():
        parent = testing.perform_job("page_many_children", {"count": PAGE_CHILDREN})
        big = testing.perform_job("page_big_outputs", {"steps": PAGE_BIG_STEPS})
        for _ in range(40):  # jobs the list shows, with inputs of almost 1 MiB each
            stack.submit("page_padded", {"pad": "p" * PAGE_OUTPUT_CHARS})
    assert parent.state is State.WAITING, parent.last_error
    assert big.state is State.COMPLETED, big.last_error
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    flower = stack.start(
        "flower",
        ["flower", f"--port={port}", "--address=127.0.0.1", f"--basic-auth={AUTH[0]}:{AUTH[1]}"],
    )
    _until(lambda: requests.get(f"{base}/healthcheck", timeout=2).ok, 60, "Flower to start")
    session = requests.Session()
    session.auth = AUTH
    small = stack.submit("check_order", {"order_id": 3})
    assert session.get(f"{base}/jobs/job/{small}", timeout=30).status_code == 200  # warm
    before = peak_rss_mib(flower.pid)

    children = session.get(f"{base}/jobs/job/{parent.id}", timeout=120)
    assert children.status_code == 200
    assert len(children.content) < 200_000, len(children.content)
    following = session.get(f"{base}/jobs/job/{parent.id}", params={"children": 100}, timeout=60)
    assert_children_paged(parent.id, children.text, following.text)

    outputs = session.get(f"{base}/jobs/job/{big.id}", timeout=120)
    assert outputs.status_code == 200
    assert len(outputs.content) < 400_000, len(outputs.content)
    assert f"of {PAGE_OUTPUT_CHARS + 2} characters" in outputs.text
    assert_outputs_escaped(outputs.text)
    assert "<script>" not in outputs.text
    assert "<img" not in outputs.text
    listed_jobs = session.get(f"{base}/jobs", params={"limit": 1000}, timeout=120)
    assert listed_jobs.status_code == 200
    assert listed_jobs.text.count("page_padded") >= 40
    assert len(listed_jobs.content) < 400_000, len(listed_jobs.content)
    grown = peak_rss_mib(flower.pid) - before
    print(
        f"children page {len(children.content)} bytes, outputs page {len(outputs.content)} "
        f"bytes, list page {len(listed_jobs.content)} bytes, "
        f"Flower's peak {before:.0f} MiB -> {before + grown:.0f} MiB"
    )
    assert grown < 40, f"Flower grew by {grown:.0f} MiB"

    whole = session.get(f"{base}/jobs/value", params={"job": big.id, "step": "big-07"}, timeout=60)
    assert whole.status_code == 200
    assert whole.headers["Content-Type"].startswith("text/plain")
    assert whole.headers["X-Content-Type-Options"] == "nosniff"
    assert whole.text == whole_output(7)
    hostile = session.get(f"{base}/jobs/value", params={"job": big.id, "step": "hostile"})
    assert hostile.headers["Content-Type"].startswith("text/plain")
    assert "<script>" in hostile.text  # as text, never as HTML
    missing = session.get(f"{base}/jobs/value", params={"job": big.id, "step": "nope"})
    assert missing.status_code == 400
    unknown = session.get(f"{base}/jobs/value", params={"job": "no-such-job", "field": "inputs"})
    assert unknown.status_code == 404
    assert (
        requests.get(f"{base}/jobs/value", params={"job": big.id, "step": "big-07"}).status_code
        == 401
    )
