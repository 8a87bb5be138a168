"""Property-based fuzzing of the message model and of batch preparation (no server, no store).

Whatever a caller sends — wrong types in every field, huge integers, NaN and infinities, deep nesting, extreme
dates, non-string keys — ``parse_message`` either returns a model or raises ``MessageError`` naming a field, and
``prepare_batch`` (shared by the API and the bulk-ingest flow) either prepares a call or rejects it with a reason;
neither ever raises anything else.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefect_webhooks.inbound.envelope import EnvelopeError
from prefect_webhooks.inbound.ingestion import PreparedBatch, prepare_batch
from prefect_webhooks.inbound.sources import SourceInfo
from prefect_webhooks.messages.model import MAX_MESSAGE_BYTES, MessageError, parse_message

SOURCE = SourceInfo(name="fuzz", destinations=("crm", "ads"))

# A valid call of each type; the fuzzers break one field at a time.
VALID: dict[str, dict[str, Any]] = {
    "identify": {"type": "identify", "userId": "u1", "traits": {"plan": "pro"}},
    "track": {"type": "track", "userId": "u1", "event": "Signed Up", "properties": {"n": 1}},
    "page": {"type": "page", "anonymousId": "a1", "name": "Home", "properties": {"url": "https://x.test/"}},
    "screen": {"type": "screen", "userId": "u1", "name": "Settings", "category": "app"},
    "group": {"type": "group", "userId": "u1", "groupId": "g1", "traits": {"name": "Acme"}},
    "alias": {"type": "alias", "userId": "u1", "previousId": "anon-1"},
}
FIELDS = sorted(
    {"userId", "anonymousId", "messageId", "timestamp", "originalTimestamp", "sentAt", "context", "integrations",
     "traits", "event", "properties", "name", "category", "groupId", "previousId", "type"}
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([10**400, -(10**400), 2**64, -(2**63) - 1])
    | st.floats()  # NaN and ±inf included
    | st.text(max_size=30)
    | st.sampled_from(["", " ", "\x00", "\ud800", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "NaN"])
)
json_like = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4)
    # Python callers of the bulk-ingest flow can hand over dicts whose keys are not strings.
    | st.dictionaries(st.integers() | st.none() | st.booleans(), children, max_size=2),
    max_leaves=15,
)
timestamps = st.one_of(
    st.datetimes().map(lambda value: value.isoformat() + "Z"),
    st.sampled_from(["9999-12-31T23:59:59.999Z", "0001-01-01T00:00:00Z", "2026-02-30T00:00:00Z", "yesterday",
                     "0001-01-01T00:00:00+00:01", "9999-12-31T23:59:59-23:59", "0001-01-01 00:00-0001"]),
    st.builds(lambda moment, hours, minutes: f"{moment.isoformat()}{hours:+03d}:{minutes:02d}",
              st.datetimes(), st.integers(-23, 23), st.integers(0, 59)),
    scalars,
)


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


def check_prepared(batch: PreparedBatch, count: int) -> None:
    """Every call is either prepared (with a serialisable body) or rejected with a reason."""
    assert len(batch.messages) + len(batch.rejected) == count
    for rejection in batch.rejected:
        assert rejection.field and rejection.reason
    for message in batch.messages:
        for row in message.rows:
            assert isinstance(row["body"], (bytes, str))
            assert {row["destination"] for row in message.rows} <= set(SOURCE.destinations)


def prepare_or_envelope_error(calls: list[Any], **batch_fields: Any) -> PreparedBatch | None:
    try:
        return prepare_batch(calls, SOURCE, oversize="reject", **batch_fields)
    except EnvelopeError as error:
        assert error.code and error.message
        return None


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(VALID)), st.sampled_from(FIELDS), json_like)
def test_a_wrong_value_in_any_field_is_parsed_or_named(call_type: str, field: str, value: Any) -> None:
    raw = {**VALID[call_type], field: value}
    try:
        message = parse_message(raw)
    except MessageError as error:
        assert error.field and error.reason
        return
    assert message.type == call_type


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(VALID)), st.sampled_from(FIELDS), json_like)
def test_prepare_batch_never_crashes_on_a_wrong_value(call_type: str, field: str, value: Any) -> None:
    batch = prepare_or_envelope_error([{**VALID[call_type], field: value}])
    if batch is not None:
        check_prepared(batch, 1)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(timestamps, timestamps, timestamps)
def test_extreme_times_and_client_clocks_never_crash(timestamp: Any, original: Any, sent_at: Any) -> None:
    raw = {**VALID["track"], "timestamp": timestamp, "originalTimestamp": original}
    batch = prepare_or_envelope_error([raw], sent_at=sent_at)
    if batch is not None:
        check_prepared(batch, 1)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(json_like, max_size=6), json_like, json_like)
def test_any_batch_and_batch_level_fields_never_crash(calls: list[Any], context: Any, integrations: Any) -> None:
    batch_fields = {
        "context": context if isinstance(context, dict) else None,
        "integrations": integrations if isinstance(integrations, dict) else None,
    }
    batch = prepare_or_envelope_error(calls, **batch_fields)
    if batch is not None:
        check_prepared(batch, len(calls))


@pytest.mark.parametrize(
    "value",
    [10**400, -(10**400), 2**64, float("nan"), float("inf"), -float("inf"), {1: "non-string key"}, {None: 1}],
    ids=["huge", "huge-negative", "u64-overflow", "nan", "inf", "-inf", "int-key", "none-key"],
)
@pytest.mark.parametrize("field", ["properties", "userId", "context", "timestamp"])
def test_values_json_cannot_carry_are_rejected_or_serialised(field: str, value: Any) -> None:
    wrapped = {"n": value} if field in ("properties", "context") else value
    batch = prepare_batch([{**VALID["track"], field: wrapped}], SOURCE, oversize="reject")
    check_prepared(batch, 1)
    for message in batch.messages:
        body = message.rows[0]["body"]
        text = body.decode() if isinstance(body, bytes) else body
        # JSON has no NaN/Infinity: the outbound body must stay valid JSON for receivers.
        assert "NaN" not in text and "Infinity" not in text


@pytest.mark.parametrize("value", ["0001-01-01T00:00:00+00:01", "9999-12-31T23:59:59-00:01"])
@pytest.mark.parametrize("field", ["timestamp", "originalTimestamp", "sentAt"])
def test_a_time_outside_the_range_once_in_utc_is_a_rejection(field: str, value: str) -> None:
    batch = prepare_batch([{**VALID["track"], field: value}], SOURCE)
    assert batch.messages == [] and batch.rejected[0].field == field


def test_deep_nesting_is_parsed_or_rejected_never_a_recursion_crash() -> None:
    for depth in (100, 1_000, 10_000):
        batch = prepare_batch([{**VALID["track"], "properties": nested(depth)}], SOURCE, oversize="reject")
        check_prepared(batch, 1)


def test_a_call_over_32_kb_is_rejected_with_its_size() -> None:
    raw = {**VALID["track"], "properties": {"blob": "x" * MAX_MESSAGE_BYTES}}
    batch = prepare_batch([raw], SOURCE, oversize="reject")
    assert batch.messages == [] and "limit" in batch.rejected[0].reason
    with pytest.raises(EnvelopeError) as caught:
        prepare_batch([raw], SOURCE)
    assert caught.value.code == "message_too_large"
