import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefect_webhooks.messages.model import Alias, Group, Identify, MessageError, Page, Track, parse_message


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({}, "type"),
        ({"type": "bogus", "userId": "u"}, "type"),
        ({"type": "identify"}, "userId"),
        ({"type": "track", "userId": "u"}, "event"),
        ({"type": "track", "userId": "u", "event": ""}, "event"),
        ({"type": "page"}, "userId"),
        ({"type": "screen"}, "userId"),
        ({"type": "group", "userId": "u"}, "groupId"),
        ({"type": "group", "groupId": "g"}, "userId"),
        ({"type": "alias", "userId": "u"}, "previousId"),
        ({"type": "alias", "previousId": "p"}, "userId"),
        ({"type": "track", "userId": "u", "event": "E", "timestamp": "not a time"}, "timestamp"),
        ({"type": "track", "userId": "u", "event": "E", "properties": [1, 2]}, "properties"),
    ],
)
def test_each_rule_names_the_field(raw: dict, field: str) -> None:
    with pytest.raises(MessageError) as caught:
        parse_message(raw)
    assert caught.value.field == field
    assert field in str(caught.value)


def test_valid_calls_parse_into_their_models() -> None:
    assert isinstance(parse_message({"type": "identify", "anonymousId": "a"}), Identify)
    assert isinstance(parse_message({"type": "track", "userId": "u", "event": "Signed Up"}), Track)
    assert isinstance(parse_message({"type": "page", "userId": "u", "properties": {"url": "x"}}), Page)
    group = parse_message({"type": "group", "userId": "u", "groupId": 42})
    assert isinstance(group, Group) and group.group_id == "42"
    alias = parse_message({"type": "alias", "previousId": "anon", "userId": "u"})
    assert isinstance(alias, Alias)


def test_snake_case_names_work_for_python_callers_and_wire_names_come_back() -> None:
    message = Track(user_id="u", event="E", properties={"plan": "pro"}, message_id="m1")
    wire = message.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert wire["userId"] == "u" and wire["messageId"] == "m1" and wire["type"] == "track"
    assert parse_message(wire) == message


def test_identify_traits_include_context_traits_with_the_calls_own_winning() -> None:
    # RudderStack's Python SDK sends an identify's traits only in context.traits; its Node SDK in both places.
    only_context = parse_message({"type": "identify", "userId": "u", "context": {"traits": {"plan": "pro"}}})
    assert only_context.traits == {"plan": "pro"}
    both = parse_message(
        {"type": "identify", "userId": "u", "traits": {"plan": "team"}, "context": {"traits": {"plan": "pro", "a": 1}}}
    )
    assert both.traits == {"plan": "team", "a": 1}


def test_context_traits_do_not_become_group_traits() -> None:
    group = parse_message({"type": "group", "userId": "u", "groupId": "g", "context": {"traits": {"plan": "pro"}}})
    assert group.traits == {}


def test_unknown_fields_are_kept() -> None:
    message = parse_message({"type": "track", "userId": "u", "event": "E", "channel": "server"})
    assert message.model_dump(mode="json", by_alias=True, exclude_none=True)["channel"] == "server"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300)
@given(st.dictionaries(st.sampled_from(["type", "userId", "anonymousId", "event", "groupId", "previousId",
                                        "timestamp", "properties", "traits", "context", "integrations"]),
                       json_values, max_size=8))
def test_any_json_object_parses_or_raises_message_error(raw: dict) -> None:
    try:
        message = parse_message(raw)
    except MessageError as error:
        assert error.field and error.reason
        return
    json.dumps(message.model_dump(mode="json", by_alias=True, exclude_none=True))
