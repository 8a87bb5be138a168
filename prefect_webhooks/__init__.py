"""prefect-webhooks: a customer-data-platform webhook destination on Prefect."""

from prefect_webhooks.blocks import Source, WebhookDestination
from prefect_webhooks.client import Analytics, AnalyticsError
from prefect_webhooks.messages import Alias, Group, Identify, Page, Screen, Track

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
