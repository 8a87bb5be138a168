"""The console in a real headless Chromium (Debian's, driven by Playwright) against a real ``prefect-webhooks
ingest`` (uvicorn) and a real scripted receiver: sign in, read the chart and the top failure reasons, search a
message, open it, send it again and see the new attempt.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, Sender, deliver_due
from prefect_webhooks.delivery.endpoints.stats import artifact_key
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine
from tests.receivers import Receiver
from tests.servers import ingest_api_process, save_source

TOKEN = "console-t0ken-for-tests"
WRITE_KEY = "console-wr1te-key"
SECRET = "console-s3cret-0001"
HEADER_SECRET = "hdr-v4lue-0123456789"
DESTINATION = "console-dest"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# What the receiver answers, by the message's properties.n: a 500 with its own error text (retried later), a 400
# with another (failed for good), a slow 200 and plain 200s. Message 2 is answered 200 once it is "fixed".
FIXED: set[int] = set()


def answer_for(body: bytes) -> dict[str, Any] | None:
    n = json.loads(body)["properties"]["n"]
    if n == 1:
        return {"status": 500, "text": "db down: please retry"}
    if n == 2 and n not in FIXED:
        return {"status": 400, "text": "missing field email"}
    if n == 3:
        return {"status": 200, "delay": 0.3}
    return {"status": 200}


def deliver_once(block: WebhookDestination) -> None:
    """One delivery pass, in a thread of its own (Playwright's sync API holds this thread's event loop)."""

    async def run() -> None:
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender)
            context.destinations.remember(DESTINATION, block)
            await deliver_due(DeliveryOptions(), context=context)

    worker = threading.Thread(target=asyncio.run, args=(run(),))
    worker.start()
    worker.join(60)


@contextmanager
def chromium() -> Iterator[Any]:
    """Headless Chromium. Playwright's sync API runs an event loop in this thread while it is open: Prefect's sync
    calls (``block.save``) go before it."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    assert executable, "chromium is not installed (apt-get install -y chromium; .ci/run installs it)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def test_a_support_question_answered_in_the_console(prefect_harness: None, store_url: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETRY_BASE_DELAY", "600")  # message 1 waits for its retry meanwhile
    get_settings.cache_clear()
    FIXED.clear()
    with Receiver(answer_for=answer_for) as receiver:
        block = WebhookDestination(endpoints=[{"url": receiver.url, "headers": {"X-Api-Key": HEADER_SECRET}}],
                                   shared_secret=SECRET)
        block.save(DESTINATION, overwrite=True)
        save_source("console-src", WRITE_KEY, [DESTINATION])
        with ingest_api_process(store_url, prefect_api_url=PREFECT_API_URL.value(),
                                env={"PREFECT_WEBHOOKS_ADMIN_TOKEN": TOKEN}) as server:
            sent = httpx.post(f"{server.url}/v1/batch", auth=(WRITE_KEY, ""), json={"batch": [
                {"type": "track", "userId": f"user-{n}", "event": "Signed Up", "messageId": f"m-{n}",
                 "properties": {"n": n}, "timestamp": "2026-03-04T05:06:07.123Z"} for n in range(1, 7)]})
            assert sent.status_code == 200, sent.text
            deliver_once(block)
            assert len(receiver.requests) == 6
            with chromium() as browser:
                _check_the_console(server, receiver, block, browser)
            output = server.output()
    assert TOKEN not in output and SECRET not in output


def _check_the_console(server: Any, receiver: Receiver, block: WebhookDestination, browser: Any) -> None:
    page = browser.new_page()
    # Without the token: the sign-in form (401); with it, the destinations.
    answer = page.goto(f"{server.url}/console/messages/1")
    assert answer is not None and answer.status == 401
    page.fill("input[name=token]", "not-the-token")
    page.click("button")
    assert "That is not the admin token." in page.content()
    page.fill("input[name=token]", TOKEN)
    page.click("button")
    assert page.url == f"{server.url}/console/messages/1"
    page.goto(f"{server.url}/console")
    page.click(f"text={DESTINATION}")

    # The chart and its legend: 4 delivered, 1 failed, drawn from the per-minute counters.
    legend = {o: page.inner_text(f".legend [data-outcome={o}]") for o in ("delivered", "failed", "filtered")}
    assert legend == {"delivered": "delivered 4", "failed": "failed 1", "filtered": "filtered 0"}
    drawn: dict[str, int] = {}
    for title in page.locator("svg.chart rect title").all_text_contents():
        count, outcome = re.search(r"UTC: (\d+) (\w+)$", title).groups()  # type: ignore[union-attr]
        drawn[outcome] = drawn.get(outcome, 0) + int(count)
    assert drawn == {"delivered": 4, "failed": 1}
    if os.environ.get("CONSOLE_SCREENSHOTS"):
        page.screenshot(path=f"{os.environ['CONSOLE_SCREENSHOTS']}/destination.png", full_page=True)
    # The top failure reason, with a sample message.
    reasons = page.locator("h2:has-text('Top failure reasons') + table tbody tr").all_inner_texts()
    assert [re.sub(r"\s+", " ", row).strip() for row in reasons] == [
        "failed permanent: HTTP 400 1 message 2"]
    # The endpoint with its health and its action.
    endpoint = page.locator("h2:has-text('Endpoints') + table tbody tr td").all_inner_texts()
    assert endpoint[1] == receiver.url and endpoint[2] == "none" and endpoint[7] == "disable…"
    # Its deliver runs in the Prefect UI: the page of its runs' table artifacts.
    runs = page.get_attribute("h2:has-text('Endpoints') + table a.runs", "href")
    assert runs == f"{PREFECT_UI_URL.value()}/artifacts/key/{artifact_key(DESTINATION, receiver.url)}"
    assert re.fullmatch(r"healthy|failing: \d+ in a row", endpoint[3]), endpoint

    # Search by messageId, open the message: its attempt is what the receiver answered.
    page.goto(f"{server.url}/console/messages")
    page.fill("input[name=messageId]", "m-2")
    page.click("text=Search")
    page.click("table a >> text=2")
    assert page.url == f"{server.url}/console/messages/2"
    assert _attempts(page) == [("400", "missing field email")]
    content = page.content()
    for secret in (SECRET, HEADER_SECRET, TOKEN):
        assert secret not in content
    assert "X-Api-Key: ********" in content  # the request as sent, masked

    # Message 1 (500 with the receiver's text) and 3 (slow) as the receiver saw them.
    page.goto(f"{server.url}/console/messages/1")
    assert _attempts(page) == [("500", "db down: please retry")]
    page.goto(f"{server.url}/console/messages/3")
    latency = float(page.locator("h2:has-text('Attempts') + table tbody tr td").nth(4).inner_text())
    assert latency >= 300

    # Send message 2 again: confirmation, then a new attempt with the same id.
    page.goto(f"{server.url}/console/messages/2")
    page.click("text=Send again…")
    assert "Send message 2 again?" in page.content()
    page.click("text=Yes, do it")
    assert "Message 2: queued again." in page.inner_text(".notice")
    FIXED.add(2)
    deliver_once(block)
    page.reload()
    assert _attempts(page) == [("400", "missing field email"), ("200", "ok")]
    if os.environ.get("CONSOLE_SCREENSHOTS"):
        page.screenshot(path=f"{os.environ['CONSOLE_SCREENSHOTS']}/message.png", full_page=True)
    assert "delivered" in page.inner_text("table")
    ids = [r.headers.get("Idempotency-Key") for r in receiver.requests if json.loads(r.body)["properties"]["n"]
           == 2]
    assert len(ids) == 2 and ids[0] == ids[1]

    # Every message's attempts shown equal the requests the receiver got for it.
    for n in range(1, 7):
        page.goto(f"{server.url}/console/messages/{n}")
        received = [r for r in receiver.requests if json.loads(r.body)["properties"]["n"] == n]
        assert len(_attempts(page)) == len(received), n

    # A form sent without the session's form token, or from another site, is refused.
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    forged = httpx.post(f"{server.url}/console/messages/4/resend", cookies=cookies, data={"confirm": "yes"})
    assert forged.status_code == 403


def _attempts(page: Any) -> list[tuple[str, str]]:
    """(status, receiver's answer) of each attempt row on a message page."""
    rows = page.locator("h2:has-text('Attempts') + table tbody tr")
    shown = []
    for index in range(rows.count()):
        cells = rows.nth(index).locator("td")
        shown.append((cells.nth(3).inner_text().strip(), cells.nth(7).inner_text().strip()))
    return shown
