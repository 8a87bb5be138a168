"""Remembered messageIds: periods, their filters, what a call reads, retention by period, a store from before."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, inspect, select
from sqlalchemy.engine import Engine

from prefect_webhooks.inbound.ingestion import ingest_batch
from prefect_webhooks.store.dedupe import seen_ids
from prefect_webhooks.store.dedupe.seen_ids import (
    LEGACY,
    PERIOD_LIST,
    hold_seen_filters,
    message_key,
    remember_receipts,
    remembered_ids,
    seal_periods,
    seen_receipts,
)
from prefect_webhooks.store.engine.engines import dispose_engines, get_engine, insert_rows
from prefect_webhooks.store.schema.tables import store_now
from prefect_webhooks.store.upkeep.retention import RetentionPolicy, prune_store
from tests.inbound.test_ingestion import SOURCE, track


def test_the_same_id_from_two_sources_is_two_keys() -> None:
    assert message_key("web", "m1") != message_key("mobile", "m1")
    assert message_key("web", "m1") == message_key("web", "m1")


def remember(engine: Engine, ids: list[str], at: datetime) -> None:
    with engine.begin() as connection:
        remember_receipts(connection, "web", [(message_id, at) for message_id in ids])


def look_up(engine: Engine, ids: list[str], since: datetime) -> dict[str, datetime]:
    with engine.connect() as connection:
        return seen_receipts(connection, "web", ids, since)


def test_a_repeat_is_found_in_a_sealed_period_through_its_filter_and_in_an_open_one(backend_url: str) -> None:
    engine = get_engine(backend_url)
    now = store_now()
    remember(engine, ["old-1", "old-2"], now - timedelta(hours=2))
    remember(engine, ["new-1"], now)
    assert seal_periods(engine) == 1  # the period of two hours ago; the open one waits for ``SEALED_AFTER``
    found = look_up(engine, ["old-1", "new-1", "never"], now - timedelta(hours=3))
    assert set(found) == {"old-1", "new-1"}
    assert abs((found["old-1"] - (now - timedelta(hours=2))).total_seconds()) < 0.01
    # Outside ``since``, the old period is not looked at.
    assert set(look_up(engine, ["old-1", "new-1"], now - timedelta(hours=1))) == {"new-1"}
    assert remembered_ids(engine) == 3


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many keys each lookup of a period's table asked for, as handed to the driver (SQLite: the lookup goes
    straight to its cursor, past SQLAlchemy's events)."""
    asked: list[int] = []
    handed = seen_ids.driver_rows

    def count(connection: Any, statement: str, parameters: Any = ()) -> Any:
        if statement.startswith("SELECT key, received_ms FROM"):
            asked.append(len(parameters))
        return handed(connection, statement, parameters)

    monkeypatch.setattr(seen_ids, "driver_rows", count)
    yield asked


def test_a_call_of_new_ids_reads_the_sealed_periods_only_where_their_filters_hit(
    store_url: str, lookups: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seen_ids, "IDS_PER_PERIOD", 500)  # a minute holds 1,000 ids: one period per minute
    asked_to_seal: list[Engine] = []
    monkeypatch.setattr(seen_ids, "_seal_in_background", lambda engine, _memory: asked_to_seal.append(engine))
    engine = get_engine(store_url)
    start = store_now().replace(second=0, microsecond=0) - timedelta(hours=1)
    for minute in range(20):
        remember(engine, [f"m{minute}-{n}" for n in range(1_000)], start + timedelta(minutes=minute))
    with engine.connect() as connection:
        assert len(connection.execute(select(PERIOD_LIST.c.name)).all()) == 20
    new_ids = [f"new-{n}" for n in range(1_000)]
    assert look_up(engine, new_ids, start) == {}
    assert sum(lookups) == 20_000  # no filter yet: every period reads every id
    assert asked_to_seal == [engine]  # and the call asked for the filters to be built, out of its way
    lookups.clear()
    assert seal_periods(engine) == 20
    assert look_up(engine, new_ids, start) == {}
    # With the filters, only their false hits (about 1 in 2,000 per period) are looked up: not 20,000 keys.
    assert sum(lookups) <= 50, lookups
    lookups.clear()
    repeats = [f"m{minute}-7" for minute in range(20)]
    assert set(look_up(engine, repeats + new_ids[:10], start)) == set(repeats)


