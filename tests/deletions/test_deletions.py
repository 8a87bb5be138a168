"""Deletion requests: delete notifications per affected source, purge of stored personal data, suppression."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone
from typing import Any

import orjson
import pytest
from sqlalchemy import insert, select, update

from prefect_webhooks.deletions.processing import affected_sources, process_deletion, sources_with_events
from prefect_webhooks.deletions.requests import DeletionError, pending_requests, request_deletion, user_reference
from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, FILTERED
from prefect_webhooks.messages.payloads import identify_payload
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import enqueue
from prefect_webhooks.store.schema.tables import AudienceState, DeletionRequest, OutboxMessage, SuppressedUser
from tests.stored import every_message, finish

OUTBOX = OutboxMessage.__table__
WHEN = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)
# web: two destinations; app: one; crm: enabled on nothing; legacy: its Source block no longer exists.
DESTINATIONS: dict[str, list[str] | None] = {"web": ["hooks-a", "hooks-b"], "app": ["hooks-c"], "crm": [],
                                              "legacy": None}


def track(user: str, event: str = "Order Completed") -> dict[str, Any]:
    return {"version": 1, "type": "track", "userId": user, "event": event, "properties": {"email": f"{user}@x.io"},
            "timestamp": "2026-01-01T00:00:00.000Z"}


def set_state(store_url: str, state: str, **where: Any) -> None:
    """Give the queued messages matching ``where`` an outcome, as delivery would."""
    finish(store_url, [message.id for message in every_message(store_url, state="pending", **where)], state)


def rows(store_url: str) -> list[dict[str, Any]]:
    return [vars(message) for message in every_message(store_url)]


@pytest.fixture
def history(store_url: str) -> None:
    """u1 has events from web (delivered), app (pending), crm (failed) and legacy; u2 has events from web."""
    enqueue("hooks-a", [track("u1"), track("u1", "Viewed")], source="web")
    enqueue("hooks-c", [track("u1")], source="app")
    enqueue("hooks-x", [track("u1")], source="crm")
    enqueue("hooks-y", [track("u1")], source="legacy")
    enqueue("hooks-a", [track("u2")], source="web")
    with get_engine(store_url).begin() as connection:
        connection.execute(update(OUTBOX).where(OUTBOX.c.id <= 2).values(message_id="msg-u1"))
        connection.execute(insert(AudienceState.__table__), [
            {"audience_key": "vip", "destination": "hooks-a", "user_id": "u1", "value": "true"},
            {"audience_key": "vip", "destination": "hooks-a", "user_id": "u2", "value": "true"},
        ])
    set_state(store_url, DELIVERED, source="web")
    set_state(store_url, FAILED, source="crm")


def test_request_is_recorded_pending(store_url: str) -> None:
    request_id = request_deletion("u1", ["web"], suppress=True)
    [pending] = pending_requests()
    assert (pending.id, pending.user_id, pending.sources, pending.suppress) == (request_id, "u1", ["web"], True)
    with pytest.raises(ValueError, match="needs a userId"):
        request_deletion("  ")


@pytest.mark.usefixtures("history")
def test_sources_with_events_are_derived_from_the_outbox(store_url: str) -> None:
    assert sources_with_events("u1") == ["app", "crm", "legacy", "web"]
    assert sources_with_events("u2") == ["web"]
    assert sources_with_events("nobody") == []


@pytest.mark.usefixtures("history")
def test_fan_out_to_every_affected_source(store_url: str) -> None:
    request = pending_requests(request_ids=[request_deletion("u1")])[0]
    before = len(rows(store_url))
    outcome = process_deletion(request, DESTINATIONS, timestamp=WHEN)

    assert outcome.delete_messages == 3
    assert outcome.notified == {"web": ["hooks-a", "hooks-b"], "app": ["hooks-c"]}
    assert outcome.skipped_sources == {"crm": "no Webhooks destination enabled", "legacy": "no such source"}
    deletes = rows(store_url)[before:]
    assert sorted((row["source"], row["destination"]) for row in deletes) == [
        ("app", "hooks-c"), ("web", "hooks-a"), ("web", "hooks-b")]
    for row in deletes:
        assert row["message_type"] == "delete" and row["state"] == "pending" and row["user_id"] == "u1"
        # Exactly the three members, in this order, and no version.
        assert row["body"] == b'{"type":"delete","userId":"u1","timestamp":"2026-01-02T03:04:05.678Z"}'


@pytest.mark.usefixtures("history")
def test_named_sources_only(store_url: str) -> None:
    request = pending_requests(request_ids=[request_deletion("u1", ["app", "crm"])])[0]
    assert affected_sources(request) == ["app", "crm"]
    outcome = process_deletion(request, DESTINATIONS)
    assert outcome.notified == {"app": ["hooks-c"]} and outcome.delete_messages == 1
    assert [row["destination"] for row in rows(store_url) if row["message_type"] == "delete"] == ["hooks-c"]


@pytest.mark.usefixtures("history")
def test_purge_leaves_no_personal_data_of_the_user(store_url: str) -> None:
    request = pending_requests(request_ids=[request_deletion("u1")])[0]
    outcome = process_deletion(request, DESTINATIONS)
    assert (outcome.purged_rows, outcome.dropped_pending, outcome.audience_state_rows) == (3, 2, 1)

    stored = rows(store_url)
    old = [row for row in stored if row["message_type"] != "delete"]
    u1_rows = old[:5]
    assert all(row["body"] is None and row["user_id"] is None and row["message_id"] is None for row in u1_rows)
    # Pending rows (app, legacy) were dropped rather than sent after the request.
    assert Counter((row["state"], row["reason"]) for row in u1_rows) == {
        ("delivered", None): 2, ("failed", None): 1, ("failed", f"purged: deletion request {request.id}"): 2}
    # Nothing but the delete notifications mentions u1 anywhere in the outbox.
    for row in old:
        assert all(b"u1" not in (value if isinstance(value, bytes) else str(value).encode())
                   for value in row.values() if value is not None)
    # Another user's rows are untouched.
    u2 = old[5]
    assert u2["user_id"] == "u2" and orjson.loads(u2["body"])["userId"] == "u2"
    with get_engine(store_url).connect() as connection:
        state = connection.execute(select(AudienceState.__table__.c.user_id)).scalars().all()
    assert state == ["u2"]


def test_rows_a_filter_dropped_are_purged_too(store_url: str) -> None:
    enqueue("hooks-a", [track("u1", "Debug Ping"), track("u2", "Debug Ping")], source="web")
    finish(store_url, [1, 2], FILTERED, reason="filtered: drop rule 'no-debug'")
    request = pending_requests(request_ids=[request_deletion("u1")])[0]
    assert process_deletion(request, DESTINATIONS).purged_rows == 1
    first, second, *_ = rows(store_url)
    assert (first["state"], first["body"], first["user_id"]) == (FILTERED, None, None)
    assert second["user_id"] == "u2" and second["body"] is not None


@pytest.mark.usefixtures("history")
def test_request_outcome_is_kept(store_url: str) -> None:
    request_id = request_deletion("u1")
    process_deletion(pending_requests(request_ids=[request_id])[0], DESTINATIONS)
    with get_engine(store_url).connect() as connection:
        stored = connection.execute(select(DeletionRequest.__table__)).mappings().one()
    assert stored["state"] == "completed" and stored["completed_at"] is not None
    assert stored["outcome"]["delete_messages"] == 3
    assert stored["outcome"]["skipped_sources"]["legacy"] == "no such source"
    assert "u1" not in orjson.dumps(stored["outcome"]).decode()
    assert pending_requests() == []


@pytest.mark.usefixtures("history")
def test_processing_twice_is_refused_and_writes_nothing(store_url: str) -> None:
    request = pending_requests(request_ids=[request_deletion("u1")])[0]
    process_deletion(request, DESTINATIONS)
    count = len(rows(store_url))
    with pytest.raises(DeletionError, match="not pending"):
        process_deletion(request, DESTINATIONS)
    assert len(rows(store_url)) == count


def test_pending_delete_notifications_survive_a_second_request(store_url: str) -> None:
    enqueue("hooks-a", [track("u1")], source="web")
    process_deletion(pending_requests(request_ids=[request_deletion("u1")])[0], DESTINATIONS)
    process_deletion(pending_requests(request_ids=[request_deletion("u1", ["web"])])[0], DESTINATIONS)
    deletes = [row for row in rows(store_url) if row["message_type"] == "delete"]
    assert len(deletes) == 4  # web has two destinations, notified once per request
    assert all(row["state"] == "pending" and row["user_id"] == "u1" and row["body"] for row in deletes)


def test_delivered_delete_notifications_are_purged_too(store_url: str) -> None:
    enqueue("hooks-a", [track("u1")], source="web")
    process_deletion(pending_requests(request_ids=[request_deletion("u1")])[0], DESTINATIONS)
    set_state(store_url, DELIVERED, message_type="delete")
    process_deletion(pending_requests(request_ids=[request_deletion("u1", [])])[0], DESTINATIONS)
    assert all(row["user_id"] is None and row["body"] is None for row in rows(store_url))


@pytest.mark.parametrize(("sources", "scopes"), [(None, ["*"]), (["web", "app"], ["app", "web"])])
def test_suppression(store_url: str, sources: list[str] | None, scopes: list[str]) -> None:
    enqueue("hooks-a", [identify_payload("u1", {"a": 1}, WHEN)], source="web")
    outcome = process_deletion(pending_requests(request_ids=[request_deletion("u1", sources, suppress=True)])[0],
                               DESTINATIONS)
    with get_engine(store_url).connect() as connection:
        stored = connection.execute(select(SuppressedUser.__table__.c.user_id, SuppressedUser.__table__.c.source))
        assert sorted(stored.all()) == [("u1", scope) for scope in scopes]
    assert sorted(outcome.suppressed) == scopes
    # Suppressing again is idempotent.
    process_deletion(pending_requests(request_ids=[request_deletion("u1", sources, suppress=True)])[0], DESTINATIONS)


def test_no_suppression_unless_asked(store_url: str) -> None:
    process_deletion(pending_requests(request_ids=[request_deletion("u9")])[0], DESTINATIONS)
    with get_engine(store_url).connect() as connection:
        assert connection.execute(select(SuppressedUser.__table__)).all() == []


def test_user_reference_hides_the_id() -> None:
    assert user_reference("alice@example.com").startswith("user#")
    assert "alice" not in user_reference("alice@example.com")
    assert user_reference("a") == user_reference("a") != user_reference("b")
