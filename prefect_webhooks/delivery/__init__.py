"""Delivery: the engine that takes due outbox rows from the store and hands on signed HTTP requests to the
destinations' endpoints, then their outcomes and attempt records back to the store.

Read in this order:

- ``claims``: ``deliver_due``, the claim loop, with its ``DeliveryOptions`` (and a delivery worker's ``Shift``).
- ``batch``: one try of a claimed batch: send every message to every URL of its destination, decide, record.
- ``task``: the Prefect task ``deliver-batches`` (the batches of one window of ``task_run_seconds``), whose
  retries (from settings) resend what is left.
- ``decision``: what becomes of one message after its requests: delivered, retried when, or failed and why.
- ``sender``: the process's one HTTP client (keep-alive, at most ``delivery_concurrency`` in flight).
- ``transport``: its request path, libcurl's multi interface on the event loop (TLS, mTLS, timeouts, the guard).
- ``answers``: the start of each receiver's answer, kept with the attempt, what the request carried masked.
- ``request_shape``: what one request to one endpoint carries: method, (mapped) body, headers and signatures.
- ``batching``: messages of a destination with ``batch_size`` sent as signed arrays (``batch_bodies``: bodies, ids).
- ``auth``: OAuth2 client credentials tokens, kept per process and refreshed.
- ``preview``: the requests a destination would make for some messages, shown without sending.
- ``context``: what the batches of a process share, and store calls that ride out a store restart.
- ``stats``: what a run did, per endpoint (the ``deliver`` flow's artifacts).
- ``destinations``: saved ``WebhookDestination`` blocks by name, with a short cache, resolved for sending.
- ``filters``: a destination's filter rules compiled and applied to the messages due.
- ``circuit``: a concurrency limit and a circuit breaker per endpoint URL.
- ``network``: the optional SSRF guard on the addresses connections are made to.
- ``events``: the Prefect events emitted for messages that failed for good.
"""

from prefect_webhooks.delivery.claims import DeliveryOptions, Shift, current_shift, deliver_due
from prefect_webhooks.delivery.context import DeliveryContext
from prefect_webhooks.delivery.sender import Sender
from prefect_webhooks.delivery.stats import DeliveryStats, EndpointStats

__all__ = [
    "DeliveryContext",
    "DeliveryOptions",
    "DeliveryStats",
    "EndpointStats",
    "Sender",
    "Shift",
    "current_shift",
    "deliver_due",
]
