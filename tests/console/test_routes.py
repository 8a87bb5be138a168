"""The console's access rules and actions, over HTTP against a real ``prefect-webhooks ingest`` (uvicorn): off until a
token is set, a session cookie only a signed-in browser holds, forms that only the console's own pages can send,
and replay and endpoint actions that go through the command line's paths."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from prefect.settings import PREFECT_API_URL

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.messages.outcomes import FAILED, PENDING
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import enqueue
from tests.servers import ingest_api_process
from tests.stored import every_message, finish

TOKEN = "console-t0ken-for-route-tests"
# What is checked is each answer, not its speed: an action saves a block through the Prefect test server, which a
# loaded machine can keep longer than httpx's default 5 s (a run beside a CPU hog timed out once).
WAIT = 60.0


def signed_in(url: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=WAIT)
    answer = client.post("/console/sign-in", data={"token": TOKEN, "next": "/console"})
    assert answer.status_code == 303 and answer.headers["location"] == "/console"
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
    assert TOKEN not in cookie
    return client


def form_token(client: httpx.Client, path: str) -> str:
    page = client.get(path)
    assert page.status_code == 200, page.text
    return re.search(r'name="csrf" value="([0-9a-f]+)"', page.text).group(1)  # type: ignore[union-attr]


def test_the_console_is_off_until_a_token_is_set(prefect_harness: None, store_url: str) -> None:
    with ingest_api_process(store_url, prefect_api_url=PREFECT_API_URL.value(),
                            env={"PREFECT_WEBHOOKS_ADMIN_TOKEN": ""}) as server:
        off = httpx.get(f"{server.url}/console", timeout=WAIT)
        signing_in = httpx.post(f"{server.url}/console/sign-in", timeout=WAIT, data={"token": "anything"})
    assert off.status_code == 404 and "set PREFECT_WEBHOOKS_ADMIN_TOKEN" in off.text
    assert signing_in.status_code == 404


def test_sessions_forms_and_actions(prefect_harness: None, store_url: str) -> None:
    WebhookDestination(endpoints=[{"url": "http://127.0.0.1:9/a"}, {"url": "http://127.0.0.1:9/b"}]).save(
        "console-actions", overwrite=True)
    enqueue("console-actions", [{"type": "track", "userId": f"u{n}", "event": "E"} for n in range(4)])
    finish(store_url, [1, 2, 3], FAILED, reason="permanent: HTTP 410", attempts=1)
    with ingest_api_process(store_url, prefect_api_url=PREFECT_API_URL.value(),
                            env={"PREFECT_WEBHOOKS_ADMIN_TOKEN": TOKEN,
                                 "PREFECT_WEBHOOKS_BLOCK_CACHE_SECONDS": "2"}) as server:
        # No session: every page is the sign-in form (401); a wrong token does not sign in; bearer works for scripts.
        assert httpx.get(f"{server.url}/console/destinations/console-actions", timeout=WAIT).status_code == 401
        wrong = httpx.post(f"{server.url}/console/sign-in", timeout=WAIT, data={"token": "nope"})
        assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
        bearer = httpx.get(f"{server.url}/console", timeout=WAIT, headers={"Authorization": f"Bearer {TOKEN}"})
        assert bearer.status_code == 200 and "console-actions" in bearer.text
        assert bearer.headers["x-frame-options"] == "DENY" and bearer.headers["cache-control"] == "no-store"
        # Off-site next= targets are not followed.
        assert httpx.post(f"{server.url}/console/sign-in", timeout=WAIT,
                          data={"token": TOKEN, "next": "https://evil.example/"}).headers["location"] == "/console"

        client = signed_in(server.url)
        page = "/console/destinations/console-actions"
        csrf = form_token(client, f"{page}/replay?since=1h")
        assert "Put back 3 failed message(s) of console-actions" in client.get(f"{page}/replay?since=1h").text
        # A form without the session's form token, or sent by another site's page, changes nothing.
        assert client.post(f"{page}/replay", data={"since": "1h", "confirm": "yes"}).status_code == 403
        forged = client.post(f"{page}/replay", data={"since": "1h", "csrf": csrf},
                             headers={"Origin": "https://evil.example"})
        assert forged.status_code == 403
        assert [row.state for row in every_message(get_engine(store_url))] == [FAILED] * 3 + [PENDING]
        # Confirmed: the replay puts them back.
        done = client.post(f"{page}/replay", data={"since": "1h", "csrf": csrf},
                           headers={"Origin": server.url})
        assert done.status_code == 303
        assert "3 failed message(s) are pending again." in client.get(done.headers["location"]).text
        assert [row.state for row in every_message(get_engine(store_url))] == [PENDING] * 4

        # Disable endpoint 2, then enable it again, each behind its confirmation.
        assert "Disable endpoint 2 of console-actions?" in client.get(f"{page}/endpoints/2/disable").text
        disabled = client.post(f"{page}/endpoints/2/disable", data={"csrf": csrf})
        assert "Endpoint 2 disabled." in client.get(disabled.headers["location"]).text
        assert [entry.position for entry in WebhookDestination.load("console-actions").disabled_endpoints] == [2]
        assert "disabled by hand" in client.get(page).text
        enabled = client.post(f"{page}/endpoints/2/enable", data={"csrf": csrf})
        assert "Endpoint 2 enabled." in client.get(enabled.headers["location"]).text
        assert WebhookDestination.load("console-actions").disabled_endpoints == []
        # The page keeps the block it loaded for the block cache's seconds, as delivery does: an endpoint enabled or
        # disabled shows at once (above; the store counts the change), one saved elsewhere (the Prefect UI, a
        # script) once the copy ages out.
        assert "disabled by hand" not in client.get(page).text
        WebhookDestination(endpoints=[{"url": "http://127.0.0.1:9/a"}, {"url": "http://127.0.0.1:9/b"},
                                      {"url": "http://127.0.0.1:9/added"}]).save("console-actions", overwrite=True)
        saved = time.monotonic()
        while "http://127.0.0.1:9/added" not in client.get(page).text:
            assert time.monotonic() - saved < 2 + WAIT, "the page never showed the endpoint saved elsewhere"
            time.sleep(0.2)
        assert client.get(f"{page}/endpoints/2/explode").status_code == 404

        # Bad search input is named; signing out ends the session.
        bad = client.get("/console/messages", params={"state": "lost"})
        assert bad.status_code == 400 and "state: lost is not one of" in bad.text
        client.post("/console/sign-out", data={"csrf": csrf})
        assert client.get("/console").status_code == 401
        output = server.output()
    assert TOKEN not in output


def test_a_message_page_keeps_its_block_as_the_destination_page_does(prefect_harness: None, store_url: str) -> None:
    """The request a message makes now comes from the destination block as delivery holds it: an edit saved elsewhere
    (the Prefect UI, a script) shows once the copy ages out, not at the next view; a change the store counts (an
    endpoint disabled here) at once."""
    WebhookDestination(endpoints=[{"url": "http://127.0.0.1:9/first"}]).save("console-kept", overwrite=True)
    enqueue("console-kept", [{"type": "track", "userId": "u1", "event": "E"}])
    with ingest_api_process(store_url, prefect_api_url=PREFECT_API_URL.value(),
                            env={"PREFECT_WEBHOOKS_ADMIN_TOKEN": TOKEN,
                                 "PREFECT_WEBHOOKS_BLOCK_CACHE_SECONDS": "600"}) as server:
        client = signed_in(server.url)
        page = "/console/messages/1"
        assert "POST http://127.0.0.1:9/first" in client.get(page).text
        WebhookDestination(endpoints=[{"url": "http://127.0.0.1:9/second"}]).save("console-kept", overwrite=True)
        kept = client.get(page).text
        assert "POST http://127.0.0.1:9/first" in kept and "/second" not in kept
        endpoint = "/console/destinations/console-kept/endpoints/1/disable"
        disabled = client.post(endpoint, data={"csrf": form_token(client, endpoint)})
        assert "Endpoint 1 disabled." in client.get(disabled.headers["location"]).text
        assert "POST http://127.0.0.1:9/second" in client.get(page).text


@pytest.mark.parametrize("path", ["/console", "/console/messages", "/console/messages/1"])
def test_console_pages_are_not_in_the_api_document(path: str, store_url: str) -> None:
    from prefect_webhooks.serving.service import create_service_app

    assert path not in create_service_app().openapi()["paths"]
