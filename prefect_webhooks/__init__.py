"""prefect-webhooks: a customer-data-platform webhook destination on Prefect.

Names are imported on first use (PEP 562), so ``from prefect_webhooks import Analytics`` does not load Prefect:
an application that only sends events pays for the client alone.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefect_webhooks.blocks import Source, WebhookDestination
    from prefect_webhooks.client import Analytics, AnalyticsError
    from prefect_webhooks.messages import Alias, Group, Identify, Page, Screen, Track

_EXPORTS = {
    "Alias": "prefect_webhooks.messages",
    "Analytics": "prefect_webhooks.client",
    "AnalyticsError": "prefect_webhooks.client",
    "Group": "prefect_webhooks.messages",
    "Identify": "prefect_webhooks.messages",
    "Page": "prefect_webhooks.messages",
    "Screen": "prefect_webhooks.messages",
    "Source": "prefect_webhooks.blocks",
    "Track": "prefect_webhooks.messages",
    "WebhookDestination": "prefect_webhooks.blocks",
}

__all__ = [
    "Alias",
    "Analytics",
    "AnalyticsError",
    "Group",
    "Identify",
    "Page",
    "Screen",
    "Source",
    "Track",
    "WebhookDestination",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'prefect_webhooks' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
