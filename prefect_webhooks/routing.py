"""Routing by the ``integrations`` object: which destinations a message may reach."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

DESTINATION_NAME = "Webhooks"


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
