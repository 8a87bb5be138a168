"""prefect-webhooks: a customer-data-platform webhook destination on Prefect."""

from prefect_webhooks.blocks import Source, WebhookDestination

__all__ = ["Source", "WebhookDestination"]
