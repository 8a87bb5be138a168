"""The message log beside the queue: what leaves the queue, how it is kept and found, and an older store upgraded."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import orjson
import pytest
from sqlalchemy import event, func, inspect, select, text
from sqlalchemy.engine import Connection, Engine

from prefect_webhooks.messages.outcomes import (
    DELIVERED,
    FAILED,
    FILTERED,
    PENDING,
    Attempt,
    Delivered,
    Failed,
    Filtered,
    OutcomeRecords,
    Rescheduled,
)
from prefect_webhooks.messages.payloads import serialize
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import dispose_engines, get_engine
from prefect_webhooks.store.figures.counters import outcome_totals
from prefect_webhooks.store.figures.minute_counts import top_reasons
from prefect_webhooks.store.log.message_log import find_kept, next_group_size
from prefect_webhooks.store.log.partitions import kept_partitions, partition_period
from prefect_webhooks.store.log.records import PackedRecord, RecordContent, pack_record
from prefect_webhooks.store.queue.outbox import (
    ATTEMPTS,
    OUTBOX,
    add_to_outbox,
    claim_due_deliveries,
    enqueue,
    outbox_rows,
    record_outcomes,
)
from prefect_webhooks.store.queue.replay import replay_failed
from prefect_webhooks.store.schema.tables import store_now
from tests.stored import every_attempt, every_message, finish, to_ms


def track(user: str, n: int = 0) -> dict:
    return {"version": 1, "type": "track", "userId": user, "timestamp": "2026-11-26T10:00:00.000Z",
            "event": "Order Completed", "properties": {"revenue": 19.99, "currency": "EUR", "n": n}}


def deliver_all(engine, outcomes: dict[int, str]) -> None:  # type: ignore[no-untyped-def]
    """Claim every due message and give each the outcome ``outcomes`` names (delivered by default)."""
    claimed = claim_due_deliveries(engine, 1000, "test")
    now = store_now()
    records = OutcomeRecords()
    for row in claimed:
        outcome = outcomes.get(row.id, DELIVERED)
        if outcome == DELIVERED:
            records.delivered.append(Delivered(row.id, 1, now, now, row.destination))
        elif outcome == FAILED:
            records.failed.append(Failed(row.id, "permanent: HTTP 410", 1, now, row.destination))
        else:
            records.filtered.append(Filtered(row.id, "filtered: drop rule 'debug'", row.destination))
        if outcome != FILTERED:
            records.attempts.append(Attempt(row.id, now, "https://hooks.example.com/in", 200 if outcome == DELIVERED
                                            else 410, None, 12.5, "delivered" if outcome == DELIVERED else "permanent"))
    record_outcomes(engine, records)


def test_a_finished_message_leaves_the_queue_with_its_attempts_and_keeps_its_id(backend_url: str) -> None:
    engine = get_engine(backend_url)
    enqueue("crm", [track("u1"), track("u2"), track("u3"), track("u4")], source="web")
    deliver_all(engine, {2: FAILED, 3: FILTERED})
    with engine.connect() as connection:
        queued = connection.execute(select(OUTBOX.c.id, OUTBOX.c.state)).all()
        assert connection.execute(select(func.count()).select_from(ATTEMPTS)).scalar_one() == 0
        kept = {message.id: message for message in find_kept(connection)}
    assert queued == []
    assert {i: kept[i].state for i in kept} == {1: DELIVERED, 2: FAILED, 3: FILTERED, 4: DELIVERED}
    assert kept[2].content.reason == "permanent: HTTP 410" and kept[3].content.tries == []
    assert orjson.loads(kept[1].content.body or b"") == track("u1")
    assert [(a.status_code, a.url) for a in kept[1].content.tries] == [(200, "https://hooks.example.com/in")]
    assert (kept[1].content.source, kept[1].destination, kept[1].content.user_id) == ("web", "crm", "u1")
    # The next message gets a new id, never one a kept message has (its webhook-id names it to receivers).
    enqueue("crm", [track("u5")], source="web")
    assert [message.id for message in every_message(engine, state=PENDING)] == [5]


def test_attempts_of_a_stalled_worker_join_the_kept_message_after_another_worker_finished_it(
        backend_url: str) -> None:
    """A worker stalled past its lease records its outcomes after another worker took its rows over and delivered
    them: the receiver got the stalled worker's requests too, so each is in the message's history (none dropped,
    none left in the queue's attempts), and the messages count as delivered once."""
    engine = get_engine(backend_url)
    enqueue("crm", [track("u1"), track("u2")])
    stalled = claim_due_deliveries(engine, 10, "stalled", lease_seconds=0.01)
    with engine.begin() as connection:
        connection.execute(OUTBOX.update().values(lease_expires_at=store_now() - timedelta(seconds=1)))
    deliver_all(engine, {})  # the other worker: both delivered
    late = store_now()
    records = OutcomeRecords()
    records.delivered.append(Delivered(stalled[0].id, 1, late, late, "crm"))
    records.rescheduled.append(Rescheduled(stalled[1].id, 1, late, "HTTP 503", late + timedelta(seconds=5)))
    records.attempts += [Attempt(row.id, late, "https://hooks.example.com/in?token=x", status, None, 7.0, outcome)
                         for row, status, outcome in ((stalled[0], 200, "delivered"), (stalled[1], 503, "retry"))]
    record_outcomes(engine, records)
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(ATTEMPTS)).scalar_one() == 0
        assert connection.execute(select(func.count()).select_from(OUTBOX)).scalar_one() == 0
        kept = {message.id: message for message in find_kept(connection)}
    assert {i: m.state for i, m in kept.items()} == {1: DELIVERED, 2: DELIVERED}
    assert [a.status_code for a in kept[1].content.tries] == [200, 200]
    assert [a.status_code for a in kept[2].content.tries] == [200, 503]
    assert orjson.loads(kept[2].content.body or b"") == track("u2")


