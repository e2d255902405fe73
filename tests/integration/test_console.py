"""The console on the real services: its JSON API (every read answers what the CLI's ``--json``
answers, every write acts as the CLI's command does, a write without the token is refused) and
its pages in a real browser (Debian's chromium, driven by selenium)."""

from __future__ import annotations

import contextlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.service import Service as ChromeService
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

from bridge.message import H_AFTER, H_ID, H_TARGET_TOPIC, Headers
from testbed.harness import Bridge, Collector, Setup, produce_all
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

TOKEN = "s3cret-console-token"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"  # scripts/tools chromium


def call(
    bridge: Bridge,
    path: str,
    body: dict[str, Any] | None = None,
    *,
    token: str | None = TOKEN,
    content_type: str = "application/json",
) -> tuple[int, dict[str, Any]]:
    """GET ``path``, or POST ``body`` to it: (status, the JSON answer)."""
    request = urllib.request.Request(f"http://127.0.0.1:{bridge.http_port()}{path}")
    if body is not None:
        request.data = json.dumps(body).encode()
        request.add_header("Content-Type", content_type)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def console_bridge(setup: Setup, bridges: list[Bridge]) -> Bridge:
    """A bridge whose console takes ``TOKEN``, ready."""
    token_file = setup.tmp / "console-token"
    token_file.write_text(TOKEN + "\n")
    bridge = setup.bridge(http__console__token_file=str(token_file)).start()
    bridges.append(bridge)
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    return bridge


def schedule_some(setup: Setup) -> list[tuple[int, int]]:
    """Two records keyed ``c-`` due in 30 minutes and 2 hours, one with delay-id ``order-9`` due
    in 3 hours, and one without a target (dead-lettered at once)."""
    t0 = setup.targets[0].encode()

    def later(key: bytes, after: bytes, *more: tuple[str, bytes]) -> tuple[bytes, bytes, Headers]:
        return key, b"value-" + key, [(H_TARGET_TOPIC, t0), (H_AFTER, after), *more]

    return produce_all(
        setup.services.bootstrap,
        setup.delay,
        [
            later(b"c-1", b"30m"),
            later(b"c-2", b"2h"),
            later(b"o-9", b"3h", (H_ID, b"order-9")),
            (b"bad", b"no target", [(H_AFTER, b"1s")]),
        ],
    )


