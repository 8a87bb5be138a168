"""Upkeep: the pruning pass that keeps the store from growing under a constant load. It takes in the store and the
retention settings and hands on a report of what it removed (the log's expired partitions, the dedupe's expired
periods, old minute counts) and how much room the store takes; one pass at a time per store.

Read in this order:

- ``retention``: one pruning pass, oldest first, paced.
- ``leases``: named leases, so one process at a time runs a piece of maintenance, across hosts.
- ``footprint``: how much room the store takes, as a pass reports it.
"""

from prefect_webhooks.store.upkeep.retention import PruneReport, prune_store

__all__ = [
    "PruneReport",
    "prune_store",
]
