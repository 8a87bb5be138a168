"""Monitoring figures read from the store: backlog depth, oldest pending age, outcome totals, requests per endpoint.

The same snapshot feeds the Prometheus text at ``/metrics``, the JSON health at ``/health/backlog`` and the
``prefect-webhooks status`` command. Everything is read from the store, so any process that can reach it (the
ingest API, a CLI on another host) reports the same figures. The cost does not grow with history: the totals are
the outcome counters (``counters``: a few rows per destination) and the endpoint counters (``endpoint_counters``:
a few rows per endpoint URL), the gauges read pending rows only, through the
due index (``pending_gauge_query``); delivered, failed and filtered rows are never read.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Select, case, func, select
from sqlalchemy.engine import Engine

from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, FILTERED, PENDING
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.figures.counters import outcome_totals
from prefect_webhooks.store.figures.endpoint_counters import EndpointTotals, endpoint_totals
from prefect_webhooks.store.schema.tables import OutboxMessage, store_now
from prefect_webhooks.utilities.tables import table_text

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
METRICS_PATH = "/metrics"
HEALTH_PATH = "/health/backlog"

# (name, type, help, field of a destination's figures)
_METRICS = (
    ("prefect_webhooks_backlog_messages", "gauge", "Messages waiting for delivery (pending).", "pending"),
    ("prefect_webhooks_in_flight_messages", "gauge", "Pending messages held by a live delivery lease.", "in_flight"),
    (
        "prefect_webhooks_oldest_pending_age_seconds",
        "gauge",
        "Age of the oldest pending message, in seconds (0 when none is pending).",
        "oldest_pending_age_seconds",
    ),
    ("prefect_webhooks_delivered_total", "counter", "Messages delivered (any endpoint answered 2xx).", "delivered"),
    ("prefect_webhooks_failed_total", "counter", "Messages given up on (permanent error or retry age).", "failed"),
    (
        "prefect_webhooks_filtered_total",
        "counter",
        "Messages a destination filter rule dropped (never sent).",
        "filtered",
    ),
)
ENDPOINT_REQUESTS = "prefect_webhooks_endpoint_requests_total"
ENDPOINT_LATENCY = "prefect_webhooks_endpoint_latency_seconds"


def _empty_figures() -> dict[str, Any]:
    return {
        "pending": 0,
        "in_flight": 0,
        "delivered": 0,
        "failed": 0,
        "filtered": 0,
        "oldest_pending_at": None,
        "oldest_pending_age_seconds": 0.0,
    }


def pending_gauge_query(now: datetime) -> Select[Any]:
    """Per destination: pending rows, those under a live lease, the oldest creation time; pending rows only."""
    table = OutboxMessage.__table__
    leased = func.sum(case((table.c.lease_expires_at > now, 1), else_=0))
    return (
        select(table.c.destination, func.count(), leased, func.min(table.c.created_at))
        .where(table.c.state == PENDING)
        .group_by(table.c.destination)
    )


def _age_seconds(oldest: datetime | str | None, now: datetime) -> float:
    if oldest is None:
        return 0.0
    if isinstance(oldest, str):
        # SQLite hands back min() over a datetime column as text.
        oldest = datetime.fromisoformat(oldest)
    return max(0.0, (now - oldest.replace(tzinfo=None)).total_seconds())


def backlog_snapshot(engine: Engine | None = None, now: datetime | None = None) -> dict[str, Any]:
    """Read backlog depth, oldest pending age and outcome counts per destination from the store.

    Args:
        engine: The store; the configured one by default.
        now: The time ages are measured at (naive UTC); the current time by default.

    Returns:
        ``{"generated_at", "destinations": {name: figures}, "totals": figures, "endpoints": [...]}`` where figures
        has ``pending``, ``in_flight``, ``delivered``, ``failed``, ``filtered``, ``oldest_pending_at`` (ISO or None)
        and ``oldest_pending_age_seconds``, and each endpoint (URL without query or credentials) has its
        ``requests`` by outcome and status class and its latency histogram.

    Example:
        ```python
        from prefect_webhooks.store.figures.metrics import backlog_snapshot
        backlog_snapshot()["totals"]["pending"]
        ```
    """
    engine = engine or get_engine()
    now = now or store_now()
    destinations: dict[str, dict[str, Any]] = {}
    with engine.connect() as connection:
        totals = outcome_totals(connection)
        pending = list(connection.execute(pending_gauge_query(now)))
        endpoints = endpoint_totals(connection)
    for destination, outcomes in totals.items():
        figures = destinations.setdefault(destination, _empty_figures())
        for outcome in (DELIVERED, FAILED, FILTERED):
            figures[outcome] = outcomes.get(outcome, 0)
    for destination, count, leased, oldest in pending:
        figures = destinations.setdefault(destination, _empty_figures())
        figures["pending"] = count
        figures["in_flight"] = int(leased or 0)
        figures["oldest_pending_age_seconds"] = _age_seconds(oldest, now)
        figures["oldest_pending_at"] = str(oldest) if oldest is not None else None
    return {
        "generated_at": now.isoformat() + "Z",
        "destinations": dict(sorted(destinations.items())),
        "totals": _totals(destinations.values()),
        "endpoints": [_endpoint_document(endpoint) for endpoint in endpoints],
    }


def _endpoint_document(endpoint: EndpointTotals) -> dict[str, Any]:
    buckets = endpoint.cumulative_buckets()
    return {
        "destination": endpoint.destination,
        "endpoint": endpoint.url,
        "requests": [{"outcome": outcome, "status_class": klass, "count": count}
                     for (outcome, klass), count in sorted(endpoint.requests.items())],
        "latency_seconds": {"buckets": dict(buckets), "sum": round(endpoint.latency_sum_seconds, 6),
                            "count": buckets[-1][1]},
    }


def _totals(all_figures: Any) -> dict[str, Any]:
    totals = _empty_figures()
    for figures in all_figures:
        for key in ("pending", "in_flight", "delivered", "failed", "filtered"):
            totals[key] += figures[key]
        if figures["oldest_pending_age_seconds"] > totals["oldest_pending_age_seconds"]:
            totals["oldest_pending_age_seconds"] = figures["oldest_pending_age_seconds"]
            totals["oldest_pending_at"] = figures["oldest_pending_at"]
    return totals


def _label(value: str) -> str:
    """A Prometheus label value, escaped as the text format requires."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}"


