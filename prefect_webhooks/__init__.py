"""prefect-webhooks: a customer-data-platform webhook destination on Prefect.

The package has one folder per stage of the data flow, each importing only from the stages below it:

- ``messages``: the vocabulary every stage shares (inbound call model, timestamps, outbound bodies, outcomes, retry);
- ``signing``: signatures and the headers that carry them;
- ``blocks``: what users save (sources, destinations, endpoints, filter rules);
- ``store``: the queue, the message log, the dedupe and what they stand on, one folder per mechanism;
- ``client`` (the Analytics client), ``inbound`` (the ingest API and ingestion path), ``delivery`` (the engine:
  sending, endpoints, pacing, batches),
  ``audiences`` and ``deletions``: the stages that put messages into the store or take them out;
- ``flows`` and ``deployments``: the Prefect flows and their deployments; ``serving``: ``prefect-webhooks serve``;
  ``demo``: the main job end to end.

Names are imported on first use (PEP 562), so ``from prefect_webhooks import Analytics`` does not load Prefect:
an application that only sends events pays for the client alone. Modules that moved keep their old import paths
(``utilities.moved_modules``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_webhooks.utilities import moved_modules
from prefect_webhooks.utilities.exports import lazy_exports

if TYPE_CHECKING:
    from prefect_webhooks.blocks import Source, WebhookDestination
    from prefect_webhooks.client import Analytics, AnalyticsError
    from prefect_webhooks.inbound.sources import aregister_source, register_source
    from prefect_webhooks.messages import Alias, Group, Identify, Page, Screen, Track

moved_modules.install()

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
    "aregister_source",
    "register_source",
]

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(("Alias", "Group", "Identify", "Page", "Screen", "Track"), "prefect_webhooks.messages"),
    **dict.fromkeys(("Analytics", "AnalyticsError"), "prefect_webhooks.client"),
    **dict.fromkeys(("Source", "WebhookDestination"), "prefect_webhooks.blocks"),
    # Saving a source through these refuses a write key another source has (Source.save would not).
    **dict.fromkeys(("aregister_source", "register_source"), "prefect_webhooks.inbound.sources"),
})
