"""The ``replay`` flow: failed messages of a destination back to pending, then delivered."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import orjson
import pytest
from prefect import get_client
from sqlalchemy import select, update

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.flows.deliver import deliver
from prefect_webhooks.flows.replay import replay
from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, PENDING
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import OUTBOX, enqueue
from tests.receivers import Receiver
from tests.stored import every_message, finish

pytestmark = pytest.mark.usefixtures("prefect_harness")


def track(n: int) -> dict[str, Any]:
    return {"version": 1, "type": "track", "userId": f"u{n}", "timestamp": "2026-01-01T00:00:00.000Z",
            "event": "E", "properties": {}}


def outbox() -> list[Any]:
    return every_message()


async def run_artifact(state: Any, kind: str) -> Any:
    """The data of the replay run's artifact of type ``kind`` (``table`` or ``progress``)."""
    async with get_client() as client:
        response = await client.request(
            "POST", "/artifacts/filter",
            json={"artifacts": {"flow_run_id": {"any_": [str(state.state_details.flow_run_id)]}}, "limit": 10,
                  "offset": 0, "sort": "CREATED_DESC"})
    (artifact,) = [artifact for artifact in response.json() if artifact["type"] == kind]
    return artifact["data"]


async def replay_summary(state: Any) -> dict[str, Any]:
    """The one row of the replay run's table artifact."""
    return orjson.loads(await run_artifact(state, "table"))[0]


async def progress_of(state: Any) -> float:
    """Where the replay run's progress artifact ended."""
    return float(await run_artifact(state, "progress"))


@pytest.fixture
def name(store_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A destination block name; blocks are read afresh by every batch."""
    monkeypatch.setenv("PREFECT_WEBHOOKS_BLOCK_CACHE_SECONDS", "0")
    get_settings.cache_clear()
    return f"replay-{uuid.uuid4().hex[:8]}"


async def test_replay_puts_back_only_the_selected_failures_and_they_are_delivered(name: str) -> None:
    with Receiver(default=404) as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url}]).save(name)
        enqueue(name, [track(n) for n in range(4)])
        enqueue("other", [track(9)])
        with get_engine().begin() as connection:
            connection.execute(update(OUTBOX).where(OUTBOX.c.id == 1).values(created_at=dt.datetime(2025, 1, 1)))
        await deliver(destination=name)
        assert [row.state for row in outbox()[:4]] == [FAILED] * 4
        # The receiver is fixed; replay what failed since mid-2025.
        receiver.default = 200
        state = await replay(name, created_after=dt.datetime(2025, 6, 1, tzinfo=dt.timezone.utc),
                             reason_prefix="permanent: HTTP 404", return_state=True)
        assert await state.result() == 3
        rows = outbox()
        assert [row.state for row in rows] == [FAILED, PENDING, PENDING, PENDING, PENDING]
        # Their retries start afresh (the queue row's count and first attempt: a full retry age), while each still
        # counts the attempt it had, from its first.
        with get_engine().connect() as connection:
            queued = connection.execute(select(OUTBOX.c.attempts, OUTBOX.c.first_attempt_at, OUTBOX.c.earlier_attempts)
                                        .where(OUTBOX.c.id.in_([2, 3, 4]))).all()
        assert queued == [(0, None, 1)] * 3
        first = [row.first_attempt_at for row in rows[1:4]]
        assert [row.attempts for row in rows[1:4]] == [1, 1, 1] and None not in first
        summary = await deliver(destination=name)
        assert summary["delivered"] == 3
    assert [row.state for row in outbox()[:4]] == [FAILED, DELIVERED, DELIVERED, DELIVERED]
    assert [(row.attempts, row.first_attempt_at) for row in outbox()[1:4]] == [(2, at) for at in first]
    assert sorted(orjson.loads(r.body)["userId"] for r in receiver.requests[4:]) == ["u1", "u2", "u3"]
    assert (await replay_summary(state))["replayed"] == 3


async def test_replay_of_filtered_messages_applies_the_current_rules(name: str) -> None:
    too_strict = [{"name": "only-u1", "action": "allow", "conditions": [{"field": "userId", "equals": "u1"}]}]
    with Receiver() as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url}], filters=too_strict).save(name)
        enqueue(name, [track(n) for n in range(3)])
        summary = await deliver(destination=name)
        assert (summary["delivered"], summary["filtered"]) == (1, 2)
        # Failed-message replay leaves filtered ones alone.
        assert await replay(name) == 0
        await WebhookDestination(endpoints=[{"url": receiver.url}]).save(name, overwrite=True)
        state = await replay(name, filtered=True, reason_prefix="filtered: allow rule 'only-u1'", return_state=True)
        assert await state.result() == 2
        assert [row.state for row in outbox()] == [PENDING, DELIVERED, PENDING]
        assert (await deliver(destination=name))["delivered"] == 2
    assert [row.state for row in outbox()] == [DELIVERED] * 3
    assert sorted(orjson.loads(r.body)["userId"] for r in receiver.requests) == ["u0", "u1", "u2"]
    assert await replay_summary(state) == {
        "destination": name, "endpoint": "", "since": "", "until": "", "created_after": "", "created_before": "",
        "reason_prefix": "filtered: allow rule 'only-u1'", "state": "filtered", "replayed": 2}


async def test_a_window_replay_by_endpoint_url_in_chunks(name: str) -> None:
    with Receiver(default=503) as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url}]).save(name)
        await WebhookDestination(endpoints=[{"url": receiver.url}]).save(f"{name}-2")
        enqueue(name, [track(n) for n in range(6)])
        enqueue(f"{name}-2", [track(n) for n in range(6, 9)])
        outage_from = dt.datetime(2026, 3, 1, 10, tzinfo=dt.timezone.utc)
        # Everything failed; ids 1-3 and 7 were being attempted during the outage window, the others later.
        for ids, hour in (([1, 2, 3, 7], 11), ([4, 5, 6, 8, 9], 15)):
            finish(get_engine(), ids, FAILED, reason="expired: HTTP 503", attempts=5,
                   first_attempt_at=dt.datetime(2026, 3, 1, hour - 1), at=dt.datetime(2026, 3, 1, hour))
        receiver.default = 200
        state = await replay(endpoint=receiver.url, since=outage_from, until=outage_from + dt.timedelta(hours=2),
                             chunk_size=2, return_state=True)
        assert await state.result() == 4
        assert [row.id for row in outbox() if row.state == PENDING] == [1, 2, 3, 7]
        assert await progress_of(state) == 100.0
        summary = await replay_summary(state)
        assert summary["destination"] == f"{name}, {name}-2" and summary["replayed"] == 4


async def test_replay_without_destination_or_endpoint_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="destination or an endpoint"):
        await replay()