def test_a_process_that_holds_the_filters_at_start_reads_none_in_its_first_call(backend_url: str) -> None:
    """``serve``'s API reads the sealed periods' filters before it takes a call (seconds with 50M ids in the
    window); its first dedupe then reads no filter in its transaction."""
    engine = get_engine(backend_url)
    now = store_now()
    remember(engine, ["old-1"], now - timedelta(hours=2))
    remember(engine, ["older-1"], now - timedelta(hours=3))
    assert seal_periods(engine) == 2
    dispose_engines()  # a new process: nothing held
    engine = get_engine(backend_url)
    assert hold_seen_filters(engine) == 2
    read_filters: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "id_filter" in statement and "CASE" not in statement:
            read_filters.append(statement)

    event.listen(engine, "before_cursor_execute", note)
    try:
        assert set(look_up(engine, ["old-1", "older-1", "new"], now - timedelta(hours=4))) == {"old-1", "older-1"}
    finally:
        event.remove(engine, "before_cursor_execute", note)
    assert read_filters == []


def test_retention_drops_a_period_whole_once_it_is_older_than_the_window(backend_url: str) -> None:
    engine = get_engine(backend_url)
    now = store_now()
    remember(engine, [f"a{n}" for n in range(7)], now - timedelta(hours=3))
    remember(engine, [f"b{n}" for n in range(3)], now - timedelta(minutes=30))
    with engine.connect() as connection:
        old, recent = (row.name for row in connection.execute(
            select(PERIOD_LIST.c.name).order_by(PERIOD_LIST.c.starts_at)))
    report = prune_store(engine, RetentionPolicy(60, 3600, 3600), now=now)
    assert report.removed["seen_message_ids"] == 7
    tables = set(inspect(engine).get_table_names())
    assert old not in tables and recent in tables
    assert set(look_up(engine, ["a1", "b1"], now - timedelta(days=1))) == {"b1"}


def test_a_store_from_before_the_periods_still_drops_the_repeats_it_remembered(backend_url: str) -> None:
    engine = get_engine(backend_url)
    with engine.begin() as connection:
        LEGACY.create(connection)  # what today's release remembered
        insert_rows(connection, LEGACY, [{"source": "web", "message_id": "m1",
                                          "received_at": store_now() - timedelta(hours=1)},
                                         {"source": "web", "message_id": "m2",
                                          "received_at": store_now() - timedelta(days=2)}])
    result = ingest_batch([track("m1"), track("m2"), track("m3")], SOURCE)
    assert (result.accepted, result.duplicates) == (2, 1)  # m2 is older than the window
    again = ingest_batch([track("m2"), track("m3")], SOURCE)
    assert (again.accepted, again.duplicates) == (0, 2)  # now remembered in the periods


def test_a_call_that_meets_a_sealed_period_without_a_filter_has_it_built_beside_it(store_url: str) -> None:
    engine = get_engine(store_url)
    remember(engine, ["old-1"], store_now() - timedelta(hours=2))
    assert set(look_up(engine, ["old-1", "x"], store_now() - timedelta(hours=3))) == {"old-1"}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with engine.connect() as connection:
            built = connection.execute(select(PERIOD_LIST.c.ids).where(PERIOD_LIST.c.id_filter.is_not(None))).all()
            if built == [(1,)]:
                break
        time.sleep(0.05)
    else:
        pytest.fail("no filter was built for the sealed period")
    assert set(look_up(engine, ["old-1", "x"], store_now() - timedelta(hours=3))) == {"old-1"}
