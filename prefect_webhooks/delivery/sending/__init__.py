"""Sending: from a destination block to its receivers' answers. It takes in a destination's name (resolved from its
saved block) and a message body, and hands on one ``RequestResult`` per request: signed, authorized, guarded and
sent over libcurl, with the start of each answer kept.

Read in this order:

- ``destinations``: saved ``WebhookDestination`` blocks by name, with a short cache, resolved for sending.
- ``filters``: a destination's filter rules compiled once and applied to the messages due.
- ``request_shape``: what one request to one endpoint carries: method, (mapped) body, headers and signatures.
- ``batch_bodies``: the signed arrays of a destination with ``batch_size``: bodies, sizes and ids.
- ``sender``: the process's one HTTP client (keep-alive, at most ``delivery_concurrency`` in flight).
- ``transport``: its request path, libcurl's multi interface on the event loop (TLS, mTLS, timeouts, the guard).
- ``network``: the optional SSRF guard on the addresses connections are made to.
- ``auth``: OAuth2 client credentials tokens, kept per process and refreshed.
- ``circuit``: a concurrency limit and a circuit breaker per endpoint URL.
- ``answers``: the start of each receiver's answer, kept with the attempt, what the request carried masked.
"""

from prefect_webhooks.delivery.sending.batch_bodies import Item, batch_request, cut, endpoint_batches, item_size
from prefect_webhooks.delivery.sending.circuit import CIRCUIT_OPEN_ERROR
from prefect_webhooks.delivery.sending.destinations import (
    DestinationCache,
    DestinationNotFound,
    InvalidDestination,
    ResolvedDestination,
    resolve,
)
from prefect_webhooks.delivery.sending.filters import split_filtered
from prefect_webhooks.delivery.sending.request_shape import AUTHORIZATION_HEADER, Endpoint, Request, shape_requests
from prefect_webhooks.delivery.sending.sender import RequestResult, Sender, ends_in_a_retry, run_paced

__all__ = [
    "AUTHORIZATION_HEADER",
    "CIRCUIT_OPEN_ERROR",
    "DestinationCache",
    "DestinationNotFound",
    "Endpoint",
    "InvalidDestination",
    "Item",
    "Request",
    "RequestResult",
    "ResolvedDestination",
    "Sender",
    "batch_request",
    "cut",
    "endpoint_batches",
    "ends_in_a_retry",
    "item_size",
    "resolve",
    "run_paced",
    "shape_requests",
    "split_filtered",
]
