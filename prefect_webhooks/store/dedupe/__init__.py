"""The dedupe: the messageIds ingestion has seen within the dedupe window. It takes in the ids of each ingest call
(their 16-byte keys and receipt times) and hands on which of them were seen before; it keeps them in periods sealed
behind Bloom filters as the message log keeps messages (its periods, filters and pacing come from ``store.log``),
and hands expired periods to retention.

Read in this order:

- ``seen_ids``: remembered ids, one table per period of receipt, a filter over each sealed period.
"""

from prefect_webhooks.store.dedupe.seen_ids import (
    LEGACY,
    drop_period,
    drop_unlisted_period,
    expired_periods,
    hold_seen_filters,
    remember_receipts,
    remembered_ids,
    seal_periods,
    seen_receipts,
    unlisted_periods,
)

__all__ = [
    "LEGACY",
    "drop_period",
    "drop_unlisted_period",
    "expired_periods",
    "hold_seen_filters",
    "remember_receipts",
    "remembered_ids",
    "seal_periods",
    "seen_receipts",
    "unlisted_periods",
]
