"""The ingest API's single writer: group commit, duplicates across requests, load shedding, planner statistics."""

from __future__ import annotations

import asyncio

import pytest

from prefect_webhooks.inbound.batch_writer import BatchWriter, OverloadedError
from prefect_webhooks.inbound.ingestion import prepare_batch
from prefect_webhooks.store.engine.engines import get_engine
from tests.inbound.test_ingestion import SOURCE, outbox, track


async def test_batch_writer_group_commits_concurrent_batches(store_url: str) -> None:
    writer = BatchWriter(get_engine(store_url))
    try:
        batches = [prepare_batch([track(f"m{i}-{j}") for j in range(10)], SOURCE) for i in range(20)]
        results = await asyncio.gather(*(writer.submit(batch) for batch in batches))
    finally:
        await writer.stop()
    assert [r.accepted for r in results] == [10] * 20
    assert len(outbox(store_url)) == 400
    assert writer.pending == 0


async def test_batch_writer_answers_duplicates_across_concurrent_batches(store_url: str) -> None:
    writer = BatchWriter(get_engine(store_url))
    try:
        results = await asyncio.gather(*(writer.submit(prepare_batch([track("same")], SOURCE)) for _ in range(5)))
    finally:
        await writer.stop()
    assert sorted(r.accepted for r in results) == [0, 0, 0, 0, 1]
    assert sum(r.duplicates for r in results) == 4


async def test_batch_writer_sheds_load_past_max_pending(store_url: str) -> None:
    writer = BatchWriter(get_engine(store_url), max_pending=15)
    first = asyncio.ensure_future(writer.submit(prepare_batch([track(f"a{i}") for i in range(10)], SOURCE)))
    await asyncio.sleep(0)  # the first batch is waiting, not yet written
    with pytest.raises(OverloadedError):
        await writer.submit(prepare_batch([track(f"b{i}") for i in range(10)], SOURCE))
    assert (await first).accepted == 10
    assert (await writer.submit(prepare_batch([track(f"c{i}") for i in range(10)], SOURCE))).accepted == 10
    await writer.stop()


async def test_batch_writer_gives_a_new_postgres_queue_statistics() -> None:

    from tests.conftest import _fresh_postgres_database, postgres_server

    server = postgres_server()
    engine = get_engine(_fresh_postgres_database(server))
    writer = BatchWriter(engine)
    for start in range(0, 12_000, 2_000):
        await asyncio.gather(*(writer.submit(prepare_batch([track(f"m{start + i}-{j}") for j in range(100)], SOURCE))
                               for i in range(0, 2_000, 100)))
    await writer.stop()
    with engine.connect() as connection:
        (tuples,) = connection.exec_driver_sql("SELECT reltuples FROM pg_class WHERE relname = 'outbox'").scalars()
    # Analysed at 10,000 calls written, before autovacuum's first pass (never analysed: -1).
    assert tuples >= 20_000
    engine.dispose()