def test_a_stalled_worker_does_not_reschedule_a_message_another_worker_holds_now(backend_url: str) -> None:
    """Rescheduling is fenced by the lease: the other worker's live lease stays (clearing it would let a third claim
    send the message again), and the stalled worker's attempt is kept beside the queued message."""
    engine = get_engine(backend_url)
    enqueue("crm", [track("u1")])
    (row,) = claim_due_deliveries(engine, 10, "stalled", lease_seconds=0.01)
    with engine.begin() as connection:
        connection.execute(OUTBOX.update().values(lease_expires_at=store_now() - timedelta(seconds=1)))
    assert [claimed.id for claimed in claim_due_deliveries(engine, 10, "other", lease_seconds=60)] == [row.id]
    late = store_now()
    records = OutcomeRecords(owner="stalled")
    records.rescheduled.append(Rescheduled(row.id, 1, late, "HTTP 503", late))
    records.attempts.append(Attempt(row.id, late, "https://hooks.example.com/in", 503, None, 7.0, "retry"))
    record_outcomes(engine, records)
    with engine.connect() as connection:
        queued = connection.execute(select(OUTBOX.c.lease_owner, OUTBOX.c.attempts, OUTBOX.c.reason)).one()
    assert tuple(queued) == ("other", 0, None)
    assert [(a.outbox_id, a.status_code) for a in every_attempt(engine)] == [(row.id, 503)]
    # The worker that holds it reschedules it as usual.
    records = OutcomeRecords(owner="other")
    records.rescheduled.append(Rescheduled(row.id, 1, late, "HTTP 502", late))
    record_outcomes(engine, records)
    with engine.connect() as connection:
        assert tuple(connection.execute(select(OUTBOX.c.lease_owner, OUTBOX.c.reason)).one()) == (None, "HTTP 502")


