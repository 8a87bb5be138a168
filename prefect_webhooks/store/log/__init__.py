"""The message log: every message that left the queue (delivered, filtered or failed), kept for its retention and
looked up by messageId, user or destination and time. It takes in a batch's leaving rows (from the queue's
``record_outcomes``) and a deletion's user, and hands on kept messages (``find_kept``, ``find_messages``), its
partitions to retention, and its periods, Bloom filters and pacing to the dedupe, which is built the same way.

Read in this order:

- ``message_log``: moving messages into the log in the transaction that records them, and finding them again.
- ``partitions``: one table per kind and period, made when first needed and dropped whole.
- ``records``: a kept message as one compressed record, and 64-bit keys for its lookups.
- ``rows``: a message's log row, its record packed before the write transaction.
- ``names``: destinations, sources and URLs kept as small numbers.
- ``statements``: the compound select a lookup runs over a group of partitions.
- ``filters``: which partitions may hold a messageId, a user or a message number, without reading them.
- ``key_filters``: Bloom filters over 16-byte keys, and the set of them a process tests together.
- ``pacing``: a pause after each step of a background pass (partition drops, seals), so ingest and delivery go on.
- ``lookups``: messages found wherever the store keeps them (queue or log), newest first.
- ``message_search``: messages by what only their record holds (reason start, an endpoint among the attempts).
- ``kept_purges``: a deletion request in the log: a user's data purged from the records kept about them.
"""

from prefect_webhooks.store.log.filters import hold_filters, seal_log_partitions
from prefect_webhooks.store.log.kept_purges import forget_pruned_sources, pruned_sources, purge_kept
from prefect_webhooks.store.log.key_filters import FilterSet, KeyFilter, Probe
from prefect_webhooks.store.log.lookups import MessageQuery, StoredMessage, find_messages, message_document, time_text
from prefect_webhooks.store.log.message_log import (
    KeptMessage,
    attempt_rows,
    decode_rows,
    find_kept,
    move_to_log,
    place_late_attempts,
)
from prefect_webhooks.store.log.message_search import SCAN_LIMIT, Refinement, search_messages
from prefect_webhooks.store.log.pacing import Pacer, paced
from prefect_webhooks.store.log.partitions import (
    KIND_OF_STATE,
    PERIODS,
    STATE_CODES,
    Partition,
    drop_partition,
    drop_unlisted,
    expired_partitions,
    kept_counts,
    kept_partitions,
    partition_states,
    partition_table,
    period_bounds,
    period_for_rate,
    record_user_sources,
    unlisted_partitions,
)
from prefect_webhooks.store.log.records import epoch_ms
from prefect_webhooks.store.log.rows import Leaving

__all__ = [
    "FilterSet",
    "KIND_OF_STATE",
    "KeptMessage",
    "KeyFilter",
    "Leaving",
    "MessageQuery",
    "PERIODS",
    "Pacer",
    "Partition",
    "Probe",
    "Refinement",
    "SCAN_LIMIT",
    "STATE_CODES",
    "StoredMessage",
    "attempt_rows",
    "decode_rows",
    "drop_partition",
    "drop_unlisted",
    "epoch_ms",
    "expired_partitions",
    "find_kept",
    "find_messages",
    "forget_pruned_sources",
    "hold_filters",
    "kept_counts",
    "kept_partitions",
    "message_document",
    "move_to_log",
    "paced",
    "partition_states",
    "partition_table",
    "period_bounds",
    "period_for_rate",
    "place_late_attempts",
    "pruned_sources",
    "purge_kept",
    "record_user_sources",
    "seal_log_partitions",
    "search_messages",
    "time_text",
    "unlisted_partitions",
]
