"""Retention on both stores: what a pruning pass may remove, what it must keep, and that it keeps out of the way."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta

import pytest
from sqlalchemy import delete, event, func, inspect, select, update

from prefect_webhooks.deletions.processing import process_deletion, sources_with_events
from prefect_webhooks.deletions.requests import pending_requests, request_deletion
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
)
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import dispose_engines, get_engine, insert_rows
from prefect_webhooks.store.figures.counters import outcome_totals
from prefect_webhooks.store.log import partitions as log_partitions
from prefect_webhooks.store.log.partitions import kept_partitions
from prefect_webhooks.store.queue.outbox import OUTBOX, claim_due_deliveries, enqueue, record_outcomes
from prefect_webhooks.store.schema.tables import LogPartition, store_now
from prefect_webhooks.store.upkeep.leases import release_lease, take_lease
from prefect_webhooks.store.upkeep.retention import PRUNE_LEASE, SEEN, RetentionPolicy, prune_store
from tests.stored import every_attempt, every_message
from tests.stored import finish as finish_at

POLICY = RetentionPolicy(delivered_seconds=60, failed_seconds=3600, seen_seconds=600)


@pytest.fixture(autouse=True)
def partitions_for_the_policy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The settings the writers make partitions by are the policy's: one-minute delivered partitions, quarter-hour
    failed ones."""
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETENTION_DELIVERED", "60")
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETENTION_FAILED", "3600")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def track(user: str) -> dict[str, str]:
    return {"type": "track", "userId": user, "event": "E"}


def finish(engine, outcomes: Sequence[str]) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
    """Claim the due rows and end them with ``outcomes`` in turn (through ``record_outcomes``); ids per outcome."""
    rows = sorted(claim_due_deliveries(engine, 1000, "test-owner"), key=lambda row: row.id)
    now = store_now()
    records = OutcomeRecords()
    ids: dict[str, list[int]] = {}
    for row, outcome in zip(rows, outcomes, strict=False):
        ids.setdefault(outcome, []).append(row.id)
        if outcome == DELIVERED:
            records.delivered.append(Delivered(row.id, 1, now, now, row.destination))
        elif outcome == FAILED:
            records.failed.append(Failed(row.id, "permanent: HTTP 410", 1, now, row.destination))
        elif outcome == FILTERED:
            records.filtered.append(Filtered(row.id, "filtered: rule", row.destination))
        if outcome != FILTERED:
            records.attempts.append(Attempt(row.id, now, "http://127.0.0.1:9/hook", 200, None, 1.0, "delivered"))
    record_outcomes(engine, records)
    return ids


def states(engine) -> dict[int, str]:  # type: ignore[no-untyped-def]
    return {message.id: message.state for message in every_message(engine)}


def attempt_ids(engine) -> set[int]:  # type: ignore[no-untyped-def]
    return {attempt.outbox_id for attempt in every_attempt(engine)}


def partition_names(engine) -> list[str]:  # type: ignore[no-untyped-def]
    with engine.connect() as connection:
        return [partition.name for partition in kept_partitions(connection)]


def test_each_state_goes_after_its_own_retention_and_pending_never(backend_url: str) -> None:
    engine = get_engine(backend_url)
    # Pending rows from last year, never attempted: older than any retention, still never pruned.
    enqueue("crm", [track("old")], source="web")
    with engine.begin() as connection:
        connection.execute(update(OUTBOX).values(created_at=datetime(2025, 1, 1), next_attempt_at=datetime(2099, 1, 1)))
    enqueue("crm", [track(f"u{n}") for n in range(6)], source="web")
    ids = finish(engine, [DELIVERED, DELIVERED, FILTERED, FAILED, FAILED])
    now = store_now()

    # A message is kept for its retention, and at most one partition's period (a quarter of it, at least a minute) more.
    early = prune_store(engine, POLICY, now=now + timedelta(seconds=59))
    assert early.messages_removed() == 0 and len(states(engine)) == 7

    report = prune_store(engine, POLICY, now=now + timedelta(seconds=121))
    assert (report.removed[DELIVERED], report.removed[FILTERED], report.removed[FAILED]) == (2, 1, 0)
    kept = states(engine)
    assert sorted(kept.values()) == [FAILED, FAILED, PENDING, PENDING]
    # Attempts go with their message, and only theirs.
    assert attempt_ids(engine) == set(ids[FAILED])
    assert all("_failed_" in name for name in partition_names(engine))

    late = prune_store(engine, POLICY, now=now + timedelta(days=365))
    assert late.removed[FAILED] == 2
    assert sorted(states(engine).values()) == [PENDING, PENDING]
    assert attempt_ids(engine) == set() and partition_names(engine) == []
    assert late.oldest_kept[PENDING] is not None and late.oldest_kept[DELIVERED] is None


