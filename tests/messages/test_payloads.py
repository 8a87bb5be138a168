"""Outbound bodies: exactly the destination's shapes, serialised once."""

from __future__ import annotations

import datetime as dt

import orjson
import pytest

from prefect_webhooks.messages.model import parse_message
from prefect_webhooks.messages.payloads import delete_payload, identify_payload, outbound_payload, serialize

WHEN = dt.datetime(2026, 3, 4, 5, 6, 7, 987654, tzinfo=dt.timezone.utc)
WIRE_TIME = "2026-03-04T05:06:07.987Z"


def build(raw: dict) -> dict:
    return outbound_payload(parse_message(raw), WHEN)


def test_page_has_the_four_properties_as_strings() -> None:
    payload = build({"type": "page", "userId": "u", "properties": {"url": "https://ex.com/a", "title": "A"},
                     "context": {"page": {"path": "/a", "referrer": "https://r/"}}})
    assert payload == {"version": 1, "type": "page", "userId": "u", "timestamp": WIRE_TIME,
                       "properties": {"path": "/a", "referrer": "https://r/", "title": "A", "url": "https://ex.com/a"}}


def test_page_name_and_category_follow_in_properties_unless_the_properties_hold_them() -> None:
    # Segment's Node SDK copies the category into properties and the Python SDKs do not: one shape for both.
    plain = build({"type": "page", "userId": "u", "name": "Intro", "category": "Docs", "properties": {"tab": 1}})
    assert plain["properties"] == {"path": "", "referrer": "", "title": "", "url": "", "tab": 1, "name": "Intro",
                                   "category": "Docs"}
    copied = build({"type": "page", "userId": "u", "name": "Intro", "category": "Docs",
                    "properties": {"category": "Docs"}})
    assert copied["properties"] == {"path": "", "referrer": "", "title": "", "url": "", "category": "Docs",
                                    "name": "Intro"}


def test_screen_has_name_and_only_device_os_app_context() -> None:
    payload = build({"type": "screen", "userId": "u", "name": "Home",
                     "context": {"ip": "1.2.3.4", "device": {"model": "Pixel 8", "type": "android", "id": "d"},
                                 "os": {"name": "Android", "version": 14}, "app": {"build": 7, "name": "A"}}})
    assert payload == {"version": 1, "type": "screen", "userId": "u", "timestamp": WIRE_TIME, "name": "Home",
                       "context": {"device": {"model": "Pixel 8", "type": "android"},
                                   "os": {"name": "Android", "version": "14"},
                                   "app": {"build": "7", "name": "A", "version": ""}}}


def test_identify_track_group_alias_shapes() -> None:
    assert build({"type": "identify", "userId": "u", "traits": {"plan": "pro", "seats": 3}}) == {
        "version": 1, "type": "identify", "userId": "u", "timestamp": WIRE_TIME, "traits": {"plan": "pro", "seats": 3}}
    assert build({"type": "track", "userId": "u", "event": "Signed Up", "properties": {"v": 1.5}}) == {
        "version": 1, "type": "track", "userId": "u", "timestamp": WIRE_TIME, "event": "Signed Up",
        "properties": {"v": 1.5}}
    assert build({"type": "group", "userId": "u", "groupId": "g", "traits": {"n": 1}}) == {
        "version": 1, "type": "group", "userId": "u", "timestamp": WIRE_TIME, "groupId": "g", "traits": {"n": 1}}
    alias = build({"type": "alias", "previousId": "old", "userId": "new"})
    assert alias == {"version": 1, "type": "alias", "Previous ID": "old", "User ID": "new", "timestamp": WIRE_TIME}
    assert "userId" not in alias


def test_delete_has_no_version() -> None:
    assert delete_payload("u", WHEN) == {"type": "delete", "userId": "u", "timestamp": WIRE_TIME}


def test_identify_payload_for_audiences() -> None:
    assert identify_payload("u", {"vip_customers": True}, WHEN) == {
        "version": 1, "type": "identify", "userId": "u", "timestamp": WIRE_TIME, "traits": {"vip_customers": True}}


@pytest.mark.parametrize(
    ("moment", "wire"),
    [
        (dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), "2026-01-01T00:00:00.000Z"),
        (dt.datetime(2026, 1, 1, 1, 0, 0, 999999, tzinfo=dt.timezone(dt.timedelta(hours=2))),
         "2025-12-31T23:00:00.999Z"),
        (dt.datetime(2026, 1, 1, 0, 0, 0, 1000), "2026-01-01T00:00:00.001Z"),
    ],
)
def test_timestamp_is_utc_milliseconds_with_z(moment: dt.datetime, wire: str) -> None:
    assert delete_payload("u", moment)["timestamp"] == wire


def test_serialize_is_compact_utf8_in_key_order() -> None:
    payload = {"version": 1, "type": "track", "userId": "ü", "event": "Café ☕", "properties": {"b": 1, "a": 2}}
    body = serialize(payload)
    assert body == '{"version":1,"type":"track","userId":"ü","event":"Café ☕","properties":{"b":1,"a":2}}'.encode()
    assert orjson.loads(body) == payload