def test_a_stalled_worker_does_not_fail_a_message_another_worker_holds_now(backend_url: str) -> None:
    """Failing is fenced by the lease too: the worker that took the message over may yet deliver it, so it stays
    queued under that worker's lease and the stalled worker's attempt is kept beside it. A delivery is not fenced:
    the receiver has the message, whichever worker sent it."""
    engine = get_engine(backend_url)
    enqueue("crm", [track("u1"), track("u2")])
    first, second = claim_due_deliveries(engine, 10, "stalled", lease_seconds=0.01)
    with engine.begin() as connection:
        connection.execute(OUTBOX.update().values(lease_expires_at=store_now() - timedelta(seconds=1)))
    assert len(claim_due_deliveries(engine, 10, "other", lease_seconds=60)) == 2
    late = store_now()
    records = OutcomeRecords(owner="stalled")
    records.failed.append(Failed(first.id, "HTTP 400", 1, late, "crm"))
    records.delivered.append(Delivered(second.id, 1, late, late, "crm"))
    records.attempts += [Attempt(first.id, late, "https://hooks.example.com/in", 400, None, 7.0, "permanent"),
                         Attempt(second.id, late, "https://hooks.example.com/in", 200, None, 7.0, "delivered")]
    record_outcomes(engine, records)
    with engine.connect() as connection:
        queued = connection.execute(select(OUTBOX.c.id, OUTBOX.c.lease_owner, OUTBOX.c.state)).all()
        beside = connection.execute(select(ATTEMPTS.c.outbox_id, ATTEMPTS.c.status_code)).all()
    assert [tuple(row) for row in queued] == [(first.id, "other", PENDING)]
    assert [tuple(row) for row in beside] == [(first.id, 400)]
    assert {message.id: message.state for message in every_message(engine)} == {first.id: PENDING,
                                                                                 second.id: DELIVERED}
    # Nor does the failure the fence kept queued count: not in the totals, not among the minute's failure reasons.
    with engine.connect() as connection:
        assert outcome_totals(connection) == {"crm": {DELIVERED: 1}}
        assert top_reasons(connection, "crm", store_now()) == []
    # The worker that holds it now delivers it: its history has both requests.
    records = OutcomeRecords(owner="other")
    records.delivered.append(Delivered(first.id, 2, late, store_now(), "crm"))
    records.attempts.append(Attempt(first.id, store_now(), "https://hooks.example.com/in", 200, None, 5.0,
                                    "delivered"))
    record_outcomes(engine, records)
    with engine.connect() as connection:
        (kept,) = find_kept(connection, ids=[first.id])
    assert kept.state == DELIVERED
    assert [attempt.status_code for attempt in kept.content.tries] == [400, 200]


def test_a_new_id_after_a_restart_with_an_empty_queue_is_still_new(backend_url: str) -> None:
    engine = get_engine(backend_url)
    enqueue("crm", [track("u1"), track("u2")])
    deliver_all(engine, {})
    dispose_engines()
    engine = get_engine(backend_url)
    enqueue("crm", [track("u3")])
    assert [message.id for message in every_message(engine)] == [1, 2, 3]


def test_lookups_by_message_id_user_and_destination_and_time(backend_url: str) -> None:
    engine = get_engine(backend_url)
    with engine.begin() as connection:
        add_to_outbox(connection, outbox_rows("crm", [track("ann", n) for n in range(3)], source="web",
                                              message_ids=["m-0", "m-1", "m-2"]))
        add_to_outbox(connection, outbox_rows("ads", [track("bob")], source="ios", message_ids=["m-3"]))
    deliver_all(engine, {})
    before = store_now() - timedelta(minutes=1)
    with engine.connect() as connection:
        (found,) = find_kept(connection, message_id="m-1")
        assert (found.id, found.content.user_id, found.destination) == (2, "ann", "crm")
        assert [m.id for m in find_kept(connection, user_id="ann")] == [3, 2, 1]  # newest first
        assert [m.id for m in find_kept(connection, user_id="ann", limit=2)] == [3, 2]
        assert [m.id for m in find_kept(connection, destination="ads", since=before)] == [4]
        assert find_kept(connection, destination="ads", until=before) == []
        assert find_kept(connection, destination="nowhere") == []
        assert find_kept(connection, message_id="m-9") == []
        assert [m.id for m in find_kept(connection, states=[FAILED])] == []


def queued_for_short_partitions(
    backend_url: str, monkeypatch: pytest.MonkeyPatch, count: int
) -> tuple[Engine, datetime]:
    """``count`` of ann's messages queued, with partitions of at most 15 minutes (one hour's retention); the store
    and its time."""
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETENTION_DELIVERED", "3600")
    get_settings.cache_clear()
    engine = get_engine(backend_url)
    assert enqueue("crm", [track("ann", n) for n in range(count)], source="web") == count
    return engine, store_now()


def newest_first(connection: Connection) -> list[str]:
    """The names of the kept partitions, newest period first."""
    return [p.name for p in sorted(kept_partitions(connection), key=lambda p: p.ends_at, reverse=True)]