def test_the_api_reads_what_the_cli_reads_and_acts_only_with_the_token(
    setup: Setup, bridges: list[Bridge]
) -> None:
    bridge = console_bridge(setup, bridges)
    schedule_some(setup)

    def waiting() -> int:
        status, body = call(bridge, "/api/status")
        assert status == 200, body
        totals = body["result"]["totals"]
        return int(totals["waiting"] + totals["references"])  # 2 h and 3 h out: references

    wait_for(lambda: waiting() == 3, 60, "three records waiting")
    status, due = call(bridge, "/api/due?span=day")
    assert status == 200 and len(due["result"]["counts"]) == 24
    assert due["result"]["counts"][0] == 1 and sum(due["result"]["counts"]) == 3
    assert call(bridge, "/api/due?span=hour")[1]["result"]["later"] == 2
    status, listed = call(bridge, "/api/records?limit=2")
    assert status == 200 and [r["key"] for r in listed["result"]] == ["c-1", "c-2"]
    assert listed["messages"] == ["2 of 3 shown; --limit to see more"]
    status, page = call(bridge, "/api/records?limit=2&skip=2")  # the next page
    assert [r["key"] for r in page["result"]] == ["o-9"] and page["messages"] == ["3-3 of 3 shown"]
    status, traced = call(bridge, "/api/trace?id=order-9")
    assert status == 200 and traced["result"]["fate"] == "waiting"
    assert traced["result"]["record"]["value"] == "value-o-9"
    assert [H_ID, "order-9"] in traced["result"]["record"]["headers"]
    status, hidden = call(bridge, "/api/trace?id=order-9", token=None)  # no token: no payload
    assert status == 200 and hidden["result"]["record"]["value"] is None
    assert call(bridge, "/api/trace?id=never-was")[0] == 404
    assert call(bridge, "/api/records?limit=0") == (
        400,
        {"error": "--limit 0: 1 to 1,000 (a page; --skip for the next)"},
    )
    assert call(bridge, "/api/records?json=1")[1] == {"error": "json: not an option of this call"}

    # Writes: the token, a JSON body, the CLI's own checks.
    cancel = {"id": "order-9"}
    assert call(bridge, "/api/cancel", cancel, token=None)[0] == 403
    assert call(bridge, "/api/cancel", cancel, token="wrong")[0] == 403
    assert call(bridge, "/api/cancel", cancel, content_type="text/plain")[0] == 415
    assert waiting() == 3  # nothing refused reached the delay topic
    status, body = call(bridge, "/api/cancel", {"key_prefix": "c-"})
    assert status == 400 and "needs --dry-run" in body["error"], body
    assert call(bridge, "/api/cancel", {"config": "/etc/passwd", "id": "x"})[0] == 400
    status, body = call(bridge, "/api/cancel", cancel)
    assert status == 200 and body["output"][0].startswith(f"cancel of order-9 {setup.delay}:"), body
    assert [p["topic"] for p in body["result"]["produced"]] == [setup.delay]
    wait_for(lambda: waiting() == 2, 30, "order-9 cancelled")
    wait_for(
        lambda: call(bridge, "/api/trace?id=order-9")[1]["result"]["fate"] == "cancelled",
        30,
        "its fate journaled",
    )
    status, body = call(bridge, "/api/fire", {"key_prefix": "c-", "dry_run": True})
    assert status == 200 and body["output"][0].startswith("would fire 2 waiting records"), body
    status, body = call(bridge, "/api/fire", {"key_prefix": "c-", "yes": True})
    assert status == 200 and body["output"][0].startswith("fired 2 waiting records"), body
    assert sum(body["result"]["matched"].values()) == body["result"]["applied"] == 2, body
    got = Collector(setup.services.bootstrap, [setup.targets[0]], f"c-{setup.unique}")
    try:
        got.until(lambda rs: len(rs) >= 2, 60, "the two fired")
    finally:
        got.close()
    assert sorted(r.key or b"" for r in got.records) == [b"c-1", b"c-2"]
    status, body = call(bridge, "/api/fire", {"key_prefix": "c-", "yes": True})
    assert status == 422 and body["error"] == "no waiting record matches", body

    # The DLQ: listed with its reason, replayed (counted first).
    status, letters = call(bridge, "/api/dlq")
    assert status == 200 and [d["key"] for d in letters["result"]] == ["bad"]
    reason = letters["result"][0]["reason"]
    status, body = call(bridge, "/api/dlq/replay", {"reason": [reason], "dry_run": True})
    assert status == 200 and "would replay 1" in " ".join(body["output"]), body
    assert body["result"]["replayed"] == {reason: 1} and body["result"]["dry_run"], body


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    """Debian's chromium, headless, driven by its chromedriver (scripts/tools chromium)."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-sync",
        "--disable-component-update",
        "--disable-quic",
        "--window-size=1280,900",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=ChromeService(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _shot(driver: WebDriver, name: str) -> None:
    """With DELAY_BRIDGE_SCREENSHOTS set (a directory: docs/img/console), the page as PNG."""
    where = os.environ.get("DELAY_BRIDGE_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1280, int(height) + 160)  # the whole page, not the window
        driver.save_screenshot(str(Path(where) / f"{name}.png"))
        driver.set_window_size(1280, 900)


def _act(driver: WebDriver, form: WebElement, button: str) -> str:
    """Click ``button`` of an action ``form``, accept its confirmation if it asks one, and
    return what the form's output says once the API answered."""
    form.find_element(By.XPATH, f".//button[normalize-space()='{button}']").click()
    with contextlib.suppress(NoAlertPresentException):
        driver.switch_to.alert.accept()
    output = form.find_element(By.TAG_NAME, "output")
    wait_for(lambda: output.text not in ("", "…"), 60, f"the answer to {button}")
    return str(output.text)


