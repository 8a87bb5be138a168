"""Sealed partitions of the message log: lookups read only those whose filters and id range may hold the key, find
every message all the same, and a partition that gets messages after its seal is read whole until sealed again."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import event, select

from prefect_webhooks.deletions.processing import purge_user
from prefect_webhooks.messages.outcomes import Attempt
from prefect_webhooks.messages.payloads import serialize
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.log.filters import hold_filters, may_hold, seal_log_partitions
from prefect_webhooks.store.log.message_log import find_kept
from prefect_webhooks.store.log.names import name_ids
from prefect_webhooks.store.log.partitions import PARTITIONS, SEALS, STATE_CODES, kept_partitions, partitions_for
from prefect_webhooks.store.log.records import RecordContent, epoch_ms, pack_record, text_key
from prefect_webhooks.store.queue.outbox import add_to_outbox, outbox_rows
from prefect_webhooks.store.schema.bulk_insert import insert_rows
from prefect_webhooks.store.schema.tables import store_now
from prefect_webhooks.store.upkeep.retention import prune_store
from tests.store.test_message_log import deliver_all, track


def keep_finished_at(engine, number: int, message_id: str, user: str, finished: datetime) -> None:  # type: ignore[no-untyped-def]
    """Write one delivered message into the log's partition of ``finished``, as history written into the past is."""
    with engine.begin() as connection:
        names = name_ids(connection, ["crm", "web", "https://hooks.example.com/in"])
        content = RecordContent("track", "web", message_id, user, None, 1, finished, finished,
                                serialize(track(user)),
                                [Attempt(0, finished, "https://hooks.example.com/in", 200, None, 9.0, "delivered")])
        (partition,) = partitions_for(connection, {("delivered", finished)}).values()
        insert_rows(connection, partition.table, [{
            "id": number, "destination_id": names["crm"], "state": STATE_CODES["delivered"],
            "finished_ms": epoch_ms(finished), "message_key": text_key(message_id), "user_key": text_key(user),
            "source_id": names["web"], "record": pack_record(content, finished, names)}])


def sealed_rows(engine) -> dict[str, tuple]:  # type: ignore[no-untyped-def]
    """Per listed partition: its count, and its seal's count and id range (None when it has no seal)."""
    with engine.connect() as connection:
        seals = {name: (messages, lowest, highest) for name, messages, lowest, highest in connection.execute(
            select(SEALS.c.name, SEALS.c.messages, SEALS.c.lowest_id, SEALS.c.highest_id))}
        return {name: (messages, seals.get(name)) for name, messages in
                connection.execute(select(PARTITIONS.c.name, PARTITIONS.c.messages))}


def test_lookups_read_only_the_sealed_partitions_that_may_hold_the_key(backend_url: str) -> None:
    engine = get_engine(backend_url)
    with engine.begin() as connection:
        add_to_outbox(connection, outbox_rows("crm", [track("ann", n) for n in range(3)], source="web",
                                              message_ids=["m-0", "m-1", "m-2"]))
    deliver_all(engine, {})
    # As the pruning pass seals a partition once its period has ended: here the current one, an hour on.
    assert seal_log_partitions(engine, now=store_now() + timedelta(hours=1)) == 1
    ((name, sealed),) = sealed_rows(engine).items()
    assert sealed == (3, (3, 1, 3))
    with engine.connect() as connection:
        partitions = kept_partitions(connection)
        assert [p.name for p in may_hold(connection, partitions, message_id="m-1")] == [name]
        assert may_hold(connection, partitions, message_id="m-9") == []
        assert may_hold(connection, partitions, user_id="bob") == []
        assert may_hold(connection, partitions, ids=[7, 9]) == []
        assert [p.name for p in may_hold(connection, partitions, ids=[2])] == [name]
        (found,) = find_kept(connection, message_id="m-1")
        assert (found.id, found.content.user_id) == (2, "ann")
        assert [m.id for m in find_kept(connection, user_id="ann")] == [3, 2, 1]
        assert [m.id for m in find_kept(connection, ids=[3, 7])] == [3]
        assert find_kept(connection, message_id="m-9") == find_kept(connection, user_id="bob") == []