def test_a_deletion_waiting_while_its_users_messages_are_dropped_still_finds_their_source(backend_url: str) -> None:
    engine = get_engine(backend_url)
    enqueue("crm", [track("leaving"), track("staying")], source="web")
    finish(engine, [DELIVERED, DELIVERED])
    request_deletion("leaving")
    assert prune_store(engine, POLICY, now=store_now() + timedelta(hours=1)).removed[DELIVERED] == 2
    assert every_message(engine) == []
    # The partition went whole; the request processed after it still notifies the source that saw the user.
    (request,) = pending_requests()
    assert sources_with_events("leaving") == ["web"]
    process_deletion(request, {"web": []})
    assert sources_with_events("leaving") == []


def test_an_unscoped_deletion_still_finds_sources_whose_rows_were_pruned(backend_url: str) -> None:
    engine = get_engine(backend_url)
    enqueue("crm", [track("anna")], source="web")
    enqueue("crm", [track("anna")], source="ios")
    finish(engine, [DELIVERED, DELIVERED])
    assert prune_store(engine, POLICY, now=store_now() + timedelta(hours=1)).removed[DELIVERED] == 2
    assert sources_with_events("anna") == ["ios", "web"]
    request_deletion("anna")
    (request,) = pending_requests()
    process_deletion(request, {"ios": [], "web": []})
    # The deletion removed what retention remembered about the user.
    assert sources_with_events("anna") == []


def test_a_partition_a_stopped_pass_left_unlisted_is_dropped_by_the_next(backend_url: str) -> None:
    engine = get_engine(backend_url)
    enqueue("crm", [track("u")], source="web")
    finish(engine, [DELIVERED])
    (name,) = partition_names(engine)
    with engine.begin() as connection:
        # A pass stopped after taking the partition out of the list, before dropping its table.
        connection.execute(delete(LogPartition.__table__))
    assert name in inspect(engine).get_table_names()
    prune_store(engine, POLICY)
    assert name not in inspect(engine).get_table_names()


def test_message_ids_a_store_from_before_the_periods_remembered_expire_in_bounded_batches(backend_url: str) -> None:
    engine = get_engine(backend_url)
    now = store_now()
    with engine.begin() as connection:
        SEEN.create(connection)  # the table today's release writes every messageId to
        insert_rows(connection, SEEN, [{"source": "web", "message_id": f"m{n}", "received_at": now - timedelta(
            seconds=900 if n < 7 else 10)} for n in range(10)])
    pauses: list[float] = []
    report = prune_store(engine, RetentionPolicy(60, 3600, 600, batch_rows=3), now=now, sleep=pauses.append)
    assert report.removed["seen_message_ids"] == 7
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(SEEN)).scalar_one() == 3
    # 7 ids at 3 per transaction: 3, 3, 1 — each full batch followed by a pause.
    assert len(pauses) == 2


def test_messages_go_a_whole_partition_at_a_time(backend_url: str) -> None:
    engine = get_engine(backend_url)
    enqueue("crm", [track(f"u{n}") for n in range(10)], source="web")
    finish(engine, [DELIVERED] * 10)
    pauses: list[float] = []
    report = prune_store(engine, RetentionPolicy(60, 3600, 600, batch_rows=4), now=store_now() + timedelta(hours=1),
                         sleep=pauses.append)
    assert report.removed[DELIVERED] == 10
    # One partition dropped whole. Its few steps (read its users, keep them, unlist it, drop its three indexes and
    # its table; on SQLite, delete its rows first: here one delete, as there are fewer than DROP_ROWS) are each
    # followed by a pause.
    steps = 8 if backend_url.startswith("sqlite") else 7
    assert report.batches == 1 and len(pauses) == steps and report.paused == pytest.approx(sum(pauses))


