"""Monitoring costs O(destinations), not O(history): the plan of the gauge query reads pending rows only."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

from prefect_webhooks.messages.outcomes import DELIVERED
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.figures.counters import add_outcomes
from prefect_webhooks.store.figures.metrics import backlog_snapshot, pending_gauge_query
from prefect_webhooks.store.queue.outbox import enqueue
from prefect_webhooks.store.schema.tables import store_now

HISTORY = 20_000
PENDING_ROWS = 5


def _with_history(engine: Engine, *, history: int = HISTORY, finished: str = "2026-01-01 00:00:01.000000",
                  analyze: bool = True) -> None:
    """``history`` delivered rows that finished at ``finished`` (bulk-inserted, as a month of traffic leaves them)
    and a few pending ones."""
    enqueue("crm", [{"type": "track", "userId": f"u{n}", "event": "E"} for n in range(PENDING_ROWS)])
    columns = ("destination, message_type, user_id, body, state, attempts, created_at, next_attempt_at")
    if engine.dialect.name == "sqlite":
        rows = ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :history) "
                "SELECT 'crm', 'track', 'u' || i, x'7b7d', 'delivered', 1, :finished, :finished FROM n")
    else:
        rows = ("SELECT 'crm', 'track', 'u' || i, '\\x7b7d'::bytea, 'delivered', 1, CAST(:finished AS timestamp), "
                "CAST(:finished AS timestamp) FROM generate_series(1, :history) AS i")
    with engine.begin() as connection:
        connection.execute(text(f"INSERT INTO outbox ({columns}) {rows}"), {"history": history, "finished": finished})
        add_outcomes(connection, {("crm", DELIVERED): history})
        if analyze:
            connection.exec_driver_sql("ANALYZE")


def _compiled(engine: Engine) -> str:
    query = pending_gauge_query(store_now())
    return str(query.compile(engine, compile_kwargs={"literal_binds": True}))


def _plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(child for sub in node.get("Plans", []) for child in _plan_nodes(sub))]


def test_the_gauges_read_no_delivered_row(backend_url: str) -> None:
    engine = get_engine(backend_url)
    _with_history(engine)
    with engine.connect() as connection:
        if engine.dialect.name == "sqlite":
            plan = [row[-1] for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {_compiled(engine)}")]
            # A search of the due index on state = 'pending': no scan of the table, so no delivered row is read.
            assert any("outbox USING" in step and "INDEX ix_outbox_due (state=?)" in step for step in plan), plan
            assert not any(step.startswith("SCAN outbox") for step in plan), plan
        else:
            raw = connection.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {_compiled(engine)}").scalar_one()
            document = raw if isinstance(raw, list) else json.loads(raw)
            nodes = [node for node in _plan_nodes(document[0]["Plan"]) if node.get("Relation Name") == "outbox"]
            assert nodes and all(node["Node Type"] != "Seq Scan" for node in nodes), nodes
            # Executed, the outbox scan handed on the pending rows and nothing else.
            assert sum(node["Actual Rows"] for node in nodes) == PENDING_ROWS, nodes
    totals = backlog_snapshot(engine)["totals"]
    assert (totals["pending"], totals["delivered"]) == (PENDING_ROWS, HISTORY)


def test_a_pruning_pass_never_reads_what_it_keeps(store_url: str) -> None:
    """A pass finds what to remove in the partition list and reads only the partitions it drops: its cost follows
    what it removes, not the history kept."""
    from datetime import timedelta

    from sqlalchemy import event

    from prefect_webhooks.store.log.partitions import kept_partitions
    from prefect_webhooks.store.upkeep.retention import prune_store
    from tests.stored import finish

    engine = get_engine(store_url)
    enqueue("crm", [{"type": "track", "userId": f"u{n}", "event": "E"} for n in range(HISTORY + 600)])
    finish(engine, list(range(1, 601)), DELIVERED, at=store_now() - timedelta(days=2))
    finish(engine, list(range(601, HISTORY + 601)), DELIVERED)
    with engine.connect() as connection:
        (kept, expired) = kept_partitions(connection)
    statements: list[str] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", capture)
    try:
        report = prune_store(engine=engine)
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert report.removed.get("delivered") == 600
    assert any(expired.name in statement for statement in statements)
    assert not any(kept.name in statement for statement in statements), statements
    with engine.connect() as connection:
        assert [partition.name for partition in kept_partitions(connection)] == [kept.name]
