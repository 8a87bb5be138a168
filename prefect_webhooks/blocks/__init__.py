"""What users save: the Prefect blocks that configure the data flow. A ``Source`` holds a write key and the
destinations enabled on it; a ``WebhookDestination`` holds one to five ``WebhookEndpoint``s (URL, static headers,
method, mapping, and a ``BearerToken``, ``OAuth2ClientCredentials`` or ``ClientCertificate`` from ``endpoint_auth``),
an optional shared secret (rotated with no downtime, ``rotation``) and filter rules (``filter_rules``). Every field
is checked when a block is built. Inbound reads the sources, delivery the destinations; ``saved`` loads and saves
blocks from async code on every supported Prefect release. Prefect registers the blocks from this package (the
``prefect.collections`` entry point).
"""

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.blocks.endpoint import WebhookEndpoint
from prefect_webhooks.blocks.endpoint_auth import BearerToken, ClientCertificate, OAuth2ClientCredentials
from prefect_webhooks.blocks.filter_rules import Condition, FilterRule
from prefect_webhooks.blocks.source import Source

__all__ = [
    "BearerToken",
    "ClientCertificate",
    "Condition",
    "FilterRule",
    "OAuth2ClientCredentials",
    "Source",
    "WebhookDestination",
    "WebhookEndpoint",
]