def test_on_sqlite_a_partition_is_emptied_a_bounded_number_of_rows_at_a_time_before_its_table_goes(
    backend_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_partitions, "DROP_ROWS", 2)
    engine = get_engine(backend_url)
    enqueue("crm", [track(f"u{n}") for n in range(5)], source="web")
    finish(engine, [DELIVERED] * 5)
    removed: list[int] = []

    def note(_connection, cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        if statement.startswith('DELETE FROM "message_log_'):
            removed.append(cursor.rowcount)

    event.listen(engine, "after_cursor_execute", note)
    try:
        report = prune_store(engine, POLICY, now=store_now() + timedelta(hours=1), sleep=lambda _: None)
    finally:
        event.remove(engine, "after_cursor_execute", note)
    assert report.removed[DELIVERED] == 5 and partition_names(engine) == []
    # Two rows, two rows, then the last one goes with the table (PostgreSQL drops a table's files whole).
    assert removed == ([2, 2, 0] if backend_url.startswith("sqlite") else [])


def test_a_pass_leaves_the_store_to_other_writers_after_each_of_its_transactions(backend_url: str) -> None:
    """Between two transactions of a catching-up pass (three partitions to drop), the pass pauses
    as long as the transaction took: a writer that waited meanwhile gets the store before the next one."""
    engine = get_engine(backend_url)
    assert enqueue("crm", [track(f"u{n}") for n in range(15)], source="web") == 15
    for batch in range(3):  # each five in a partition of their own, an hour apart
        finish_at(engine, list(range(1 + 5 * batch, 6 + 5 * batch)), DELIVERED,
                  at=store_now() - timedelta(hours=3 - batch))
    events: list[tuple[str, float]] = []
    began: dict[int, float] = {}

    @event.listens_for(engine, "begin")
    def started(connection) -> None:  # type: ignore[no-untyped-def]
        began[id(connection)] = time.monotonic()

    @event.listens_for(engine, "commit")
    def committed(connection) -> None:  # type: ignore[no-untyped-def]
        events.append(("commit", time.monotonic() - began.pop(id(connection), time.monotonic())))

    try:
        report = prune_store(engine, POLICY, now=store_now() + timedelta(days=2),
                             sleep=lambda seconds: events.append(("pause", seconds)))
    finally:
        event.remove(engine, "begin", started)
        event.remove(engine, "commit", committed)
    assert report.removed[DELIVERED] == 15 and report.batches == 3
    # The lease taken at the start and given back at the end are the only transactions not followed by a pause.
    work = events[1:-1]
    assert len(work) > 2 * 3 * 5
    for (kind, lasted), (next_kind, pause) in zip(work, work[1:], strict=False):
        if kind == "commit":
            assert next_kind == "pause" and pause >= lasted, work


def test_one_pass_at_a_time(backend_url: str) -> None:
    engine = get_engine(backend_url)
    enqueue("crm", [track("u")], source="web")
    finish(engine, [DELIVERED])
    assert take_lease(engine, PRUNE_LEASE, "other-host:1:abc", 60)
    report = prune_store(engine, POLICY, now=store_now() + timedelta(hours=1))
    assert report.skipped and report.messages_removed() == 0 and len(states(engine)) == 1
    release_lease(engine, PRUNE_LEASE, "other-host:1:abc")
    assert prune_store(engine, POLICY, now=store_now() + timedelta(hours=1)).removed[DELIVERED] == 1
    # The pass gave its lease back: the next one may run at once.
    assert take_lease(engine, PRUNE_LEASE, "other-host:1:abc", 60)


def test_counters_stay_exact_across_a_prune_a_purge_and_a_restart(backend_url: str) -> None:
    engine = get_engine(backend_url)
    enqueue("crm", [track(f"u{n}") for n in range(5)], source="web")
    enqueue("crm", [track("leaving")], source="web")
    finish(engine, [DELIVERED, DELIVERED, FAILED, FILTERED, FILTERED])
    request_deletion("leaving")
    (request,) = pending_requests()
    process_deletion(request, {"web": []})  # the user's pending message is dropped: one more failure
    expected = {"crm": {DELIVERED: 2, FAILED: 2, FILTERED: 2}}
    with engine.connect() as connection:
        assert outcome_totals(connection) == expected
    prune_store(engine, POLICY, now=store_now() + timedelta(days=30))
    assert len(states(engine)) == 0
    dispose_engines()
    with get_engine(backend_url).connect() as connection:
        assert outcome_totals(connection) == expected


def test_an_older_store_gets_its_counters_from_its_rows_once(backend_url: str) -> None:
    engine = get_engine(backend_url)
    enqueue("crm", [track(f"u{n}") for n in range(3)], source="web")
    with engine.begin() as connection:
        # A store of the previous release: outcomes in the queue's rows, no counters, no upgrade marker.
        connection.execute(update(OUTBOX).where(OUTBOX.c.id <= 2).values(state=DELIVERED))
        connection.exec_driver_sql("DELETE FROM outcome_counters")
        connection.exec_driver_sql("DELETE FROM store_upgrades")
    dispose_engines()
    engine = get_engine(backend_url)
    with engine.connect() as connection:
        assert outcome_totals(connection) == {"crm": {DELIVERED: 2}}
    dispose_engines()
    with get_engine(backend_url).connect() as connection:
        assert outcome_totals(connection) == {"crm": {DELIVERED: 2}}


def test_a_prune_racing_claims_loses_nothing_and_never_deadlocks(backend_url: str) -> None:
    engine = get_engine(backend_url)
    total = 600
    # Messages that finished two hours ago fill partitions the passes drop while deliveries fill today's.
    enqueue("crm", [track(f"old{n}") for n in range(100)], source="web")
    finish_at(engine, list(range(1, 101)), DELIVERED, at=store_now() - timedelta(hours=2))
    enqueue("crm", [track(f"u{n % 40}") for n in range(total)], source="web")
    errors: list[BaseException] = []
    removed: list[int] = []
    done = threading.Event()

    def deliver() -> None:
        try:
            while True:
                rows = claim_due_deliveries(engine, 25, "racer")
                if not rows:
                    return
                now = store_now()
                record_outcomes(engine, OutcomeRecords(
                    delivered=[Delivered(row.id, 1, now, now, row.destination) for row in rows],
                    attempts=[Attempt(row.id, now, "http://127.0.0.1:9/", 200, None, 1.0, DELIVERED) for row in rows]))
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    def prune() -> None:
        try:
            while not done.is_set():
                removed.append(prune_store(engine, POLICY, sleep=lambda _: None).removed[DELIVERED])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=deliver), threading.Thread(target=deliver), threading.Thread(target=prune)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == [] and not any(thread.is_alive() for thread in threads)
    # Every message was delivered and counted exactly once; no pending row was removed.
    with engine.connect() as connection:
        assert outcome_totals(connection) == {"crm": {DELIVERED: total}}  # the old ones were not counted here
    assert sum(removed) == 100
    kept = every_message(engine)
    assert len(kept) == total
    assert all(message.state == DELIVERED for message in kept)
    assert attempt_ids(engine) == {message.id for message in kept}  # attempts went with exactly their messages


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("15m", 900), ("24h", 86400), ("7d", 604800)])
def test_retention_settings_read_durations(text: str, seconds: float, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect_webhooks.settings import WebhooksSettings

    monkeypatch.setenv("PREFECT_WEBHOOKS_RETENTION_DELIVERED", text)
    assert WebhooksSettings().retention.retention_delivered == seconds


def test_a_bad_duration_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect_webhooks.settings import WebhooksSettings

    monkeypatch.setenv("PREFECT_WEBHOOKS_RETENTION_FAILED", "a week")
    with pytest.raises(ValueError, match=r"retention_failed[\s\S]*not a duration: 'a week'"):
        WebhooksSettings()
