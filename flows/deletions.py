"""The ``deletions`` flow: process deletion requests (see ``prefect_webhooks.deletions`` for what one does).

Record a request with ``request_deletion(user_id, sources=None, suppress=False)`` and let the scheduled flow pick
it up, or pass the user directly::

    from prefect_webhooks.flows.deletions import deletions

    deletions(user_id="user-123", suppress=True)

Each run shows a table artifact: one row per request with the sources notified, the delete messages queued, the
rows purged and whether the user is suppressed. The user id appears only as a hash (it is personal data).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import State

from prefect_webhooks.deletions.processing import DeletionOutcome, affected_sources, process_deletion
from prefect_webhooks.deletions.requests import PendingRequest, pending_requests, request_deletion, user_reference
from prefect_webhooks.flows.catch_up import superseded
from prefect_webhooks.inbound.sources import read_source
from prefect_webhooks.utilities.tagged_flows import tagged

ARTIFACT_KEY = "deletion-requests"
BATCH_SIZE = 200


@task(name="process-deletion-batch", cache_policy=NO_CACHE)
def process_deletion_batch(requests: list[PendingRequest]) -> list[DeletionOutcome]:
    """One batch of requests (one task run, not one per request); each request is its own transaction.

    A source block is read once per batch; the blocks are read before the transaction, so no API call holds the
    store's write lock.
    """
    blocks: dict[str, list[str] | None] = {}
    outcomes = []
    for request in requests:
        for source in affected_sources(request):
            if source not in blocks:
                info = read_source(source)
                blocks[source] = None if info is None else list(info.destinations)
        outcomes.append(process_deletion(request, blocks))
    return outcomes


def outcome_table(requests: Sequence[PendingRequest], outcomes: Sequence[DeletionOutcome]) -> list[dict[str, object]]:
    """One artifact row per processed request."""
    rows = []
    for request, outcome in zip(requests, outcomes, strict=True):
        rows.append(
            {
                "request": outcome.request_id,
                "user": user_reference(request.user_id),
                "sources notified": ", ".join(sorted(outcome.notified)) or "-",
                "sources skipped": ", ".join(f"{name} ({why})" for name, why in outcome.skipped_sources.items())
                or "-",
                "delete messages": outcome.delete_messages,
                "rows purged": outcome.purged_rows,
                "pending dropped": outcome.dropped_pending,
                "audience state removed": outcome.audience_state_rows,
                "suppressed": ", ".join(outcome.suppressed) or "no",
            }
        )
    return rows


@tagged
@flow(name="deletions")
def deletions(
    user_id: str | None = None,
    sources: list[str] | None = None,
    suppress: bool = False,
    request_id: int | None = None,
) -> list[DeletionOutcome] | State[Any]:
    """Process deletion requests: the one given (by ``user_id`` or ``request_id``), else every pending one.

    A scheduled run that a later due scheduled run covers (slots missed while Prefect was down) ends ``Cancelled``
    at once: the later one processes everything pending (``flows.catch_up``).

    Args:
        user_id: Record a new request for this user and process only it.
        sources: With ``user_id``: the sources to notify (default: every source with events for the user).
        suppress: With ``user_id``: also drop the user's further events.
        request_id: Process only this recorded request.

    Returns:
        The outcome of each processed request (or the ``Cancelled`` state of a superseded run).
    """
    logger = get_run_logger()
    if (skipped := superseded()) is not None:
        logger.info("%s", skipped.message)
        return skipped
    if user_id is not None:
        request_id = request_deletion(user_id, sources, suppress)
    requests = pending_requests(request_ids=[request_id] if request_id is not None else None)
    outcomes: list[DeletionOutcome] = []
    for start in range(0, len(requests), BATCH_SIZE):
        outcomes.extend(process_deletion_batch(requests[start:start + BATCH_SIZE]))
    if requests:
        create_table_artifact(
            table=outcome_table(requests, outcomes),
            key=ARTIFACT_KEY,
            description=f"{len(requests)} deletion request(s) processed",
        )
    for outcome in outcomes:
        logger.info(
            "deletion request %d: %d delete messages to %d sources, %d rows purged, %d pending dropped",
            outcome.request_id, outcome.delete_messages, len(outcome.notified), outcome.purged_rows,
            outcome.dropped_pending,
        )
    return outcomes
