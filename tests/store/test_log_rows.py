"""Log rows packed before the write transaction: used only while still true, and packed with no write lock."""

from __future__ import annotations

import sqlite3
import threading
from datetime import timedelta

from sqlalchemy import insert, select, update

from prefect_webhooks.messages.outcomes import DELIVERED, RETRY, Attempt, Delivered, OutcomeRecords
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import dispose_engines, get_engine
from prefect_webhooks.store.log.message_log import find_kept, move_to_log
from prefect_webhooks.store.log.partitions import kept_partitions, partition_table
from prefect_webhooks.store.log.rows import Leaving, PackedAhead, pack_ahead
from prefect_webhooks.store.queue.outbox import ATTEMPTS, OUTBOX, claim_due_deliveries, enqueue, record_outcomes
from prefect_webhooks.store.schema.tables import store_now

URL = "https://hooks.example.com/in"


def track(user: str) -> dict:
    return {"version": 1, "type": "track", "userId": user, "timestamp": "2026-11-29T01:00:00.000Z",
            "event": "Order Completed", "properties": {"revenue": 19.99, "currency": "EUR"}}


def delivered_now(engine, users: list[str]) -> tuple[list[Leaving], list[Attempt]]:  # type: ignore[no-untyped-def]
    """Queue one message for each of ``users``, claim them, and what delivering each now leaves and attempts."""
    enqueue("crm", [track(user) for user in users], source="web")
    now = store_now()
    claimed = claim_due_deliveries(engine, 100, "worker-1")
    assert len(claimed) == len(users)
    return ([Leaving(row.id, DELIVERED, None, 1, now, now) for row in claimed],
            [Attempt(row.id, now, URL, 200, None, 9.5, DELIVERED) for row in claimed])


def kept_records(engine) -> dict[int, bytes]:  # type: ignore[no-untyped-def]
    """Every kept message's stored record, by id."""
    with engine.connect() as connection:
        records = {}
        for partition in kept_partitions(connection):
            table = partition_table(partition.name)
            records.update(connection.execute(select(table.c.id, table.c.record)).tuples().all())
        return records


def test_a_row_packed_ahead_is_stored_only_while_its_queue_row_and_attempts_are_unchanged(backend_url: str) -> None:
    engine = get_engine(backend_url)
    # A new store has no numbers yet for the destination, source and URL: nothing can be packed ahead.
    leaving, attempts = delivered_now(engine, ["u0"])
    assert pack_ahead(engine, leaving, attempts) == {}
    record_outcomes(engine, OutcomeRecords(
        delivered=[Delivered(row.id, 1, row.first_attempt_at, row.finished_at, "crm") for row in leaving],
        attempts=attempts, owner="worker-1"))

    leaving, attempts = delivered_now(engine, ["u1", "u2"])
    packed = pack_ahead(engine, leaving, attempts)
    unchanged, changed = (row.id for row in leaving)
    assert set(packed) == {unchanged, changed}
    # Meanwhile another worker took the second message over after this one's lease ran out and tried it once.
    earlier = store_now() - timedelta(seconds=1)
    with engine.begin() as connection:
        connection.execute(update(OUTBOX).where(OUTBOX.c.id == changed).values(attempts=1, first_attempt_at=earlier))
        connection.execute(insert(ATTEMPTS).values(outbox_id=changed, attempted_at=earlier, url=URL, status_code=503,
                                                   error=None, latency_ms=30.0, outcome=RETRY, response=None))
    with engine.begin() as connection:
        move_to_log(connection, leaving, attempts, packed=packed)

    records = kept_records(engine)
    assert records[unchanged] == packed[unchanged].row["record"]
    assert records[changed] != packed[changed].row["record"]
    with engine.connect() as connection:
        kept = find_kept(connection, ids=[changed])[0].content
    assert [(attempt.status_code, attempt.outcome) for attempt in kept.tries] == [(503, RETRY), (200, DELIVERED)]
    with engine.connect() as connection:
        assert connection.execute(select(OUTBOX.c.id)).all() == []


def test_rows_are_packed_while_another_writer_holds_the_store(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "store.db"
    monkeypatch.setenv("PREFECT_WEBHOOKS_DATABASE_URL", f"sqlite:///{path}")
    get_settings.cache_clear()
    engine = get_engine(f"sqlite:///{path}")
    leaving, attempts = delivered_now(engine, ["u0"])
    record_outcomes(engine, OutcomeRecords(
        delivered=[Delivered(row.id, 1, row.first_attempt_at, row.finished_at, "crm") for row in leaving],
        attempts=attempts, owner="worker-1"))
    leaving, attempts = delivered_now(engine, ["u1"])

    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # SQLite's one write lock, as the ingest API's group commit takes it
    packed: dict[int, PackedAhead] = {}
    packing = threading.Thread(target=lambda: packed.update(pack_ahead(engine, leaving, attempts)))
    try:
        packing.start()
        packing.join(timeout=10)
        assert not packing.is_alive(), "packing ahead waited for the write lock"
    finally:
        writer.execute("ROLLBACK")
        writer.close()
        packing.join()
        dispose_engines()
        get_settings.cache_clear()
    assert set(packed) == {leaving[0].id}
