"""What one call becomes: a complete wire-form message, validated with the shared models and serialised once.

Every call is checked when it is made, with the same message models the ingest API uses, so an invalid call raises
``AnalyticsError`` naming the keyword argument at fault and nothing is queued.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import orjson

from prefect_webhooks.client.errors import AnalyticsError
from prefect_webhooks.client.message_ids import new_message_id
from prefect_webhooks.messages.model import MAX_MESSAGE_BYTES, MessageError, parse_message
from prefect_webhooks.messages.timestamps import TimestampError, format_timestamp, parse_timestamp

try:
    VERSION = version("prefect-webhooks")
except PackageNotFoundError:  # running from a source tree that was not installed
    VERSION = "0.1.0"

LIBRARY = {"name": "prefect-webhooks", "version": VERSION}
ID_FIELDS = ("userId", "anonymousId", "groupId", "previousId", "messageId")


def wire_call(message_type: str, **fields: Any) -> dict[str, Any]:
    """A wire-form dict (camelCase keys) from a call's arguments, leaving out those not given."""
    raw: dict[str, Any] = {"type": message_type}
    for name, value in fields.items():
        if value is not None:
            raw[name] = value
    return raw


def encode_call(raw: dict[str, Any]) -> bytes:
    """Complete one call in wire form (messageId, timestamp, context.library), validate it and serialise it.

    Args:
        raw: The call as a wire-form dict (camelCase keys); it is modified in place.

    Returns:
        The message's JSON bytes, at most ``MAX_MESSAGE_BYTES``.

    Raises:
        AnalyticsError: naming the field at fault; nothing is queued.
    """
    raw["messageId"] = raw.get("messageId") or new_message_id()
    event_time = _event_time(raw)
    # The models take the datetime as is; parsing the string form again would double the cost of a call.
    raw["timestamp"] = event_time
    _add_library(raw)
    try:
        message = parse_message(raw)
    except MessageError as exc:
        raise AnalyticsError(_snake(exc.field), exc.reason) from None
    raw["timestamp"] = format_timestamp(event_time)
    for key in ID_FIELDS:
        # The models accept numeric ids; send them as the strings the models hold.
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raw[key] = getattr(message, _snake(key))
    try:
        data = orjson.dumps(raw)
    except TypeError:
        field, reason = _find_unserialisable(raw, "message")
        raise AnalyticsError(_snake(field.removeprefix("message.")), reason) from None
    if len(data) > MAX_MESSAGE_BYTES:
        raise AnalyticsError("message", f"{len(data)} bytes serialised, over the {MAX_MESSAGE_BYTES}-byte limit")
    return data


def _event_time(raw: dict[str, Any]) -> datetime:
    """The call's time as an aware UTC datetime: the caller's (historical import) or now."""
    timestamp = raw.get("timestamp")
    if timestamp is None:
        return datetime.now(timezone.utc)
    try:
        return parse_timestamp(timestamp)
    except TimestampError as exc:
        raise AnalyticsError("timestamp", str(exc)) from None


def _add_library(raw: dict[str, Any]) -> None:
    context = raw.get("context")
    if context is None:
        context = {}
    elif not isinstance(context, Mapping):
        raise AnalyticsError("context", f"must be a dict, got {type(context).__name__}")
    raw["context"] = {**context, "library": LIBRARY}


def _snake(name: str) -> str:
    return "".join(f"_{char.lower()}" if char.isupper() else char for char in name)


def _find_unserialisable(value: Any, path: str) -> tuple[str, str]:
    """The dotted path and type name of the first value orjson cannot encode."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return path, f"has a key of type {type(key).__name__}; JSON keys must be strings"
            try:
                orjson.dumps(item)
            except TypeError:
                return _find_unserialisable(item, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            try:
                orjson.dumps(item)
            except TypeError:
                return _find_unserialisable(item, f"{path}[{index}]")
    return path, f"a value of type {type(value).__name__} cannot be serialised to JSON"
