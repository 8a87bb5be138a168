from datetime import datetime, timezone

from sqlalchemy import func, inspect, select

from prefect_webhooks.messages.outcomes import PENDING
from prefect_webhooks.messages.payloads import delete_payload, identify_payload
from prefect_webhooks.store.engine.engines import create_schema, get_engine
from prefect_webhooks.store.queue.outbox import enqueue
from prefect_webhooks.store.schema.tables import OutboxMessage, store_now, to_store_time


def test_schema_creation_is_idempotent_on_each_backend(backend_url: str) -> None:
    engine = get_engine(backend_url)
    create_schema(engine)
    create_schema(engine)
    tables = set(inspect(engine).get_table_names())
    assert {"outbox", "delivery_attempts", "seen_id_periods", "audience_state", "deletion_requests"} <= tables


def test_enqueue_commits_rows_with_bodies_serialised_once(backend_url: str) -> None:
    engine = get_engine(backend_url)
    when = datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=timezone.utc)
    count = enqueue(
        "crm",
        [identify_payload("u1", {"vip": True}, when), delete_payload("u2", when)],
        source="web",
        engine=engine,
    )
    assert count == 2
    with engine.connect() as connection:
        rows = connection.execute(select(OutboxMessage.__table__).order_by(OutboxMessage.__table__.c.id)).all()
        total = connection.execute(select(func.count()).select_from(OutboxMessage.__table__)).scalar_one()
    assert total == 2
    assert [row.message_type for row in rows] == ["identify", "delete"]
    assert [row.user_id for row in rows] == ["u1", "u2"]
    assert all(row.state == PENDING and row.source == "web" and row.attempts == 0 for row in rows)
    assert rows[0].body == (
        b'{"version":1,"type":"identify","userId":"u1","timestamp":"2024-05-01T12:00:00.123Z","traits":{"vip":true}}'
    )
    assert rows[1].body == b'{"type":"delete","userId":"u2","timestamp":"2024-05-01T12:00:00.123Z"}'
    assert rows[0].next_attempt_at <= store_now()


def test_store_times_are_naive_utc() -> None:
    aware = datetime(2024, 1, 1, 8, 0, tzinfo=timezone.utc)
    assert to_store_time(aware) == datetime(2024, 1, 1, 8, 0)
    assert store_now().tzinfo is None
