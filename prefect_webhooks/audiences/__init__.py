"""Audiences and computed traits: snapshots in, ``identify`` rows out. An ``AudienceDefinition`` (``definition``)
names a snapshot provider (``snapshots``: SQL, CSV, Parquet or a callable); each sync validates the snapshot,
diffs it against the state last sent to each destination (``diff``), and writes one snake_case ``identify`` per
change (``naming``) together with the new state in one transaction (``sync``). ``registry`` keeps each audience's
key, fixed at its first sync, so a rename keeps the property name receivers see.
"""

from prefect_webhooks.audiences.definition import AudienceDefinition, AudienceError
from prefect_webhooks.audiences.naming import snake_case
from prefect_webhooks.audiences.snapshots import (
    CallableSnapshot,
    CsvSnapshot,
    ParquetSnapshot,
    SnapshotError,
    SqlSnapshot,
)
from prefect_webhooks.audiences.sync import DestinationResult, SyncResult, sync_audience

__all__ = [
    "AudienceDefinition",
    "AudienceError",
    "CallableSnapshot",
    "CsvSnapshot",
    "DestinationResult",
    "ParquetSnapshot",
    "SnapshotError",
    "SqlSnapshot",
    "SyncResult",
    "snake_case",
    "sync_audience",
]
