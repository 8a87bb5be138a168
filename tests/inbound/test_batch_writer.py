"""The ingest API's single writer: group commit, duplicates across requests, load shedding, planner statistics."""

from __future__ import annotations

import asyncio
import time

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


@pytest.mark.postgres
@pytest.mark.parametrize("off_loop", [True, False], ids=["in-a-thread", "on-the-loop"])
async def test_a_commit_held_up_by_postgres_leaves_the_loop_free(postgres_url: str, off_loop: bool) -> None:
    """On PostgreSQL the group commit waits for the database in a thread: a commit held up for 2 s by a lock another
    connection holds (another host's transaction) leaves the event loop answering (``/health``, other requests'
    reading) within a fraction of a second. On the loop, as SQLite runs it, the loop stops for those 2 s."""
    import threading

    import psycopg

    engine = get_engine(postgres_url)
    assert BatchWriter(engine).off_loop, "on PostgreSQL the writer works in a thread by default"
    writer = BatchWriter(engine, off_loop=off_loop)
    locked, held_for = threading.Event(), 2.0

    def hold_the_queue() -> None:
        with psycopg.connect(postgres_url) as holder:
            holder.execute("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
            locked.set()
            time.sleep(held_for)
            holder.rollback()

    holding = threading.Thread(target=hold_the_queue)
    holding.start()
    assert await asyncio.to_thread(locked.wait, 10)
    loop = asyncio.get_running_loop()
    started = loop.time()
    written = asyncio.ensure_future(writer.submit(prepare_batch([track("held")], SOURCE)))
    lags, done_early = [], False
    while loop.time() - started < held_for + 0.5:
        asked = loop.time()
        await asyncio.sleep(0.05)
        lags.append(loop.time() - asked - 0.05)
        done_early = done_early or (written.done() and loop.time() - started < held_for * 0.75)
    assert (await written).accepted == 1
    await writer.stop()
    await asyncio.to_thread(holding.join, 10)
    assert not done_early, "the lock must hold the commit up"
    if off_loop:
        assert max(lags) < 0.5, f"the loop stopped for {max(lags):.2f} s during the commit"
    else:
        assert max(lags) > 1.0, "on the loop, the held commit stops the loop (the case the thread is for)"
