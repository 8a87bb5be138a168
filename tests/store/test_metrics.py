"""Backlog figures from the store, their Prometheus rendering, and the HTTP routes served by real uvicorn."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from sqlalchemy import update

from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, FILTERED
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.figures.counters import add_outcomes
from prefect_webhooks.store.figures.metrics import add_metrics_routes, backlog_snapshot, prometheus_text, status_table
from prefect_webhooks.store.queue.outbox import add_to_outbox, outbox_rows
from prefect_webhooks.store.schema.tables import OutboxMessage, store_now

NOW = store_now()


def _add(
    destination: str, count: int, *, age: float, state: str | None = None, leased: bool = False, lease: float = 60
) -> None:
    """Insert ``count`` rows created ``age`` seconds before NOW, optionally moved to ``state`` or leased."""
    engine = get_engine()
    created = NOW - timedelta(seconds=age)
    payloads = [{"type": "track", "userId": f"u{i}", "event": "E"} for i in range(count)]
    with engine.begin() as connection:
        rows = outbox_rows(destination, payloads, now=created)
        for row in rows:
            row["message_id"] = f"{destination}-{state}-{age}-{row['user_id']}"
        add_to_outbox(connection, rows)
        table = OutboxMessage.__table__
        ids = table.c.created_at == created
        if state:
            # As record_outcomes does: the new state and its count, in one transaction.
            connection.execute(update(table).where(ids, table.c.destination == destination).values(state=state))
            add_outcomes(connection, {(destination, state): count})
        if leased:
            connection.execute(
                update(table)
                .where(ids, table.c.destination == destination)
                .values(lease_owner="w1", lease_expires_at=NOW + timedelta(seconds=lease))
            )


@pytest.fixture
def filled_store(store_url: str) -> str:
    _add("crm", 3, age=120)
    # A day-long lease: the status command reads the real clock, which may run well past NOW in a long session.
    _add("crm", 2, age=10, leased=True, lease=86400)
    _add("crm", 4, age=500, state=DELIVERED)
    _add("crm", 1, age=900, state=FAILED)
    _add("crm", 2, age=700, state=FILTERED)
    _add('odd "name"\\x', 5, age=30, state=DELIVERED)
    return store_url


def test_snapshot_counts_per_destination_and_totals(filled_store: str) -> None:
    snapshot = backlog_snapshot(now=NOW)

    crm = snapshot["destinations"]["crm"]
    assert (crm["pending"], crm["in_flight"], crm["delivered"], crm["failed"], crm["filtered"]) == (5, 2, 4, 1, 2)
    # The oldest pending row is 120 s old; delivered/failed/filtered rows, older still, do not count.
    assert crm["oldest_pending_age_seconds"] == pytest.approx(120, abs=0.01)
    odd = snapshot["destinations"]['odd "name"\\x']
    assert (odd["pending"], odd["delivered"], odd["oldest_pending_age_seconds"]) == (0, 5, 0.0)
    totals = snapshot["totals"]
    assert (totals["pending"], totals["delivered"], totals["failed"], totals["filtered"]) == (5, 9, 1, 2)
    assert totals["oldest_pending_age_seconds"] == pytest.approx(120, abs=0.01)


def test_empty_store_has_no_backlog(store_url: str) -> None:
    snapshot = backlog_snapshot()
    assert snapshot["destinations"] == {}
    assert snapshot["totals"]["pending"] == 0
    assert "TOTAL" in status_table(snapshot)


def test_expired_lease_is_not_in_flight(store_url: str) -> None:
    _add("crm", 2, age=5, leased=True)
    later = NOW + timedelta(seconds=61)
    assert backlog_snapshot(now=NOW)["destinations"]["crm"]["in_flight"] == 2
    assert backlog_snapshot(now=later)["destinations"]["crm"]["in_flight"] == 0


def test_prometheus_text_is_well_formed(filled_store: str) -> None:
    text = prometheus_text(backlog_snapshot(now=NOW))

    assert text.endswith("\n")
    assert 'prefect_webhooks_backlog_messages{destination="crm"} 5\n' in text
    assert 'prefect_webhooks_oldest_pending_age_seconds{destination="crm"} 120' in text
    assert 'prefect_webhooks_delivered_total{destination="crm"} 4\n' in text
    assert 'prefect_webhooks_failed_total{destination="crm"} 1\n' in text
    assert 'prefect_webhooks_filtered_total{destination="crm"} 2\n' in text
    assert 'prefect_webhooks_filtered_total{destination="odd \\"name\\"\\\\x"} 0\n' in text
    # Quotes and backslashes in a label value are escaped.
    assert 'prefect_webhooks_delivered_total{destination="odd \\"name\\"\\\\x"} 5\n' in text
    sample = re.compile(r'^[a-z_]+\{destination="(?:[^"\\]|\\.)*"\} -?[0-9.]+$')
    for line in text.splitlines():
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or sample.match(line), line
    assert text.count("# TYPE ") == 8  # six per destination, two per endpoint URL


def test_status_table_lists_each_destination(filled_store: str) -> None:
    table = status_table(backlog_snapshot(now=NOW)).splitlines()
    assert table[0].split()[0] == "destination"
    crm = next(line for line in table if line.startswith("crm"))
    assert table[0].split()[-1] == "filtered"
    assert crm.split() == ["crm", "5", "2", "120.0", "4", "1", "2"]
    assert table[-1].split() == ["TOTAL", "5", "2", "120.0", "9", "1", "2"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def metrics_server(filled_store: str) -> Iterator[str]:
    """A real uvicorn serving an app with the metrics routes added."""
    app = FastAPI()
    add_metrics_routes(app)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_metrics_routes_over_http(metrics_server: str) -> None:
    metrics = httpx.get(f"{metrics_server}/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert 'prefect_webhooks_backlog_messages{destination="crm"} 5' in metrics.text

    health = httpx.get(f"{metrics_server}/health/backlog")
    assert health.status_code == 200
    document = health.json()
    assert document["status"] == "ok"
    assert document["destinations"]["crm"]["pending"] == 5
    assert document["totals"]["delivered"] == 9


def test_status_command_prints_from_the_store(filled_store: str, capsys: pytest.CaptureFixture[str]) -> None:
    from prefect_webhooks.cli import main

    assert main(["status"]) == 0
    table = capsys.readouterr().out
    assert next(line for line in table.splitlines() if line.startswith("crm")).split()[:3] == ["crm", "5", "2"]

    assert main(["status", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["totals"]["pending"] == 5 and document["totals"]["failed"] == 1
    assert document["destinations"]["crm"]["filtered"] == 2

    assert main(["status", "--prometheus"]) == 0
    assert 'prefect_webhooks_backlog_messages{destination="crm"} 5' in capsys.readouterr().out


def test_ingest_api_serves_metrics(prefect_harness: None, filled_store: str) -> None:
    from prefect.settings import PREFECT_API_URL

    from tests.servers import ingest_api_process

    with ingest_api_process(filled_store, prefect_api_url=PREFECT_API_URL.value()) as server:
        metrics = httpx.get(f"{server.url}/metrics")
        health = httpx.get(f"{server.url}/health/backlog")
    assert metrics.status_code == 200
    assert 'prefect_webhooks_failed_total{destination="crm"} 1' in metrics.text
    assert health.json()["destinations"]["crm"]["pending"] == 5
