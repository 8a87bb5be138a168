"""Deletion requests: a user id in, ``delete`` notifications out. ``request_deletion`` records a request
(``requests``); the ``deletions`` flow processes each one (``processing``): it finds the affected sources, purges the
user's stored bodies, writes one ``delete`` message per source and Webhooks destination, and optionally suppresses
the user's further events, all in one transaction.
"""

from prefect_webhooks.deletions.processing import DeletionOutcome, process_deletion
from prefect_webhooks.deletions.requests import (
    DeletionError,
    PendingRequest,
    has_pending_requests,
    pending_requests,
    request_deletion,
)

__all__ = [
    "DeletionError",
    "DeletionOutcome",
    "PendingRequest",
    "has_pending_requests",
    "pending_requests",
    "process_deletion",
    "request_deletion",
]
