"""Running totals per endpoint URL: requests by outcome and status class, and a latency histogram.

Each batch's requests are added in the transaction that records its outcomes (``outbox.record_outcomes``), so
``/metrics`` reads a few rows per endpoint, never the attempt log. A row of ``endpoint_counters`` holds one
``series`` of one (destination, URL):

- ``requests <outcome> <class>``: requests that ended ``delivered``, ``retry`` or ``permanent``, by status class
  ``2xx``…``5xx``, or ``none`` when no answer came (timeout, connection error, circuit open);
- ``latency_le <bound>``: requests whose latency was at most ``bound`` seconds and above the bound below it (one
  row per bucket; ``/metrics`` adds them up into the cumulative buckets Prometheus expects);
- ``latency_sum_us``: the latencies' sum, in microseconds (integers add exactly in every database).

The URL is the one delivery names endpoints by everywhere (query and credentials removed); it is keyed by its hash.
On PostgreSQL each transaction adds to one of ``SHARDS`` rows per series, as ``counters`` does.
"""

from __future__ import annotations

import bisect
import hashlib
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from prefect_webhooks.messages.outcomes import EndpointRequest
from prefect_webhooks.store.figures.counters import SHARDS
from prefect_webhooks.store.schema.tables import EndpointCounter, dialect_insert

ENDPOINT_COUNTERS = EndpointCounter.__table__
LATENCY_BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds of the latency buckets, in seconds (a request times out after 5 s; a large batch may take longer)."""
INFINITY = "+Inf"
_REQUESTS = "requests"
_LATENCY_LE = "latency_le"
_LATENCY_SUM = "latency_sum_us"


def status_class(status_code: int | None) -> str:
    """``2xx``, ``3xx``, ``4xx``, ``5xx`` (by the first digit), or ``none`` when no HTTP answer came."""
    return f"{status_code // 100}xx" if status_code is not None else "none"


def _bucket_bound(index: int) -> str:
    """The name of latency bucket ``index`` (``bisect_left`` of a latency in seconds in ``LATENCY_BOUNDS``)."""
    return f"{LATENCY_BOUNDS[index]:g}" if index < len(LATENCY_BOUNDS) else INFINITY


def _key(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:32]


def add_requests(connection: Connection, requests: Sequence[EndpointRequest]) -> None:
    """Add ``requests`` to their endpoints' totals, in the caller's transaction (rows in sorted key order, so two
    transactions lock them in the same order)."""
    if not requests:
        return
    # Tallied by (endpoint, outcome, status, latency bucket) first: a batch's requests fall into a handful of these,
    # and the series' names are made once per tally, not once per request.
    tally: dict[tuple[str, str, str, int | None, int], list[int]] = {}
    for request in requests:
        key = (request.destination, request.url, request.outcome, request.status_code,
               bisect.bisect_left(LATENCY_BOUNDS, request.latency_ms / 1000))
        entry = tally.get(key)
        if entry is None:
            entry = tally[key] = [0, 0]
        entry[0] += 1
        entry[1] += round(request.latency_ms * 1000)
    counts: Counter[tuple[str, str, str]] = Counter()
    for (destination, url, outcome, status_code, bucket), (count, latency_us) in tally.items():
        endpoint = (destination, url)
        counts[(*endpoint, f"{_REQUESTS} {outcome} {status_class(status_code)}")] += count
        counts[(*endpoint, f"{_LATENCY_LE} {_bucket_bound(bucket)}")] += count
        counts[(*endpoint, _LATENCY_SUM)] += latency_us
    shard = 0 if connection.dialect.name == "sqlite" else random.randrange(SHARDS)
    rows = [{"destination": destination, "url_key": _key(url), "series": series, "shard": shard, "url": url,
             "count": count}
            for (destination, url, series), count in sorted(counts.items(), key=lambda item: (
                item[0][0], _key(item[0][1]), item[0][2]))]
    statement = dialect_insert(connection)(ENDPOINT_COUNTERS).values(rows)
    connection.execute(statement.on_conflict_do_update(
        index_elements=[ENDPOINT_COUNTERS.c.destination, ENDPOINT_COUNTERS.c.url_key, ENDPOINT_COUNTERS.c.series,
                        ENDPOINT_COUNTERS.c.shard],
        set_={"count": ENDPOINT_COUNTERS.c.count + statement.excluded.count},
    ))


@dataclass
class EndpointTotals:
    """One endpoint URL's totals since the store was created."""

    destination: str
    url: str
    requests: dict[tuple[str, str], int] = field(default_factory=dict)
    """Requests per (outcome, status class)."""
    latency_buckets: dict[str, int] = field(default_factory=dict)
    """Requests per latency bucket (its upper bound as text, or ``+Inf``), not cumulative."""
    latency_sum_seconds: float = 0.0

    def cumulative_buckets(self) -> list[tuple[str, int]]:
        """(upper bound, requests at most that slow) for every bound and ``+Inf``, as a Prometheus histogram."""
        total = 0
        buckets = []
        for bound in (*(f"{bound:g}" for bound in LATENCY_BOUNDS), INFINITY):
            total += self.latency_buckets.get(bound, 0)
            buckets.append((bound, total))
        return buckets


def endpoint_totals(connection: Connection) -> list[EndpointTotals]:
    """Every endpoint's totals, sorted by destination and URL; a few rows per endpoint are read."""
    table = ENDPOINT_COUNTERS
    query = select(table.c.destination, table.c.url_key, table.c.series, func.max(table.c.url),
                   func.sum(table.c.count)).group_by(table.c.destination, table.c.url_key, table.c.series)
    endpoints: dict[tuple[str, str], EndpointTotals] = {}
    for destination, key, series, url, total in connection.execute(query):
        endpoint = endpoints.setdefault((destination, key), EndpointTotals(destination, url))
        kind, _, rest = series.partition(" ")
        if kind == _REQUESTS:
            outcome, _, klass = rest.partition(" ")
            endpoint.requests[outcome, klass] = int(total)
        elif kind == _LATENCY_LE:
            endpoint.latency_buckets[rest] = int(total)
        elif series == _LATENCY_SUM:
            endpoint.latency_sum_seconds = int(total) / 1_000_000
    return sorted(endpoints.values(), key=lambda endpoint: (endpoint.destination, endpoint.url))