@contextmanager
def partitions_read(engine: Engine, names: list[str]) -> Iterator[list[str]]:
    """Which of ``names`` the statements run meanwhile read, in the order read."""
    read: list[str] = []

    def note(_connection, _cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        read.extend(name for name in names if name in statement)

    event.listen(engine, "before_cursor_execute", note)
    try:
        yield read
    finally:
        event.remove(engine, "before_cursor_execute", note)


def test_the_newest_messages_come_from_the_newest_partitions_without_reading_the_older(
    backend_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight partitions of delivered messages an hour apart, four messages each, and a failed message half an hour
    ago in a partition of its kind: the newest five are the newest five of all, and only the newest partitions are
    read for them."""
    engine, now = queued_for_short_partitions(backend_url, monkeypatch, 33)
    for hour in range(8):
        finish(engine, list(range(1 + 4 * hour, 5 + 4 * hour)), DELIVERED, at=now - timedelta(hours=8 - hour))
    finish(engine, [33], FAILED, reason="permanent: HTTP 410", at=now - timedelta(minutes=30))
    with engine.connect() as connection:
        names = newest_first(connection)
        assert len(names) == 9 and "_failed_" in names[0]
        with partitions_read(engine, names) as read:
            newest = find_kept(connection, destination="crm", limit=5)
            newest_read = set(read)
            read.clear()
            everything = find_kept(connection, destination="crm")
    get_settings.cache_clear()
    assert [m.id for m in newest] == [33, 32, 31, 30, 29]
    assert [m.id for m in everything] == list(range(33, 0, -1))
    # The first group (the failed partition and the two newest delivered ones) held five messages newer than the
    # end of any partition left: no other partition was read. Without a limit, every one is.
    assert newest_read == set(names[:3]) and set(read) == set(names)


def test_a_seed_sized_record_is_compact_and_reads_back_whole() -> None:
    now = store_now()
    body = serialize(track("user-4711"))
    content = RecordContent("track", "web-app", "0b6e3f0c-5d4c-4c7e-9c55-0d5a4bd1f7a2", "user-4711", None, 1,
                            to_ms(now), to_ms(now), body,
                            [Attempt(0, to_ms(now), "https://hooks.example.com/in", 200, None, 12.5, "delivered")])
    url = content.tries[0].url
    record = pack_record(content, to_ms(now), {url: 7})
    # The body alone is 150 bytes; with the ids, times and the attempt the record stays well under it.
    assert len(body) >= 150 and len(record) < len(body) - 20
    assert PackedRecord.read(record).content(0, to_ms(now), "web-app", {7: url}) == content


@pytest.mark.parametrize(("kept_for", "period"), [(60, 60), (3600, 900), (86400, 21600), (7 * 86400, 86400),
                                                  (90 * 86400, 86400), (1, 60)])
def test_a_partition_covers_at_most_a_quarter_of_the_retention(kept_for: float, period: int) -> None:
    assert partition_period(kept_for) == period


def test_an_older_store_is_upgraded_with_nothing_lost(backend_url: str) -> None:
    """A store as the previous release left it: every outcome in the queue's rows, attempts beside them, and (on
    SQLite) a queue whose highest id SQLite would hand out again."""
    engine = get_engine(backend_url)
    enqueue("crm", [track(f"u{n}") for n in range(6)], source="web")
    finished = store_now() - timedelta(hours=2)
    with engine.begin() as connection:
        connection.execute(OUTBOX.update().where(OUTBOX.c.id <= 3).values(
            state=DELIVERED, attempts=1, first_attempt_at=finished, next_attempt_at=finished))
        connection.execute(OUTBOX.update().where(OUTBOX.c.id == 4).values(
            state=FAILED, reason="expired: HTTP 503", attempts=3, first_attempt_at=finished, next_attempt_at=finished))
        connection.execute(ATTEMPTS.insert(), [
            {"outbox_id": i, "attempted_at": finished, "url": "https://hooks.example.com/in", "status_code": 200,
             "error": None, "latency_ms": 3.0, "outcome": "delivered"} for i in (1, 2, 3)])
        connection.execute(ATTEMPTS.insert(), [
            {"outbox_id": 4, "attempted_at": finished - timedelta(minutes=m), "url": "https://hooks.example.com/in",
             "status_code": 503, "error": None, "latency_ms": 3.0, "outcome": "retry"} for m in (0, 10, 20)])
        connection.execute(ATTEMPTS.insert(), [
            {"outbox_id": 5, "attempted_at": finished, "url": "https://hooks.example.com/in", "status_code": 503,
             "error": None, "latency_ms": 3.0, "outcome": "retry"}])
        for name in [p.name for p in kept_partitions(connection)]:
            connection.exec_driver_sql(f'DROP TABLE "{name}"')
        connection.exec_driver_sql("DELETE FROM message_log_partitions")
        connection.exec_driver_sql("DROP INDEX ix_deletion_requests_state")  # added since
        if engine.dialect.name == "sqlite":
            # The previous release's queue: a plain INTEGER PRIMARY KEY, no AUTOINCREMENT.
            connection.exec_driver_sql("ALTER TABLE outbox RENAME TO outbox_new")
            made = connection.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE name = 'outbox_new'").scalar_one()
            connection.exec_driver_sql(made.replace("outbox_new", "outbox").replace(" AUTOINCREMENT", ""))
            connection.exec_driver_sql("INSERT INTO outbox SELECT * FROM outbox_new")
            connection.exec_driver_sql("DROP TABLE outbox_new")
            connection.exec_driver_sql("DELETE FROM sqlite_sequence WHERE name IN ('outbox', 'outbox_new')")
    dispose_engines()

    engine = get_engine(backend_url)  # what serve does at its start
    messages = {message.id: message for message in every_message(engine)}
    assert {i: m.state for i, m in messages.items()} == {
        1: DELIVERED, 2: DELIVERED, 3: DELIVERED, 4: FAILED, 5: PENDING, 6: PENDING}
    with engine.connect() as connection:
        assert connection.execute(select(OUTBOX.c.id).order_by(OUTBOX.c.id)).scalars().all() == [5, 6]
        assert "ix_deletion_requests_state" in {index["name"] for index in inspect(connection).get_indexes(
            "deletion_requests")}
        if engine.dialect.name == "sqlite":
            assert "AUTOINCREMENT" in connection.execute(text(
                "SELECT sql FROM sqlite_master WHERE name = 'outbox'")).scalar_one()
    assert [a.status_code for a in every_attempt(engine) if a.outbox_id == 4] == [503, 503, 503]
    assert [a.outbox_id for a in every_attempt(engine, status_code=200)] == [1, 2, 3]
    # The pending ones are delivered as before; the failed one can be replayed; no id is given twice.
    deliver_all(engine, {})
    assert replay_failed("crm") == 1
    deliver_all(engine, {})
    enqueue("crm", [track("new")])
    assert [(m.id, m.state) for m in every_message(engine)] == [(i, DELIVERED) for i in range(1, 7)] + [(7, PENDING)]
    # A second start finds nothing left to do.
    dispose_engines()
    assert len(every_message(get_engine(backend_url))) == 7


def test_a_user_in_every_partition_reads_about_as_many_as_hold_the_limit(
    backend_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twelve partitions an hour apart, two of ann's messages in each: her newest ten are in the newest five. The
    first group (three) finds six, at that rate the next three hold the rest, and the oldest of the ten is newer than
    any partition left: six partitions read, not the nine that doubling groups (3, 6) read."""
    engine, now = queued_for_short_partitions(backend_url, monkeypatch, 24)
    for hour in range(12):
        finish(engine, [1 + 2 * hour, 2 + 2 * hour], DELIVERED, at=now - timedelta(hours=12 - hour, minutes=30))
    with engine.connect() as connection:
        names = newest_first(connection)
        assert len(names) == 12
        with partitions_read(engine, names) as read:
            newest = find_kept(connection, user_id="ann", limit=10)
    get_settings.cache_clear()
    assert [m.id for m in newest] == list(range(24, 14, -1))
    assert set(read) == set(names[:6])


@pytest.mark.parametrize(("size", "read", "found", "limit", "expected"), [
    (3, 3, 0, 50, 6),  # nothing found yet: double
    (3, 3, 6, 50, 6),  # 44 more at 2 a partition (33 with the margin): no more than double
    (6, 9, 18, 50, 12),
    (12, 21, 42, 50, 6),  # 8 more at 2 a partition, and half again
    (3, 3, 5, None, 6),  # no limit: every partition, in doubling groups
    (200, 400, 1, 50, 200),  # at most a statement's worth
])
def test_the_next_group_is_what_should_hold_the_rest_of_the_limit(
    size: int, read: int, found: int, limit: int | None, expected: int
) -> None:
    assert next_group_size(size, read, found, limit) == expected
