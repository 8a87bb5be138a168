"""Destination filters: rule validation, evaluation on outbound bodies, and a mixed stream delivered through the
outbox and the delivery engine to a real receiver, with the rules in a block saved on the test Prefect server."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.blocks.filter_rules import FilterRule
from prefect_webhooks.delivery import deliver_due
from prefect_webhooks.delivery.sending.filters import compile_filters, split_filtered
from prefect_webhooks.messages.model import parse_message
from prefect_webhooks.messages.outcomes import DELIVERED, FILTERED
from prefect_webhooks.messages.payloads import delete_payload, outbound_payload, serialize
from prefect_webhooks.store.figures.metrics import backlog_snapshot
from prefect_webhooks.store.queue.outbox import enqueue
from tests.receivers import Receiver
from tests.stored import every_attempt, every_message

WHEN = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.timezone.utc)


def outbound(raw: dict[str, Any]) -> dict[str, Any]:
    return outbound_payload(parse_message(raw), WHEN)


def reason(rules: list[dict[str, Any]], payload: dict[str, Any]) -> str | None:
    filters = compile_filters([FilterRule.model_validate(rule) for rule in rules])
    assert filters is not None
    return filters.reason(serialize(payload))


ORDER = outbound({"type": "track", "userId": "u1", "event": "Order Completed",
                  "properties": {"plan": "pro", "total": 10, "internal": False}})
PING = outbound({"type": "track", "userId": "u1", "event": "Debug Ping", "properties": {}})
IDENTIFY = outbound({"type": "identify", "userId": "u1", "traits": {"email": "ada@example.com", "age": 36}})
SCREEN = outbound({"type": "screen", "userId": "u1", "name": "Home",
                   "context": {"os": {"name": "iOS", "version": "17"}}})
ALIAS = outbound({"type": "alias", "previousId": "anon-1", "userId": "u1"})


def test_a_drop_rule_filters_what_it_matches_and_names_itself() -> None:
    rules = [{"name": "no-debug", "action": "drop", "events": ["Debug Ping"]}]
    assert reason(rules, PING) == "filtered: drop rule 'no-debug'"
    assert reason(rules, ORDER) is None
    assert reason(rules, IDENTIFY) is None


def test_an_allow_rule_filters_what_it_does_not_match() -> None:
    rules = [{"action": "allow", "types": ["track"]}]
    assert reason(rules, ORDER) is None
    assert reason(rules, IDENTIFY) == "filtered: allow rule #1 not matched"


def test_several_allow_rules_must_all_match_and_any_combines_alternatives() -> None:
    both = [{"action": "allow", "types": ["track"]}, {"action": "allow", "events": ["Order Completed"]}]
    assert reason(both, ORDER) is None
    assert reason(both, PING) == "filtered: allow rule #2 not matched"
    either = [{"action": "allow", "match": "any", "types": ["identify"], "events": ["Order Completed"]}]
    assert reason(either, ORDER) is None and reason(either, IDENTIFY) is None
    assert reason(either, PING) is not None and reason(either, SCREEN) is not None


def test_rules_are_checked_in_order_and_the_first_that_filters_is_named() -> None:
    rules = [{"name": "a", "action": "drop", "types": ["track"]},
             {"name": "b", "action": "drop", "events": ["Debug Ping"]}]
    assert reason(rules, PING) == "filtered: drop rule 'a'"


@pytest.mark.parametrize(
    ("condition", "payload", "matches"),
    [
        ({"field": "properties.plan", "equals": "pro"}, ORDER, True),
        ({"field": "properties.plan", "equals": "Pro"}, ORDER, False),  # case-sensitive
        ({"field": "properties.plan", "in": ["team", "pro"]}, ORDER, True),
        ({"field": "properties.total", "equals": 10.0}, ORDER, True),  # 10 == 10.0
        ({"field": "properties.total", "equals": "10"}, ORDER, False),  # a string is not a number
        ({"field": "properties.internal", "equals": False}, ORDER, True),
        ({"field": "properties.internal", "equals": 0}, ORDER, False),  # false is not 0
        ({"field": "properties.internal", "in": [0, "false"]}, ORDER, False),
        ({"field": "properties.missing", "equals": "x"}, ORDER, False),
        ({"field": "properties.plan.tier", "equals": "x"}, ORDER, False),  # through a string
        ({"field": "traits.email", "exists": True}, IDENTIFY, True),
        ({"field": "traits.email", "exists": False}, IDENTIFY, False),
        ({"field": "traits.phone", "exists": False}, IDENTIFY, True),
        ({"field": "traits", "exists": True}, ORDER, False),  # a track body has no traits
        ({"field": "context.os.name", "equals": "iOS"}, SCREEN, True),
        ({"field": "name", "in": ["Home", "Settings"]}, SCREEN, True),
        ({"field": "Previous ID", "equals": "anon-1"}, ALIAS, True),
        ({"field": "userId", "equals": "u1"}, ORDER, True),
    ],
)
def test_conditions_address_fields_of_the_outbound_body(
    condition: dict[str, Any], payload: dict[str, Any], matches: bool
) -> None:
    rules = [{"action": "drop", "conditions": [condition]}]
    assert (reason(rules, payload) is not None) is matches


def test_exists_treats_null_as_absent() -> None:
    payload = outbound({"type": "identify", "userId": "u1", "traits": {"email": None}})
    assert reason([{"action": "drop", "conditions": [{"field": "traits.email", "exists": False}]}], payload)


def test_delete_messages_are_never_filtered() -> None:
    assert reason([{"action": "allow", "types": ["track"]}], delete_payload("u1", WHEN)) is None


def test_no_rules_compile_to_nothing_and_split_passes_everything() -> None:
    assert compile_filters([]) is None
    send, dropped = split_filtered([b"{}", b"[]"], lambda body: body, lambda body: None)
    assert send == [b"{}", b"[]"] and dropped == []


def refused(*rules: dict[str, Any]) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        WebhookDestination(endpoints=[{"url": "https://hooks.example.com/in"}], filters=list(rules))
    return caught.value


@pytest.mark.parametrize(
    ("rule", "says"),
    [
        ({"name": "typo", "action": "drop", "conditions": [{"field": "propertes.plan", "equals": "pro"}]},
         "rule 'typo': condition on field 'propertes.plan': unknown field 'propertes'"),
        ({"name": "two", "action": "drop", "conditions": [{"field": "properties.plan", "equals": "a", "exists": True}]},
         "rule 'two': condition on field 'properties.plan': give exactly one of equals, in, exists (got 2)"),
        ({"name": "none", "action": "drop", "conditions": [{"field": "properties.plan"}]},
         "give exactly one of equals, in, exists (got 0)"),
        ({"name": "deep", "action": "drop", "conditions": [{"field": "event.name", "equals": "x"}]},
         "condition on field 'event.name': event is not an object"),
        ({"name": "whole", "action": "drop", "conditions": [{"field": "traits", "equals": "x"}]},
         "traits is an object: test a field inside it"),
        ({"name": "hole", "action": "drop", "conditions": [{"field": "properties..plan", "exists": True}]},
         "empty name in the dotted path"),
        ({"name": "empty-in", "action": "drop", "conditions": [{"field": "properties.plan", "in": []}]},
         "in needs at least one value"),
        ({"name": "all", "action": "drop"}, "rule 'all': give types, events or conditions"),
        ({"action": "allow", "types": []}, "rule (unnamed): types is empty"),
        ({"action": "allow", "events": []}, "rule (unnamed): events is empty"),
    ],
)
def test_a_bad_rule_is_refused_naming_the_rule_and_field(rule: dict[str, Any], says: str) -> None:
    error = refused({"action": "drop", "types": ["page"]}, rule)
    assert error.errors()[0]["loc"][:2] == ("filters", 1)
    assert says in str(error)


def test_an_unknown_type_action_or_key_is_refused_with_its_location() -> None:
    assert refused({"action": "drop", "types": ["trak"]}).errors()[0]["loc"] == ("filters", 0, "types", 0)
    assert refused({"action": "keep", "types": ["track"]}).errors()[0]["loc"] == ("filters", 0, "action")
    assert refused({"action": "drop", "type": ["track"]}).errors()[0]["loc"] == ("filters", 0, "type")
    error = refused({"action": "drop", "conditions": [{"field": "properties.a", "equals": {"nested": 1}}]})
    assert error.errors()[0]["loc"][:4] == ("filters", 0, "conditions", 0)


def test_two_rules_with_one_name_are_refused() -> None:
    error = refused({"name": "x", "action": "drop", "types": ["page"]},
                    {"name": "x", "action": "drop", "types": ["alias"]})
    assert "two rules are named 'x'" in str(error)


# -- Through the outbox and the delivery engine ------------------------------------------------------------------


MIXED = [
    ({"type": "track", "userId": "u1", "event": "Order Completed", "properties": {"plan": "pro"}}, True),
    ({"type": "track", "userId": "u2", "event": "Order Completed", "properties": {"plan": "free"}}, False),
    ({"type": "track", "userId": "u3", "event": "Debug Ping", "properties": {"plan": "pro"}}, False),
    ({"type": "track", "userId": "u4", "event": "Order Completed", "properties": {"plan": "team", "internal": True}},
     False),
    ({"type": "identify", "userId": "u5", "traits": {"email": "a@example.com"}}, True),
    ({"type": "page", "userId": "u6", "name": "Home", "properties": {"path": "/"}}, True),
    ({"type": "screen", "userId": "u7", "name": "Home", "context": {"os": {"name": "iOS"}}}, True),
    ({"type": "group", "userId": "u8", "groupId": "g1", "traits": {}}, True),
    ({"type": "alias", "previousId": "anon-9", "userId": "u9"}, True),
    ({"type": "track", "userId": "u10", "event": "Signed Up", "properties": {"plan": "team"}}, True),
]
RULES = [
    {"name": "no-debug", "action": "drop", "events": ["Debug Ping"]},
    {"name": "no-internal", "action": "drop", "conditions": [{"field": "properties.internal", "equals": True}]},
    {"name": "paid-tracks", "action": "allow", "match": "any",
     "types": ["identify", "page", "screen", "group", "alias"],
     "conditions": [{"field": "properties.plan", "in": ["pro", "team"]}]},
]


def who(body: dict[str, Any]) -> str:
    return body.get("userId") or body["User ID"]


@pytest.mark.usefixtures("prefect_harness")
async def test_a_mixed_stream_reaches_the_endpoint_only_where_the_rules_let_it(store_url: str) -> None:
    name, plain = f"filtered-{uuid.uuid4().hex[:8]}", f"plain-{uuid.uuid4().hex[:8]}"
    with Receiver() as receiver, Receiver() as other:
        await WebhookDestination(endpoints=[{"url": receiver.url}], filters=RULES).save(name)
        await WebhookDestination(endpoints=[{"url": other.url}]).save(plain)
        payloads = [outbound(raw) for raw, _ in MIXED] + [delete_payload("u11", WHEN)]
        enqueue(name, payloads)
        # The same stream to a destination without rules, claimed in the same batches: all of it arrives.
        enqueue(plain, payloads)
        stats = await deliver_due()
        expected = [payload for payload, (_, sent) in zip(payloads, [*MIXED, (None, True)], strict=True) if sent]
        received = sorted((orjson.loads(request.body) for request in receiver.requests), key=who)
        assert received == sorted(expected, key=who)
        assert len(other.requests) == len(payloads)
    assert (stats.delivered, stats.filtered) == (len(expected) + len(payloads), 3)
    assert stats.filtered_by_rule == {
        (name, "filtered: drop rule 'no-debug'"): 1,
        (name, "filtered: drop rule 'no-internal'"): 1,
        (name, "filtered: allow rule 'paid-tracks' not matched"): 1,
    }
    rows = {row.user_id: row for row in every_message(destination=name)}
    attempted = {attempt.outbox_id for attempt in every_attempt()}
    assert (rows["u2"].state, rows["u2"].reason) == (FILTERED, "filtered: allow rule 'paid-tracks' not matched")
    assert (rows["u3"].state, rows["u3"].reason) == (FILTERED, "filtered: drop rule 'no-debug'")
    assert (rows["u4"].state, rows["u4"].reason) == (FILTERED, "filtered: drop rule 'no-internal'")
    assert rows["u11"].state == DELIVERED  # the delete notification
    filtered_ids = {row.id for row in rows.values() if row.state == FILTERED}
    assert len(filtered_ids) == 3 and not filtered_ids & attempted
    assert all(row.lease_owner is None for row in rows.values())
    figures = backlog_snapshot()["destinations"]
    assert (figures[name]["filtered"], figures[name]["delivered"], figures[name]["pending"]) == (3, 8, 0)
    assert figures[plain]["filtered"] == 0


@pytest.mark.usefixtures("prefect_harness")
async def test_the_current_rules_apply_to_what_is_pending(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_WEBHOOKS_BLOCK_CACHE_SECONDS", "0")
    name = f"edited-{uuid.uuid4().hex[:8]}"
    with Receiver() as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url}]).save(name)
        enqueue(name, [outbound(MIXED[2][0])])  # a Debug Ping, queued before any rule exists
        await WebhookDestination(endpoints=[{"url": receiver.url}],
                                 filters=[RULES[0]]).save(name, overwrite=True)
        stats = await deliver_due()
    assert stats.filtered == 1 and receiver.requests == []
