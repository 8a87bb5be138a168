"""Routing by the ``integrations`` object: which destinations a message may reach.

A call carries its integrations object in one of two places, or both: at the top level (``integrations``, as
Segment's HTTP API documents it and Segment's SDKs send it) and as ``context.integrations`` (as the client library
spec puts it on the wire). Both are read; ``call_integrations`` merges them key by key, and where both name the same
key the value in ``context.integrations`` wins: RudderStack's SDKs fill an empty top-level object with
``{"All": true}`` on every call, so the top level often holds a default nobody chose.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

DESTINATION_NAME = "Webhooks"


def call_integrations(integrations: Mapping[str, Any] | None, context: Mapping[str, Any] | None) -> dict[str, Any]:
    """The integrations object a call routes by: its top-level ``integrations`` merged with ``context.integrations``.

    Args:
        integrations: The call's top-level ``integrations`` (batch-level values already merged in).
        context: The call's ``context``; its ``integrations`` member, when it is an object, wins key by key.
    """
    nested = context.get("integrations") if context else None
    if not isinstance(nested, Mapping) or not nested:
        return dict(integrations or {})
    return {**(integrations or {}), **nested}


def destination_allowed(integrations: Mapping[str, Any] | None, name: str = DESTINATION_NAME) -> bool:
    """Whether ``integrations`` lets a message reach the destination called ``name``.

    Keys are case-sensitive. Destinations are on by default; ``{"All": false}`` turns every destination off
    unless its own key is ``true``. A non-boolean value (an options object) counts as on.
    """
    if not integrations:
        return True
    if name in integrations:
        return integrations[name] is not False
    return integrations.get("All", True) is not False


def route(
    integrations: Mapping[str, Any] | None, enabled_destinations: Iterable[str], name: str = DESTINATION_NAME
) -> list[str]:
    """The destination blocks (of the source) that receive a message with these ``integrations``."""
    if not destination_allowed(integrations, name):
        return []
    return list(enabled_destinations)
