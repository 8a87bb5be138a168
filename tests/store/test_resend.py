"""resend_messages: a kept message sent again through the normal path, to a real receiver on 127.0.0.1."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from datetime import timedelta
from typing import Any

import httpx
import pytest

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, Sender, deliver_due
from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, FILTERED, PENDING
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.log.kept_purges import purge_kept
from prefect_webhooks.store.queue.outbox import enqueue
from prefect_webhooks.store.queue.replay import RESENT, resend_messages
from prefect_webhooks.store.schema.tables import store_now
from tests.receivers import Receiver
from tests.servers import ingest_api_process
from tests.stored import every_attempt, every_message, finish

pytestmark = pytest.mark.usefixtures("prefect_harness")

OLD_SECRET, NEW_SECRET = "old-s3cret-000001", "new-s3cret-000002"
TOKEN = "resend-t0ken-for-tests"


def track(user: str, n: int) -> dict:
    return {"type": "track", "userId": user, "event": "E", "properties": {"n": n},
            "timestamp": "2026-03-04T05:06:07.123Z"}


async def deliver(url: str, secret: str) -> None:
    async with Sender() as sender:
        context = DeliveryContext(get_engine(), sender)
        context.destinations.remember("crm", WebhookDestination(endpoints=[{"url": url}], shared_secret=secret))
        await deliver_due(DeliveryOptions(), context=context)


async def test_a_delivered_and_a_failed_message_are_sent_again_with_their_id_and_the_current_secret(
    store_url: str,
) -> None:
    with Receiver(script=[200, 410]) as receiver:
        for n in range(2):  # one at a time: the first answered 200, the second 410
            enqueue("crm", [track("ann", n)])
            await deliver(receiver.url, OLD_SECRET)
        first = receiver.wait_for(2)
        assert [row.state for row in every_message()] == [DELIVERED, FAILED]
        assert resend_messages([1, 2]) == {1: RESENT, 2: RESENT}
        # Queued again, each counts the attempt it had.
        assert [(row.state, row.attempts) for row in every_message()] == [(PENDING, 1), (PENDING, 1)]
        # The secret was rotated since: the new requests are signed with the one the block holds now.
        await deliver(receiver.url, NEW_SECRET)
        again = receiver.wait_for(4)[2:]
    assert [row.state for row in every_message()] == [DELIVERED, DELIVERED]
    assert sorted(r.headers["Idempotency-Key"] for r in again) == sorted(r.headers["Idempotency-Key"] for r in first)
    for request in again:
        assert request.headers["X-Signature"] == hmac.new(NEW_SECRET.encode(), request.body,
                                                          hashlib.sha1).hexdigest()
    # Each keeps the attempts it had and gets the new one.
    assert [(a.outbox_id, a.status_code) for a in every_attempt()] == [(1, 200), (2, 410), (1, 200), (2, 200)]


def test_what_cannot_be_sent_again_is_named(store_url: str) -> None:
    enqueue("crm", [track("ann", 0), track("bob", 1), track("cy", 2)])
    finish(store_url, [2], FILTERED, reason="filtered: rule 1")
    finish(store_url, [3], DELIVERED)
    with get_engine().begin() as connection:
        purge_kept(connection, "cy")
    outcomes = resend_messages([1, 2, 3, 99])
    assert outcomes[1].startswith("still queued")
    assert outcomes[2].startswith("filtered: the destination's rules dropped it")
    assert outcomes[3].startswith("purged by a deletion request")
    assert outcomes[99].startswith("neither queued nor kept")
    assert [row.state for row in every_message()] == [PENDING, FILTERED, DELIVERED]


def _shown(page: str, fact: str) -> str:
    """A fact of the console's message page (its HTML), as shown."""
    return re.search(rf"<tr><td>{fact}</td><td>([^<]*)</td></tr>", page).group(1)  # type: ignore[union-attr]