def test_a_user_in_some_partitions_is_looked_up_in_those_only(
    backend_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ann is in five sealed partitions, bob in two of them: bob's lookup reads his two, not all five."""
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETENTION_DELIVERED", "3600")  # partitions of at most 15 minutes
    get_settings.cache_clear()
    engine = get_engine(backend_url)
    start = (store_now() - timedelta(hours=6)).replace(minute=0, second=20, microsecond=0)
    for hour in range(5):
        keep_finished_at(engine, 10 + hour, f"ann-{hour}", "ann", start + timedelta(hours=hour))
    for hour in range(2):
        keep_finished_at(engine, 20 + hour, f"bob-{hour}", "bob", start + timedelta(hours=hour))
    assert seal_log_partitions(engine) == 5
    get_settings.cache_clear()
    with engine.connect() as connection:
        partitions = kept_partitions(connection)
        assert len(may_hold(connection, partitions, user_id="ann")) == 5
        assert len(may_hold(connection, partitions, user_id="bob")) == 2
        assert [m.id for m in find_kept(connection, user_id="bob", limit=5)] == [21, 20]


def test_a_partition_that_gets_messages_after_its_seal_is_read_whole_until_sealed_again(backend_url: str) -> None:
    engine = get_engine(backend_url)
    # 20 s into its minute: the message a second later lands in the same one-minute partition.
    an_hour_ago = (store_now() - timedelta(hours=1)).replace(second=20, microsecond=0)
    keep_finished_at(engine, 10, "old-1", "carol", an_hour_ago)
    prune_store(engine)  # the pruning pass seals partitions whose period ended
    ((name, sealed),) = sealed_rows(engine).items()
    assert sealed == (1, (1, 10, 10))
    keep_finished_at(engine, 11, "old-2", "dave", an_hour_ago + timedelta(seconds=1))
    assert sealed_rows(engine)[name] == (None, None)
    with engine.connect() as connection:
        assert [m.id for m in find_kept(connection, message_id="old-2")] == [11]
        assert [m.id for m in find_kept(connection, user_id="dave")] == [11]
        assert [m.id for m in find_kept(connection, ids=[11])] == [11]
    prune_store(engine)
    assert sealed_rows(engine)[name] == (2, (2, 10, 11))
    with engine.connect() as connection:
        # The process read the first seal's filters; the second seal's (one more message) replace them.
        assert [m.id for m in find_kept(connection, message_id="old-2")] == [11]
        assert [m.id for m in find_kept(connection, user_id="carol")] == [10]
        assert find_kept(connection, user_id="erin") == []


def test_a_process_that_serves_lookups_holds_the_filters_before_its_first_lookup(backend_url: str) -> None:
    engine = get_engine(backend_url)
    keep_finished_at(engine, 20, "early-1", "erin", store_now() - timedelta(hours=1))
    assert seal_log_partitions(engine) == 1
    assert hold_filters(engine) == 1
    blobs: list[str] = []

    def note(_connection, _cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        if "message_filter" in statement or "user_filter" in statement:
            blobs.append(statement)

    event.listen(engine, "before_cursor_execute", note)
    try:
        with engine.connect() as connection:
            (found,) = find_kept(connection, message_id="early-1")
            assert [m.id for m in find_kept(connection, user_id="erin")] == [found.id] == [20]
    finally:
        event.remove(engine, "before_cursor_execute", note)
    assert blobs == []  # both kinds of filter were read at start, none at the lookups


def test_a_partition_holding_messages_a_deletion_request_purged_is_sealed(backend_url: str) -> None:
    """A purged message keeps neither key; sealing its partition counts it and filters the others' keys (a keyless
    row once stopped every pruning pass at the seal)."""
    engine = get_engine(backend_url)
    with engine.begin() as connection:
        add_to_outbox(connection, outbox_rows("crm", [track("ann"), track("bob")], source="web",
                                              message_ids=["m-ann", "m-bob"]))
    deliver_all(engine, {})
    with engine.begin() as connection:
        add_to_outbox(connection, outbox_rows("crm", [track("bob", 1)], source="web", message_ids=["m-bob-queued"]))
        # bob's kept message loses its keys; his queued one leaves the queue as failed, with none.
        assert purge_user(connection, "bob", "deleted: request 1") == (1, 1, 0)

    assert seal_log_partitions(engine, now=store_now() + timedelta(hours=1)) == 2
    assert sorted(sealed_rows(engine).values()) == [(1, (1, 3, 3)), (2, (2, 1, 2))]
    with engine.connect() as connection:
        assert [m.id for m in find_kept(connection, message_id="m-ann")] == [1]
        assert find_kept(connection, user_id="bob") == find_kept(connection, message_id="m-bob") == []
        assert len(find_kept(connection)) == 3
    assert prune_store(engine).removed["delivered"] == 0
