"""The figures: running totals and per-minute counts, added in the transaction that records each batch's outcomes,
and read for ``/metrics``, ``/health/backlog``, ``status`` and the console's charts. It takes in outcomes and
requests from the queue's ``record_outcomes`` and hands on totals, series and the backlog snapshot.

Read in this order:

- ``counters``: outcome totals per destination, sharded on PostgreSQL.
- ``endpoint_counters``: requests by outcome and status class, and a latency histogram, per endpoint URL.
- ``minute_counts``: outcomes and failure reasons per destination and minute, for the console.
- ``metrics``: the backlog and totals read as one snapshot, in Prometheus text, JSON and ``status``'s table.
"""

from prefect_webhooks.store.figures.counters import add_outcomes
from prefect_webhooks.store.figures.endpoint_counters import add_requests
from prefect_webhooks.store.figures.metrics import (
    add_metrics_routes,
    backlog_snapshot,
    health_document,
    prometheus_text,
    status_table,
)
from prefect_webhooks.store.figures.minute_counts import (
    MinuteSeries,
    ReasonCount,
    minute_series,
    prune_minutes,
    top_reasons,
)

__all__ = [
    "MinuteSeries",
    "ReasonCount",
    "add_metrics_routes",
    "add_outcomes",
    "add_requests",
    "backlog_snapshot",
    "health_document",
    "minute_series",
    "prometheus_text",
    "prune_minutes",
    "status_table",
    "top_reasons",
]
