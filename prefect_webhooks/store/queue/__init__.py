"""The queue: messages waiting for delivery. It takes in outbox rows (from ingestion, audience syncs and
deletions) and replayed or resent messages from the log, and hands them on to delivery as leased claims; a message
that reaches its outcome leaves for the message log, and its counts go to the figures.

Read in this order:

- ``outbox``: how messages enter the queue, are claimed under a lease, and leave it with their outcomes.
- ``ordering``: an ordered destination's messages claimable one per user, oldest first.
- ``followers``: a user's next messages, claimed behind the one an ordered claim took.
- ``fan_out``: a message of a destination that delivers to each endpoint split into one row per endpoint.
- ``replay``: failed (or filtered) messages from the log back into the queue, and resends, in bounded chunks.
"""

from prefect_webhooks.store.queue.fan_out import split_by_endpoint
from prefect_webhooks.store.queue.followers import claim_followers
from prefect_webhooks.store.queue.ordering import behind_earlier, ordered_destinations, set_ordered
from prefect_webhooks.store.queue.outbox import (
    Claimed,
    add_to_outbox,
    bring_forward,
    claim_due_deliveries,
    enqueue,
    extend_leases,
    leased_rows,
    outbox_row,
    outbox_rows,
    record_outcomes,
    release_leases,
    renew_leases,
)
from prefect_webhooks.store.queue.replay import (
    DEFAULT_CHUNK,
    RESENT,
    ReplaySelection,
    count_selected,
    replay_chunks,
    replay_failed,
    replay_selection,
    resend_messages,
)

__all__ = [
    "Claimed",
    "DEFAULT_CHUNK",
    "RESENT",
    "ReplaySelection",
    "add_to_outbox",
    "behind_earlier",
    "bring_forward",
    "claim_due_deliveries",
    "claim_followers",
    "count_selected",
    "enqueue",
    "extend_leases",
    "leased_rows",
    "ordered_destinations",
    "outbox_row",
    "outbox_rows",
    "record_outcomes",
    "release_leases",
    "renew_leases",
    "replay_chunks",
    "replay_failed",
    "replay_selection",
    "resend_messages",
    "set_ordered",
    "split_by_endpoint",
]
