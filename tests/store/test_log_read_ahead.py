"""Reading a lookup's partitions ahead: past its first group, the partitions left are read on side connections of
a SQLite file store, several at once; the lookup's answer and its own reads are what they were."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from datetime import timedelta

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from prefect_webhooks.messages.outcomes import DELIVERED
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store import log_read_ahead
from prefect_webhooks.store.log_read_ahead import read_ahead
from prefect_webhooks.store.log_statements import lookup_parameters
from prefect_webhooks.store.message_log import find_kept
from tests.store.test_message_log import newest_first, partitions_read, queued_for_short_partitions
from tests.stored import finish


def read_ahead_of(names: list[str]) -> AbstractContextManager[list[str]]:
    """Which of ``names`` the read-ahead threads read meanwhile (on any engine: theirs is private)."""
    return partitions_read(Engine, names, threads_named="log-read-ahead")


def twelve_partitions(backend_url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Engine, list[str]]:
    """Twelve partitions an hour apart, two of ann's messages in each (ids 1-24, oldest first)."""
    engine, now = queued_for_short_partitions(backend_url, monkeypatch, 24)
    for hour in range(12):
        finish(engine, [1 + 2 * hour, 2 + 2 * hour], DELIVERED, at=now - timedelta(hours=12 - hour, minutes=30))
    with engine.connect() as connection:
        names = newest_first(connection)
    get_settings.cache_clear()
    assert len(names) == 12
    return engine, names


def test_a_lookup_past_its_first_group_reads_the_partitions_left_ahead_and_answers_as_without(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, names = twelve_partitions(store_url, monkeypatch)
    # The lookup's second statement waits until the reads ahead have read what is left, so that the test sees them
    # all: a lookup does not wait for them.
    first_statement_done = threading.Event()

    def hold_second_statement(_connection, _cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        if names[3] in statement and first_statement_done.is_set():
            for _ in range(500):
                if set(ahead) >= set(names[3:]):
                    return
                threading.Event().wait(0.01)
        if names[0] in statement:
            first_statement_done.set()

    with engine.connect() as connection, read_ahead_of(names) as ahead, partitions_read(engine, names) as own:
        event.listen(engine, "before_cursor_execute", hold_second_statement)
        try:
            everything = find_kept(connection, user_id="ann", limit=50)
        finally:
            event.remove(engine, "before_cursor_execute", hold_second_statement)
    # Read ahead: every partition past the first group (three), none of the first, each once, in statements of a
    # few partitions.
    assert sorted(ahead) == sorted(names[3:])
    # The lookup read each partition once itself, and answers as it does without reading ahead.
    assert sorted(own) == sorted(names)
    assert [m.id for m in everything] == list(range(24, 0, -1))
    monkeypatch.setattr("prefect_webhooks.store.message_log.can_read_ahead", lambda _connection: False)
    with engine.connect() as connection:
        assert [m.id for m in find_kept(connection, user_id="ann", limit=50)] == [m.id for m in everything]


def test_a_lookup_its_first_group_answers_reads_nothing_ahead(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, names = twelve_partitions(store_url, monkeypatch)
    with engine.connect() as connection, read_ahead_of(names) as ahead:
        newest = find_kept(connection, user_id="ann", limit=4)
    assert [m.id for m in newest] == [24, 23, 22, 21]
    assert ahead == []


def test_a_partition_gone_before_its_read_ahead_leaves_the_lookup_and_the_readers_working(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, names = twelve_partitions(store_url, monkeypatch)
    parameters = lookup_parameters(user_id="ann", limit=50)
    with engine.connect() as connection, read_ahead_of(names) as ahead:
        # Retention dropped it between the lookup's listing and its read ahead: that read fails, quietly.
        read_ahead(connection, ["log_delivered_202601010000_3600"], parameters)
        read_ahead(connection, names[4:8], parameters)
        for _ in range(500):
            if len(ahead) >= 4:
                break
            threading.Event().wait(0.01)
        assert sorted(ahead) == sorted(names[4:8])
        assert len(find_kept(connection, user_id="ann", limit=50)) == 24


def test_only_a_sqlite_file_is_read_ahead(backend_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    engine, names = twelve_partitions(backend_url, monkeypatch)
    with engine.connect() as connection:
        assert log_read_ahead.can_read_ahead(connection) == (engine.dialect.name == "sqlite")
