"""Delivery: the engine that takes due outbox rows from the store and hands on signed HTTP requests to the
destinations' endpoints, then their outcomes and attempt records back to the store.

One folder per mechanism, lowest first (a mechanism imports only from the ones before it; each ``__init__`` lists
its modules in reading order):

- ``sending``: from a destination block to its receivers' answers: destinations resolved and cached, filters,
  what a request carries (one message or a batch's array), the sender and its libcurl transport, OAuth2 tokens,
  circuit breakers, the SSRF guard, answers kept.
- ``endpoints``: what a process knows and says about endpoints: a run's stats, the store's shared state read about
  once a second, Prefect events, the ``endpoint`` commands and request previews.
- ``pacing``: when each message of a batch may go and when it goes again: the batches' context, retry wake-ups,
  rate limits, ordered delivery, endpoint health, and each message's decision.
- ``batches``: the claim loop (``deliver_due``), the ``deliver-batches`` task, one try of a batch, batched and
  fanned-out sends, outcomes recorded in waves.
"""

from prefect_webhooks.delivery.batches.claims import DeliveryOptions, Shift, current_shift, deliver_due
from prefect_webhooks.delivery.endpoints.stats import DeliveryStats, EndpointStats
from prefect_webhooks.delivery.pacing.context import DeliveryContext
from prefect_webhooks.delivery.sending.sender import Sender

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
