"""The admin API under /v1/admin/, served by a real ``prefect-webhooks ingest`` (uvicorn) on 127.0.0.1."""

from __future__ import annotations

import httpx
import pytest
from prefect.settings import PREFECT_API_URL

from prefect_webhooks.messages.outcomes import DELIVERED, FAILED
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import enqueue
from tests.servers import ingest_api_process
from tests.stored import every_message, finish

TOKEN = "adm1n-t0ken-for-tests"


def track(user: str, n: int) -> dict:
    return {"type": "track", "userId": user, "event": "E", "properties": {"n": n},
            "timestamp": "2026-03-04T05:06:07.123Z"}


@pytest.fixture
def store_with_history(store_url: str) -> str:
    enqueue("crm", [track(f"user-{n % 3}", n) for n in range(12)])
    finish(store_url, list(range(1, 8)), DELIVERED)
    finish(store_url, [8, 9], FAILED, reason="permanent: HTTP 410", attempts=1)
    return store_url  # 1–7 delivered, 8–9 failed, 10–12 pending


def test_messages_are_paged_with_a_cursor_looked_up_and_sent_again(prefect_harness: None,
                                                                   store_with_history: str) -> None:
    with ingest_api_process(store_with_history, prefect_api_url=PREFECT_API_URL.value(),
                            env={"PREFECT_WEBHOOKS_ADMIN_TOKEN": TOKEN}) as server:
        admin = httpx.Client(base_url=f"{server.url}/v1/admin", headers={"Authorization": f"Bearer {TOKEN}"},
                             timeout=60)
        seen, cursor, pages = [], None, 0
        while True:
            page = admin.get("/messages", params={"limit": 5, **({"cursor": cursor} if cursor else {})})
            assert page.status_code == 200, page.text
            seen += [message["id"] for message in page.json()["data"]]
            pages += 1
            cursor = page.json()["next_cursor"]
            if cursor is None:
                break
        assert pages == 3 and sorted(seen) == list(range(1, 13)) and len(set(seen)) == 12
        failed = admin.get("/messages", params=[("state", "failed"), ("userId", "user-2")]).json()["data"]
        assert [(m["id"], m["reason"]) for m in failed] == [(9, "permanent: HTTP 410")]
        refined = admin.get("/messages", params={"reasonPrefix": "permanent: HTTP 4", "limit": 1}).json()
        assert [m["id"] for m in refined["data"]] == [9] and refined["next_cursor"]
        more = admin.get("/messages", params={"reasonPrefix": "permanent: HTTP 4", "cursor": refined["next_cursor"]})
        assert [m["id"] for m in more.json()["data"]] == [8] and more.json()["next_cursor"] is None
        shown = admin.get("/messages/9").json()
        assert shown["state"] == FAILED and shown["body"]["properties"] == {"n": 8}
        assert admin.get("/messages/999").status_code == 404
        resent = admin.post("/messages/resend", json={"ids": [9, 10, 999]}).json()["results"]
        assert [(r["id"], r["outcome"].split(" (")[0].split(":")[0]) for r in resent] == [
            (9, "queued again"), (10, "still queued"), (999, "neither queued nor kept")]
        assert admin.post("/messages/resend", json={"ids": "9"}).json()["message"].startswith("ids: a non-empty list")
        bad = admin.get("/messages", params={"state": "lost"})
        assert bad.status_code == 400 and bad.json()["message"].startswith("state: lost is not one of")
        assert admin.get("/messages", params={"cursor": "!!"}).status_code == 400
        # Without the token, or with a write key's worth of another one: 401, and the token never in the log.
        assert httpx.get(f"{server.url}/v1/admin/messages").status_code == 401
        wrong = httpx.get(f"{server.url}/v1/admin/messages", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.headers["WWW-Authenticate"] == "Bearer"
        output = server.output()
    assert [row.state for row in every_message(get_engine(store_with_history))][8] == "pending"
    assert TOKEN not in output


def test_the_admin_api_is_off_until_a_token_is_set(prefect_harness: None, store_url: str) -> None:
    with ingest_api_process(store_url, prefect_api_url=PREFECT_API_URL.value(),
                            env={"PREFECT_WEBHOOKS_ADMIN_TOKEN": ""}) as server:
        off = httpx.get(f"{server.url}/v1/admin/messages", headers={"Authorization": "Bearer anything"})
    assert off.status_code == 404 and "set PREFECT_WEBHOOKS_ADMIN_TOKEN" in off.json()["message"]
