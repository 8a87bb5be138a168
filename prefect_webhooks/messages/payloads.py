"""Outbound messages: the JSON bodies sent to webhook endpoints, exactly as the destination specifies them.

Every body is serialised once, here; the signature and the request use those same bytes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from prefect_webhooks.messages.model import Alias, BaseMessage, Group, Identify, Page, Screen, Track
from prefect_webhooks.messages.timestamps import format_timestamp

PAGE_PROPERTIES = ("path", "referrer", "title", "url")
SCREEN_CONTEXT = {"device": ("model", "type"), "os": ("name", "version"), "app": ("build", "name", "version")}


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def _common(message: BaseMessage, timestamp: datetime) -> dict[str, Any]:
    payload: dict[str, Any] = {"version": 1, "type": message.type, "userId": message.user_id}
    if message.user_id is None and message.anonymous_id is not None:
        # The destination's shape has only userId; an anonymous call still needs to say who it is about.
        payload["anonymousId"] = message.anonymous_id
    payload["timestamp"] = format_timestamp(timestamp)
    return payload


def page_properties(message: Page) -> dict[str, Any]:
    """The page's properties: the four recognised keys first (from properties, traits or context.page), then the
    other properties, then the call's ``name`` and ``category`` unless the properties already hold them.

    SDKs differ in where a page's name and category go (Segment's Node SDK copies the category into properties,
    RudderStack's browser SDK both, the Python SDKs neither); the receiver gets them in one place whichever sent it.
    """
    page_context = message.context.get("page") if isinstance(message.context.get("page"), dict) else {}
    recognised = {}
    for key in PAGE_PROPERTIES:
        value = message.properties.get(key, message.traits.get(key, page_context.get(key)))
        recognised[key] = _as_text(value)
    extra = {key: value for key, value in message.properties.items() if key not in recognised}
    for key, value in (("name", message.name), ("category", message.category)):
        if value is not None and key not in extra:
            extra[key] = value
    return {**recognised, **extra}


def screen_context(context: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The screen's context reduced to device, os and app, each field a string."""
    shaped: dict[str, dict[str, str]] = {}
    for section, keys in SCREEN_CONTEXT.items():
        source = context.get(section) if isinstance(context.get(section), dict) else {}
        shaped[section] = {key: _as_text(source.get(key)) for key in keys}
    return shaped


def outbound_payload(message: BaseMessage, timestamp: datetime) -> dict[str, Any]:
    """Build the outbound message for an inbound call.

    Args:
        message: A validated call (``Identify``, ``Track``, ``Page``, ``Screen``, ``Group`` or ``Alias``).
        timestamp: The call's corrected event time (see ``ingest``), written in UTC with milliseconds.
    """
    if isinstance(message, Alias):
        return {
            "version": 1,
            "type": "alias",
            "Previous ID": message.previous_id,
            "User ID": message.user_id,
            "timestamp": format_timestamp(timestamp),
        }
    payload = _common(message, timestamp)
    if isinstance(message, Page):
        payload["properties"] = page_properties(message)
    elif isinstance(message, Screen):
        payload["name"] = _as_text(message.name)
        payload["context"] = screen_context(message.context)
    elif isinstance(message, Identify):
        payload["traits"] = message.traits
    elif isinstance(message, Track):
        payload["event"] = message.event
        payload["properties"] = message.properties
    elif isinstance(message, Group):
        payload["groupId"] = message.group_id
        payload["traits"] = message.traits
    else:
        raise TypeError(f"no outbound shape for {type(message).__name__}")
    return payload


def identify_payload(user_id: str, traits: dict[str, Any], timestamp: datetime) -> dict[str, Any]:
    """An ``identify`` outbound message built directly (audience and computed-trait syncs)."""
    return {"version": 1, "type": "identify", "userId": user_id, "timestamp": format_timestamp(timestamp),
            "traits": traits}


def delete_payload(user_id: str, timestamp: datetime) -> dict[str, Any]:
    """A ``delete`` outbound message: only type, userId and timestamp, and no version."""
    return {"type": "delete", "userId": user_id, "timestamp": format_timestamp(timestamp)}


def serialize(payload: dict[str, Any]) -> bytes:
    """The exact UTF-8 body bytes sent and signed (compact JSON, key order kept)."""
    return orjson.dumps(payload)
