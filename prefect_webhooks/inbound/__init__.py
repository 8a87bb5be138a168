"""Inbound: calls in, outbox rows out. It takes in Segment-compatible HTTP requests (``api``: ``/v1/batch`` and the
single-call endpoints, authenticated by write key against the saved sources, ``sources``) and batches from the
ingest flow, and hands on committed outbox rows. Both go through the one ingestion path (``ingestion``): merge the
envelope's batch-level fields (``envelope``), validate each call (``messages``), resolve its timestamp, drop
duplicates and suppressed users, route it by source and ``integrations`` (``routing``) and build its outbound rows,
committed together by the API's group-commit writer (``batch_writer``) before the 200. The same server answers the
admin API (``admin_api``: looking messages up and sending them again, behind its own token).

Names load on first use: the ingest flow needs the ingestion path, not FastAPI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_webhooks.utilities.exports import lazy_exports

if TYPE_CHECKING:
    from prefect_webhooks.inbound.api import create_app
    from prefect_webhooks.inbound.ingestion import IngestResult, Rejection, ingest_batch
    from prefect_webhooks.inbound.routing import route
    from prefect_webhooks.inbound.sources import SourceInfo, aregister_source, register_source

__all__ = [
    "IngestResult",
    "Rejection",
    "SourceInfo",
    "aregister_source",
    "create_app",
    "ingest_batch",
    "register_source",
    "route",
]

__getattr__, __dir__ = lazy_exports(__name__, {
    "IngestResult": "prefect_webhooks.inbound.ingestion",
    "Rejection": "prefect_webhooks.inbound.ingestion",
    "SourceInfo": "prefect_webhooks.inbound.sources",
    "aregister_source": "prefect_webhooks.inbound.sources",
    "create_app": "prefect_webhooks.inbound.api",
    "ingest_batch": "prefect_webhooks.inbound.ingestion",
    "register_source": "prefect_webhooks.inbound.sources",
    "route": "prefect_webhooks.inbound.routing",
})