def prometheus_text(snapshot: dict[str, Any]) -> str:
    """Render a ``backlog_snapshot`` in the Prometheus text exposition format (version 0.0.4).

    Args:
        snapshot: What ``backlog_snapshot`` returned.

    Returns:
        One ``# HELP``/``# TYPE`` block per metric, one sample per destination (per endpoint URL and series for the
        endpoint metrics), ending with a newline.
    """
    lines: list[str] = []
    for name, kind, help_text, field in _METRICS:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for destination, figures in snapshot["destinations"].items():
            lines.append(f'{name}{{destination="{_label(destination)}"}} {_number(figures[field])}')
    lines.extend(_endpoint_lines(snapshot.get("endpoints", [])))
    return "\n".join(lines) + "\n"


def _endpoint_lines(endpoints: list[dict[str, Any]]) -> list[str]:
    """The per-endpoint counter and histogram, labelled by destination and endpoint URL."""
    lines = [f"# HELP {ENDPOINT_REQUESTS} Requests to an endpoint URL by outcome (delivered, retry, permanent) and "
             "status class (2xx..5xx, none when no answer came).",
             f"# TYPE {ENDPOINT_REQUESTS} counter"]
    for endpoint in endpoints:
        labels = f'destination="{_label(endpoint["destination"])}",endpoint="{_label(endpoint["endpoint"])}"'
        for request in endpoint["requests"]:
            lines.append(f'{ENDPOINT_REQUESTS}{{{labels},outcome="{request["outcome"]}",'
                         f'status_class="{request["status_class"]}"}} {request["count"]}')
    lines += [f"# HELP {ENDPOINT_LATENCY} Latency of requests to an endpoint URL, in seconds.",
              f"# TYPE {ENDPOINT_LATENCY} histogram"]
    for endpoint in endpoints:
        labels = f'destination="{_label(endpoint["destination"])}",endpoint="{_label(endpoint["endpoint"])}"'
        latency = endpoint["latency_seconds"]
        for bound, count in latency["buckets"].items():
            lines.append(f'{ENDPOINT_LATENCY}_bucket{{{labels},le="{bound}"}} {count}')
        lines.append(f"{ENDPOINT_LATENCY}_sum{{{labels}}} {latency['sum']!r}")
        lines.append(f"{ENDPOINT_LATENCY}_count{{{labels}}} {latency['count']}")
    return lines


def health_document(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The JSON health answer: ``status`` ok plus the snapshot (backlog per destination and totals)."""
    return {"status": "ok", **snapshot}


def status_table(snapshot: dict[str, Any]) -> str:
    """The snapshot as a text table for the ``status`` command: one row per destination, then the totals (and what
    the message log keeps, when the snapshot has ``kept``: ``log.partitions.kept_counts``; and the messageIds the
    dedupe window holds, with ``remembered``: ``seen_ids.remembered_ids``)."""

    def cells(name: str, figures: dict[str, Any]) -> tuple[object, ...]:
        return (
            name,
            figures["pending"],
            figures["in_flight"],
            f"{figures['oldest_pending_age_seconds']:.1f}",
            figures["delivered"],
            figures["failed"],
            figures["filtered"],
        )

    table = table_text(
        ("destination", "pending", "in flight", "oldest pending (s)", "delivered", "failed", "filtered"),
        [cells(name, figures) for name, figures in snapshot["destinations"].items()],
        total=cells("TOTAL", snapshot["totals"]),
    )
    if "kept" not in snapshot:
        return table
    kept = snapshot["kept"]
    remembered = (f"\nremembered for the dedupe window: {snapshot['remembered']:,} messageIds"
                  if "remembered" in snapshot else "")
    return (f"{table}\nkept in the message log: {sum(kept.values()):,} messages ({kept['delivered']:,} delivered or "
            f"filtered, {kept['failed']:,} failed){remembered}")


def add_metrics_routes(app: Any, engine: Engine | None = None) -> None:
    """Add ``GET /metrics`` (Prometheus text) and ``GET /health/backlog`` (JSON) to a FastAPI/Starlette app.

    Args:
        app: A FastAPI or Starlette application (anything with ``add_route``).
        engine: The store to read; the configured one, resolved per request, by default.
    """
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    async def metrics(_request: Request) -> Response:
        # The store is read with a blocking driver: keep it off the event loop.
        snapshot = await run_in_threadpool(backlog_snapshot, engine)
        return Response(prometheus_text(snapshot), media_type=PROMETHEUS_CONTENT_TYPE)

    async def health(_request: Request) -> Response:
        snapshot = await run_in_threadpool(backlog_snapshot, engine)
        return JSONResponse(health_document(snapshot))

    app.add_route(METRICS_PATH, metrics, methods=["GET"], include_in_schema=False)
    app.add_route(HEALTH_PATH, health, methods=["GET"], include_in_schema=False)
