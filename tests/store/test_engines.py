"""Opening a store: processes starting on a new SQLite store at the same moment (serve's ingest API, delivery
workers, pruner) all find it ready."""

from __future__ import annotations

import multiprocessing
from pathlib import Path


def open_store(url: str, ready: multiprocessing.synchronize.Barrier) -> None:
    from prefect_webhooks.store.engine.engines import get_engine

    ready.wait()
    get_engine(url)


def test_processes_opening_a_new_store_at_once_all_succeed(tmp_path: Path) -> None:
    # Seen in CI: "table outbox already exists" from one of serve's parts, and "database is locked" from the switch
    # to WAL. Four processes released together on each of four new stores.
    # spawn, not fork: a fork of a test process whose other threads hold locks could hang for reasons of its own.
    context = multiprocessing.get_context("spawn")
    exit_codes = []
    for round_ in range(4):
        url = f"sqlite:///{tmp_path / f'store-{round_}' / 'webhooks.db'}"
        ready = context.Barrier(4)
        processes = [context.Process(target=open_store, args=(url, ready)) for _ in range(4)]
        for process in processes:
            process.start()
        for process in processes:
            process.join(120)
        exit_codes += [process.exitcode for process in processes]
    assert exit_codes == [0] * 16


def test_a_column_a_later_release_added_is_added_to_an_existing_store(backend_url: str) -> None:
    # The message log's partition list got its ``messages`` count after stores with the list existed.
    from sqlalchemy import inspect

    from prefect_webhooks.store.engine.engines import create_schema, get_engine

    engine = get_engine(backend_url)
    with engine.begin() as connection:
        connection.exec_driver_sql("ALTER TABLE message_log_partitions DROP COLUMN messages")
    create_schema(engine)
    columns = {column["name"]: column for column in inspect(engine).get_columns("message_log_partitions")}
    assert "messages" in columns and columns["messages"]["nullable"]
