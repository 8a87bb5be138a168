"""Endpoints: what a delivering process knows and says about endpoints, and what the commands and console do with
them. It takes in the requests' results and the store's shared endpoint states, and hands on a run's figures per
endpoint, Prefect events, a second-old copy of the shared state, and the endpoint commands and request previews.

Read in this order:

- ``stats``: what a run did, per endpoint (the ``deliver`` flow's artifacts).
- ``shared_state``: endpoint states, ordered destinations and block generations, read about once a second.
- ``events``: the Prefect events emitted for messages that failed for good and for endpoints' health.
- ``admin``: what ``prefect-webhooks endpoint`` shows and does (list, enable, disable).
- ``preview``: the requests a destination would make for some messages, shown without sending.
"""

from prefect_webhooks.delivery.endpoints.admin import EndpointView, adisable, aenable, endpoint_views, views_of
from prefect_webhooks.delivery.endpoints.events import (
    emit_delivery_failed,
    emit_endpoint_event,
    in_background,
    wait_for_queued_events,
)
from prefect_webhooks.delivery.endpoints.preview import check_messages, preview_requests, stored_message_requests
from prefect_webhooks.delivery.endpoints.shared_state import SharedState
from prefect_webhooks.delivery.endpoints.stats import (
    DeliveryStats,
    EndpointStats,
    MessageCounts,
    artifact_key,
    filtered_artifact_key,
    summary_in_words,
)

__all__ = [
    "DeliveryStats",
    "EndpointStats",
    "EndpointView",
    "MessageCounts",
    "SharedState",
    "adisable",
    "aenable",
    "artifact_key",
    "check_messages",
    "emit_delivery_failed",
    "emit_endpoint_event",
    "endpoint_views",
    "filtered_artifact_key",
    "in_background",
    "preview_requests",
    "stored_message_requests",
    "summary_in_words",
    "views_of",
    "wait_for_queued_events",
]
