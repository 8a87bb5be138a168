"""The ingestion path (no HTTP): merge, validation, timestamps, dedupe, suppression, routing, outbox rows."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import orjson
import pytest
from sqlalchemy import select

from prefect_webhooks.inbound.envelope import EnvelopeError, merge_batch_fields
from prefect_webhooks.inbound.ingestion import ingest_batch
from prefect_webhooks.inbound.sources import SourceInfo
from prefect_webhooks.messages.model import MAX_MESSAGE_BYTES
from prefect_webhooks.store.dedupe.seen_ids import seen_receipts
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.schema.tables import OutboxMessage, SuppressedUser, store_now

SOURCE = SourceInfo(name="web", destinations=("crm", "warehouse"))
RECEIVED = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


def outbox(store_url: str) -> list[OutboxMessage]:
    with get_engine(store_url).connect() as connection:
        return list(connection.execute(select(OutboxMessage.__table__).order_by(OutboxMessage.__table__.c.id)))


def track(message_id: str, **extra: object) -> dict:
    return {"type": "track", "userId": "u1", "event": "Signed Up", "messageId": message_id, **extra}


def test_every_accepted_call_becomes_one_row_per_destination(store_url: str) -> None:
    result = ingest_batch([track("m1"), track("m2")], SOURCE, received_at=RECEIVED)
    assert (result.accepted, result.rows_written, result.rejected) == (2, 4, [])
    rows = outbox(store_url)
    assert sorted((row.message_id, row.destination) for row in rows) == [
        ("m1", "crm"), ("m1", "warehouse"), ("m2", "crm"), ("m2", "warehouse")
    ]
    assert {row.source for row in rows} == {"web"}
    assert {row.state for row in rows} == {"pending"}
    body = orjson.loads(rows[0].body)
    assert body == {
        "version": 1, "type": "track", "userId": "u1", "timestamp": "2026-03-01T12:00:00.000Z",
        "event": "Signed Up", "properties": {},
    }


def test_rows_of_one_call_share_the_same_body_bytes(store_url: str) -> None:
    ingest_batch([track("m1", properties={"plan": "pro"})], SOURCE, received_at=RECEIVED)
    first, second = outbox(store_url)
    assert first.body == second.body


def test_rule_breaking_calls_are_rejected_alone_with_index_and_field(store_url: str) -> None:
    batch = [
        {"userId": "u"},  # no type
        {"type": "identify"},  # no userId or anonymousId
        {"type": "track", "userId": "u"},  # no event
        {"type": "group", "userId": "u"},  # no groupId
        {"type": "alias", "userId": "u"},  # no previousId
        {"type": "alias", "previousId": "p"},  # no userId
        {"type": "wave", "userId": "u"},  # unknown type
        "not an object",
        {"type": "track", "userId": "u", "event": "ok", "timestamp": "yesterday"},
        track("good"),
    ]
    result = ingest_batch(batch, SOURCE, received_at=RECEIVED)
    assert result.accepted == 1
    assert [(r.index, r.field) for r in result.rejected] == [
        (0, "type"), (1, "userId"), (2, "event"), (3, "groupId"), (4, "previousId"), (5, "userId"),
        (6, "type"), (7, "message"), (8, "timestamp"),
    ]
    assert all(r.reason for r in result.rejected)
    assert {row.message_id for row in outbox(store_url)} == {"good"}


def test_message_over_32kb_refuses_the_batch_naming_index_and_size(store_url: str) -> None:
    big = track("big", properties={"blob": "x" * MAX_MESSAGE_BYTES})
    with pytest.raises(EnvelopeError) as caught:
        ingest_batch([track("ok"), big], SOURCE)
    assert caught.value.code == "message_too_large"
    assert "index 1" in caught.value.message and str(len(orjson.dumps(big))) in caught.value.message
    assert outbox(store_url) == []


def test_message_over_32kb_rejected_alone_for_imports(store_url: str) -> None:
    big = track("big", properties={"blob": "x" * MAX_MESSAGE_BYTES})
    result = ingest_batch([track("ok"), big], SOURCE, oversize="reject", first_index=10)
    assert result.accepted == 1
    assert [(r.index, r.field) for r in result.rejected] == [(11, "message")]


def test_missing_message_id_gets_a_uuid(store_url: str) -> None:
    ingest_batch([{"type": "identify", "userId": "u1"}], SOURCE)
    ids = {row.message_id for row in outbox(store_url)}
    assert len(ids) == 1 and len(ids.pop()) == 36


class TestMerge:
    def test_batch_context_and_integrations_merge_with_the_call_winning(self) -> None:
        merged = merge_batch_fields(
            {"type": "track", "context": {"ip": "1.1.1.1"}, "integrations": {"Webhooks": True}},
            context={"ip": "9.9.9.9", "library": {"name": "sdk"}},
            integrations={"All": False, "Webhooks": False},
            sent_at="2026-01-01T00:00:00Z",
        )
        assert merged["context"] == {"ip": "1.1.1.1", "library": {"name": "sdk"}}
        assert merged["integrations"] == {"All": False, "Webhooks": True}
        assert merged["sentAt"] == "2026-01-01T00:00:00Z"

    def test_call_sent_at_wins_and_input_is_not_mutated(self) -> None:
        raw = {"type": "track", "sentAt": "2026-01-02T00:00:00Z"}
        merged = merge_batch_fields(raw, context={"a": 1}, sent_at="2026-01-01T00:00:00Z")
        assert merged["sentAt"] == "2026-01-02T00:00:00Z"
        assert raw == {"type": "track", "sentAt": "2026-01-02T00:00:00Z"}

    def test_batch_integrations_route_calls(self, store_url: str) -> None:
        result = ingest_batch(
            [track("a"), track("b", integrations={"Webhooks": True})], SOURCE, integrations={"All": False}
        )
        assert result.accepted == 2
        assert {row.message_id for row in outbox(store_url)} == {"b"}

    def test_screen_context_comes_from_the_batch(self, store_url: str) -> None:
        screen = {"type": "screen", "userId": "u", "name": "Home", "messageId": "s1"}
        ingest_batch([screen], SOURCE, context={"os": {"name": "iOS", "version": "17"}})
        body = orjson.loads(outbox(store_url)[0].body)
        assert body["context"]["os"] == {"name": "iOS", "version": "17"}


class TestTimestamps:
    def body_timestamp(self, store_url: str) -> str:
        return orjson.loads(outbox(store_url)[0].body)["timestamp"]

    def test_client_clock_skew_is_corrected_with_sent_at(self, store_url: str) -> None:
        # The client's clock is 1 h ahead: it stamped the event 5 s before sending.
        ingest_batch(
            [track("m", timestamp="2026-03-01T13:00:00.000+01:00")],  # 12:00 UTC on the client's clock
            SOURCE,
            sent_at="2026-03-01T12:00:05Z",
            received_at=RECEIVED,
        )
        # Client 12:00:00, sent 12:00:05 → 5 s before receipt.
        assert self.body_timestamp(store_url) == "2026-03-01T11:59:55.000Z"

    def test_offset_without_colon_and_nine_fraction_digits(self, store_url: str) -> None:
        ingest_batch([track("m", timestamp="2026-03-01T04:00:00.123456789-0800")], SOURCE, received_at=RECEIVED)
        assert self.body_timestamp(store_url) == "2026-03-01T12:00:00.123Z"

    def test_missing_timestamp_is_received_at(self, store_url: str) -> None:
        ingest_batch([track("m")], SOURCE, sent_at="2020-01-01T00:00:00Z", received_at=RECEIVED)
        assert self.body_timestamp(store_url) == "2026-03-01T12:00:00.000Z"

    def test_historical_timestamp_without_sent_at_is_kept(self, store_url: str) -> None:
        ingest_batch([track("m", timestamp="2019-05-04T03:02:01Z")], SOURCE, received_at=RECEIVED)
        assert self.body_timestamp(store_url) == "2019-05-04T03:02:01.000Z"

    def test_original_timestamp_is_the_client_time(self, store_url: str) -> None:
        ingest_batch(
            [track("m", originalTimestamp="2026-03-01T12:00:00Z", sentAt="2026-03-01T12:01:00Z")],
            SOURCE,
            received_at=RECEIVED,
        )
        assert self.body_timestamp(store_url) == "2026-03-01T11:59:00.000Z"

    def test_bad_batch_sent_at_refuses_the_batch(self, store_url: str) -> None:
        with pytest.raises(EnvelopeError):
            ingest_batch([track("m")], SOURCE, sent_at="soon")


class TestDedupe:
    def test_same_message_id_twice_is_one_row(self, store_url: str) -> None:
        first = ingest_batch([track("m1")], SOURCE)
        second = ingest_batch([track("m1"), track("m2")], SOURCE)
        assert (first.accepted, second.accepted, second.duplicates) == (1, 1, 1)
        assert sorted(row.message_id for row in outbox(store_url) if row.destination == "crm") == ["m1", "m2"]

    def test_repeat_inside_one_batch_is_a_duplicate(self, store_url: str) -> None:
        result = ingest_batch([track("m1"), track("m1")], SOURCE)
        assert (result.accepted, result.duplicates) == (1, 1)

    def test_same_id_from_another_source_is_not_a_duplicate(self, store_url: str) -> None:
        ingest_batch([track("m1")], SOURCE)
        result = ingest_batch([track("m1")], SourceInfo(name="mobile", destinations=("crm",)))
        assert result.accepted == 1

    def test_after_the_window_the_id_is_accepted_again(self, store_url: str) -> None:
        day_ago = store_now().replace(tzinfo=timezone.utc) - timedelta(hours=24, minutes=1)
        ingest_batch([track("m1")], SOURCE, received_at=day_ago)
        again = ingest_batch([track("m1")], SOURCE)
        assert (again.accepted, again.duplicates) == (1, 0)
        with get_engine(store_url).connect() as connection:
            latest = seen_receipts(connection, SOURCE.name, ["m1", "m2"], since=store_now() - timedelta(days=2))
        assert list(latest) == ["m1"] and latest["m1"] > store_now() - timedelta(minutes=1)

    def test_inside_the_window_the_id_is_still_a_duplicate(self, store_url: str) -> None:
        hours_ago = datetime.now(timezone.utc) - timedelta(hours=23)
        ingest_batch([track("m1")], SOURCE, received_at=hours_ago)
        assert ingest_batch([track("m1")], SOURCE).duplicates == 1


def suppress(store_url: str, user_id: str, source: str) -> None:
    with get_engine(store_url).begin() as connection:
        connection.execute(
            SuppressedUser.__table__.insert(), [{"user_id": user_id, "source": source, "created_at": store_now()}]
        )


def test_suppressed_users_are_dropped_and_counted(store_url: str) -> None:
    suppress(store_url, "gone", "web")
    suppress(store_url, "everywhere", "*")
    suppress(store_url, "other-source-only", "mobile")
    batch = [
        {"type": "track", "userId": "gone", "event": "e"},
        {"type": "identify", "userId": "everywhere"},
        {"type": "alias", "previousId": "gone", "userId": "new-id"},
        {"type": "identify", "userId": "other-source-only"},
    ]
    result = ingest_batch(batch, SOURCE)
    assert (result.accepted, result.suppressed) == (1, 3)
    assert {row.user_id for row in outbox(store_url)} == {"other-source-only"}


@pytest.mark.parametrize(
    ("integrations", "routed"),
    [
        ({}, True),
        ({"All": False}, False),
        ({"All": False, "Webhooks": True}, True),
        ({"Webhooks": False}, False),
        ({"webhooks": False}, True),  # keys are case-sensitive
        ({"All": True, "Webhooks": False}, False),
        ({"Webhooks": {"option": 1}}, True),
    ],
)
def test_integrations_combinations(store_url: str, integrations: dict, routed: bool) -> None:
    result = ingest_batch([track("m", integrations=integrations)], SOURCE)
    assert result.accepted == 1
    assert result.rows_written == (2 if routed else 0)


@pytest.mark.parametrize(
    ("call", "batch_context", "routed"),
    [
        ({"context": {"integrations": {"All": False}}}, None, False),
        ({"context": {"integrations": {"Webhooks": False}}}, None, False),
        ({"context": {"integrations": {"All": False, "Webhooks": True}}}, None, True),
        ({"context": {"integrations": {"webhooks": False}}}, None, True),  # keys are case-sensitive
        # Both places: merged key by key, the context's value winning (RudderStack fills the top with All: true).
        ({"integrations": {"All": True}, "context": {"integrations": {"All": False}}}, None, False),
        ({"integrations": {"All": False}, "context": {"integrations": {"Webhooks": True}}}, None, True),
        # Batch-level context.integrations reaches every call, merged with the call's own key by key.
        ({}, {"integrations": {"All": False}}, False),
        ({"context": {"integrations": {"Webhooks": True}}}, {"integrations": {"All": False}}, True),
        ({"context": {"ip": "1.1.1.1"}}, {"integrations": {"Webhooks": False}}, False),
    ],
)
def test_context_integrations_route_like_the_top_level_object(
    store_url: str, call: dict, batch_context: dict | None, routed: bool
) -> None:
    result = ingest_batch([track("m", **call)], SOURCE, context=batch_context)
    assert (result.accepted, result.rejected) == (1, [])
    assert result.rows_written == (2 if routed else 0)


@pytest.mark.parametrize("member", ["integrations", "traits"])
def test_a_context_member_that_routes_or_completes_a_call_must_be_an_object(store_url: str, member: str) -> None:
    result = ingest_batch([track("m", context={member: "off"})], SOURCE)
    assert [(r.field, r.reason) for r in result.rejected] == [
        (f"context.{member}", f"context.{member} must be a JSON object, got str")
    ]


def test_source_without_destinations_accepts_without_rows(store_url: str) -> None:
    result = ingest_batch([track("m")], SourceInfo(name="lonely"))
    assert (result.accepted, result.rows_written) == (1, 0)