def test_the_console_in_a_browser_shows_counts_and_fates_and_acts_with_the_token(
    setup: Setup, bridges: list[Bridge], browser: WebDriver
) -> None:
    bridge = console_bridge(setup, bridges)
    schedule_some(setup)
    ui = f"http://127.0.0.1:{bridge.http_port()}/ui"

    def held() -> int:
        totals = call(bridge, "/api/status")[1]["result"]["totals"]
        return int(totals["waiting"] + totals["references"])

    wait_for(lambda: held() == 3, 60, "three records waiting")
    assert "order-9" in bridge.get("/ui/records")[1]  # the reads need no script

    browser.get(ui)
    figures = {
        f.get_attribute("data-figure"): f.find_element(By.TAG_NAME, "b").text
        for f in browser.find_elements(By.CSS_SELECTOR, ".figure")
    }
    assert (figures["waiting"], figures["references"], figures["in_flight"]) == ("1", "2", "0")
    bars = {
        chart.get_attribute("data-span"): [
            int(str(bar.get_attribute("data-count")))
            for bar in chart.find_elements(By.CSS_SELECTOR, "rect.bar")
        ]
        for chart in browser.find_elements(By.CSS_SELECTOR, "figure[data-span]")
    }
    assert [len(bars[s]) for s in ("hour", "day", "month")] == [12, 24, 30]
    assert (sum(bars["hour"]), bars["day"][0], sum(bars["day"]), sum(bars["month"])) == (1, 1, 3, 3)
    drawn = browser.find_elements(By.CSS_SELECTOR, "figure[data-span=day] rect.bar")
    assert drawn[0].size["height"] > 0 and drawn[-1].size["height"] == 0  # drawn, to scale
    _shot(browser, "overview")

    browser.get(f"{ui}/records")
    rows = browser.find_elements(By.CSS_SELECTOR, "main table tbody tr")
    assert len(rows) == 3
    _shot(browser, "records")
    browser.get(f"{ui}/records?limit=2")
    browser.find_element(By.LINK_TEXT, "next page").click()
    assert [c.text for c in browser.find_elements(By.CSS_SELECTOR, "tbody tr td:nth-child(5)")] == [
        "o-9"
    ]
    browser.find_element(By.LINK_TEXT, "previous page").click()
    assert len(browser.find_elements(By.CSS_SELECTOR, "main table tbody tr")) == 2
    browser.get(f"{ui}/records")
    browser.find_element(By.LINK_TEXT, "order-9").click()
    assert browser.find_element(By.CSS_SELECTOR, ".fate").text == "waiting"
    # A browser's page load carries no token: the value is not shown, its size is.
    assert (
        "value-o-9" not in browser.page_source and "shown only to a request" in browser.page_source
    )
    _shot(browser, "record")
    act = browser.find_element(By.CSS_SELECTOR, "form.act")
    assert _act(browser, act, "cancel").startswith("403: a write needs the console token")
    assert held() == 3
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    assert _act(browser, act, "cancel").startswith(f"cancel of order-9 {setup.delay}:")
    wait_for(lambda: held() == 2, 30, "order-9 cancelled")

    def fate() -> str:
        browser.refresh()
        return str(browser.find_element(By.CSS_SELECTOR, ".fate").text)

    wait_for(lambda: fate() == "cancelled", 30, "the record page says cancelled")

    browser.get(f"{ui}/dlq")
    cells = browser.find_elements(By.CSS_SELECTOR, "main table tbody tr td")
    assert "missing-target" in [c.text for c in cells]
    _shot(browser, "dlq")
    replay = browser.find_element(By.CSS_SELECTOR, "form.act")  # the token is kept in the tab
    assert _act(browser, replay, "count").startswith("would replay 1 (1 missing-target)")
    assert _act(browser, replay, "replay").startswith("replayed 1 (1 missing-target)")
    # Replayed, it is read and validated again: still without a target, dead-lettered again.
    wait_for(lambda: len(call(bridge, "/api/dlq")[1]["result"]) == 2, 60, "it back in the DLQ")


def test_the_console_shows_recurring_schedules_and_pauses_resumes_and_ends_one(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """``/api/schedules`` and the Schedules page: the schedule with its next three occurrences in
    its zone and in UTC; pause and resume behind the token (refused without it), as ``schedules
    pause|resume`` do; a cancel ends it."""
    bridge = console_bridge(setup, bridges)
    headers: Headers = [
        (H_TARGET_TOPIC, setup.targets[0].encode()),
        ("delay-cron", b"30 8 * * *"),
        ("delay-timezone", b"Asia/Kathmandu"),
        ("delay-id", b"morning"),
    ]
    produce_all(setup.services.bootstrap, setup.delay, [(b"m", b"report", headers)])

    def listed() -> list[dict[str, Any]]:
        status, body = call(bridge, "/api/schedules")
        return list(body.get("result") or []) if status == 200 else []

    wait_for(lambda: len(listed()) == 1, 30, "the schedule listed")
    [row] = listed()
    assert row["delay_id"] == "morning" and row["zone"] == "Asia/Kathmandu" and not row["paused"]
    assert len(row["upcoming_ms"]) == 3
    assert all(local.endswith("T08:30:00+05:45") for local in row["upcoming_local"])
    page = bridge.get("/ui/schedules")[1]
    assert "morning" in page and "08:30:00+05:45" in page and "running" in page
    assert call(bridge, "/api/schedules/pause", {"id": "morning"}, token=None)[0] == 403
    status, body = call(bridge, "/api/schedules/pause", {"id": "morning"})
    assert status == 200, body
    wait_for(lambda: bool(listed()) and listed()[0]["paused"] is True, 30, "paused")
    assert "paused" in bridge.get("/ui/schedules")[1]
    assert call(bridge, "/api/schedules/resume", {"id": "morning"})[0] == 200
    wait_for(lambda: bool(listed()) and listed()[0]["paused"] is False, 30, "resumed")
    status, body = call(bridge, "/api/schedules/pause", {"id": "nothing"})
    assert status == 422 and "no recurring schedule" in body["error"], body
    assert call(bridge, "/api/cancel", {"id": "morning"})[0] == 200
    wait_for(lambda: call(bridge, "/api/schedules")[0] == 404, 30, "no schedule left")