async def test_a_resent_message_counts_every_attempt_and_keeps_its_first_through_every_door(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sent again by the command line and by the console's "Send again": the command line, the admin API and the
    console page count the new attempt with the earlier ones and keep the first attempt's time; the retries start
    afresh (a message first attempted 5 h ago, past the 4 h retry age, is still delivered)."""
    from prefect.settings import PREFECT_API_URL

    from prefect_webhooks.cli import main

    def cli(*args: str) -> Any:
        assert main(list(args)) == 0
        return json.loads(capsys.readouterr().out)

    long_ago = store_now() - timedelta(hours=5)
    with Receiver(script=[200, 410]) as receiver:
        for n in range(2):  # 1 delivered, 2 failed (410)
            enqueue("crm", [track("ann", n)])
            await deliver(receiver.url, OLD_SECRET)
        enqueue("crm", [track("cy", 2)])
        finish(store_url, [3], FAILED, reason="expired: HTTP 503 (after 3 attempts)", attempts=3,
               first_attempt_at=long_ago, at=long_ago + timedelta(hours=4))
        first = {m["id"]: m["first_attempt_at"] for m in cli("messages", "list", "--json")}
        await WebhookDestination(endpoints=[{"url": receiver.url}], shared_secret=NEW_SECRET).save("crm",
                                                                                                  overwrite=True)
        with ingest_api_process(store_url, prefect_api_url=PREFECT_API_URL.value(),
                                env={"PREFECT_WEBHOOKS_ADMIN_TOKEN": TOKEN}) as server:
            assert main(["messages", "resend", "1", "3"]) == 0  # the command line
            assert capsys.readouterr().out == "1: queued again\n3: queued again\n"
            console = httpx.Client(base_url=server.url, timeout=60)
            console.post("/console/sign-in", data={"token": TOKEN, "next": "/console"})
            confirm = console.get("/console/messages/2/resend").text
            csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', confirm).group(1)  # type: ignore[union-attr]
            sent = console.post("/console/messages/2/resend", data={"csrf": csrf, "confirm": "yes"})
            assert "Message 2: queued again." in console.get(sent.headers["location"]).text  # the console
            # Queued again: the attempts it had, from its first.
            pending = cli("messages", "show", "1", "--json")
            assert (pending["state"], pending["attempts"], pending["first_attempt_at"]) == ("pending", 1, first[1])
            await deliver(receiver.url, NEW_SECRET)
            assert len(receiver.wait_for(5)) == 5
            admin = httpx.Client(base_url=f"{server.url}/v1/admin", headers={"Authorization": f"Bearer {TOKEN}"},
                                 timeout=60)
            listed = {m["id"]: m for m in admin.get("/messages").json()["data"]}
            shown = {number: admin.get(f"/messages/{number}").json() for number in (1, 2, 3)}
            page = console.get("/console/messages/2").text
    expected = {1: (DELIVERED, 2, first[1]), 2: (DELIVERED, 2, first[2]),
                3: (DELIVERED, 4, long_ago.isoformat(sep=" ", timespec="milliseconds"))}
    for door in (shown, listed, {m["id"]: m for m in cli("messages", "list", "--json")},
                 {number: cli("messages", "show", str(number), "--json") for number in (1, 2, 3)}):
        assert {number: (m["state"], m["attempts"], m["first_attempt_at"]) for number, m in door.items()} == expected
    assert [t["status_code"] for t in shown[2]["tries"]] == [410, 200]
    assert first[2] < shown[2]["tries"][1]["attempted_at"]  # the first attempt's time, not the resend's
    assert (_shown(page, "attempts"), _shown(page, "first_attempt_at"), _shown(page, "state")) == (
        "2", first[2], "delivered")
    assert page.count("<td>200</td>") == 1 and page.count("<td>410</td>") == 1  # its two attempt rows
    # Sent once more: one more. To a receiver that answers: the first one is closed by now, and a refused attempt
    # is retried by the same run when its batch outlasts the backoff (a loaded machine: 5 attempts in one run).
    assert resend_messages([2]) == {2: RESENT}
    with Receiver() as answering:
        await deliver(answering.url, NEW_SECRET)
        answering.wait_for(1)
    again = cli("messages", "show", "2", "--json")
    assert (again["attempts"], again["first_attempt_at"], len(again["tries"])) == (3, first[2], 3)
