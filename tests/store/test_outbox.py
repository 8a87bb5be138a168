import threading
from datetime import datetime, timedelta

import orjson
from sqlalchemy import select, update
from sqlalchemy.engine import Engine

from prefect_webhooks.messages.outcomes import (
    DELIVERED,
    FAILED,
    PENDING,
    Attempt,
    Delivered,
    Failed,
    OutcomeRecords,
    Rescheduled,
)
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import (
    ATTEMPTS,
    OUTBOX,
    bring_forward,
    claim_due_deliveries,
    enqueue,
    extend_leases,
    leased_rows,
    record_outcomes,
    release_leases,
    renew_leases,
    replay_failed,
)
from prefect_webhooks.store.schema.tables import store_now
from tests.stored import every_attempt, every_message, finish, to_ms


def track(n: int) -> dict:
    return {"version": 1, "type": "track", "userId": f"u{n}", "event": "E", "properties": {"n": n},
            "timestamp": "2026-01-01T00:00:00.000Z"}


def rows(engine: Engine) -> list:
    with engine.connect() as connection:
        return list(connection.execute(select(OUTBOX).order_by(OUTBOX.c.id)))


def set_rows(engine: Engine, **values: object) -> None:
    with engine.begin() as connection:
        connection.execute(update(OUTBOX).values(**values))


def test_enqueue_writes_pending_rows_with_the_serialised_body(store_url: str) -> None:
    engine = get_engine(store_url)
    assert enqueue("crm", [track(1), track(2)], source="web") == 2
    stored = rows(engine)
    assert [row.state for row in stored] == [PENDING, PENDING]
    assert orjson.loads(stored[0].body) == track(1)
    assert stored[0].destination == "crm" and stored[0].source == "web" and stored[0].user_id == "u1"
    assert stored[0].attempts == 0 and stored[0].first_attempt_at is None


def test_claim_leases_due_rows_oldest_first_up_to_the_limit(store_url: str) -> None:
    engine = get_engine(store_url)
    enqueue("crm", [track(n) for n in range(5)])
    with engine.begin() as connection:
        # Row 5 is due earliest, row 1 is not due yet.
        connection.execute(update(OUTBOX).where(OUTBOX.c.id == 5).values(next_attempt_at=store_now() - timedelta(1)))
        connection.execute(update(OUTBOX).where(OUTBOX.c.id == 1).values(next_attempt_at=store_now() + timedelta(1)))
    claimed = claim_due_deliveries(engine, 2, "worker-a", lease_seconds=60)
    assert len(claimed) == 2
    assert 5 in {row.id for row in claimed}
    assert 1 not in {row.id for row in claimed}
    assert all(orjson.loads(row.body)["type"] == "track" for row in claimed)
    leased = {row.id: row for row in rows(engine)}
    for row in claimed:
        assert leased[row.id].lease_owner == "worker-a"
        assert leased[row.id].lease_expires_at > store_now() + timedelta(seconds=50)
    # With room for every row, the claim still leaves out the one that is not due (and the ones already leased).
    rest = claim_due_deliveries(engine, 10, "worker-b", lease_seconds=60)
    assert {row.id for row in rest} == {1, 2, 3, 4, 5} - {1} - {row.id for row in claimed}


def test_a_live_lease_keeps_other_claimers_away_until_it_expires(store_url: str) -> None:
    engine = get_engine(store_url)
    enqueue("crm", [track(n) for n in range(3)])
    assert len(claim_due_deliveries(engine, 10, "worker-a", lease_seconds=60)) == 3
    assert claim_due_deliveries(engine, 10, "worker-b") == []
    # The first worker died: once its lease has expired, the rows come back.
    set_rows(engine, lease_expires_at=store_now() - timedelta(seconds=1))
    again = claim_due_deliveries(engine, 10, "worker-b")
    assert sorted(row.id for row in again) == [1, 2, 3]


def test_claim_filters_by_destination_and_skips_finished_rows(store_url: str) -> None:
    engine = get_engine(store_url)
    enqueue("crm", [track(1)])
    enqueue("ads", [track(2), track(3)])
    finish(engine, [3], DELIVERED)
    claimed = claim_due_deliveries(engine, 10, "w", destination="ads")
    assert [row.id for row in claimed] == [2]
    assert [row.id for row in claim_due_deliveries(engine, 10, "w")] == [1]


def test_concurrent_claimers_never_share_a_row(store_url: str) -> None:
    engine = get_engine(store_url)
    enqueue("crm", [track(n) for n in range(400)])
    seen: dict[str, list[int]] = {}

    def claimer(name: str) -> None:
        got = seen.setdefault(name, [])
        while batch := claim_due_deliveries(engine, 7, name):
            got.extend(row.id for row in batch)

    threads = [threading.Thread(target=claimer, args=(f"w{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [row_id for ids in seen.values() for row_id in ids]
    assert sorted(every) == list(range(1, 401))


def test_leased_rows_extend_and_release_only_touch_the_owners_pending_rows(store_url: str) -> None:
    engine = get_engine(store_url)
    enqueue("crm", [track(n) for n in range(3)])
    claim_due_deliveries(engine, 2, "a")
    claim_due_deliveries(engine, 2, "b")
    mine = [row.id for row in leased_rows(engine, [1, 2, 3], "a")]
    assert mine == [1, 2]
    until = store_now() + timedelta(hours=1)
    assert extend_leases(engine, [1, 2, 3], "a", until) == 2
    # The fence before sending: the ids the owner still holds.
    assert renew_leases(engine, [1, 2, 3], "a", until) == {1, 2}
    assert renew_leases(engine, [3], "a", until) == set() and renew_leases(engine, [], "a", until) == set()
    assert release_leases(engine, [1, 2, 3], "a") == 2
    stored = rows(engine)
    assert [row.lease_owner for row in stored] == [None, None, "b"]


def test_extending_a_lease_never_shortens_one(store_url: str) -> None:
    # A batch's lease keeper may renew just after its record held a row longer, for the task's next try.
    engine = get_engine(store_url)
    enqueue("crm", [track(n) for n in range(2)])
    claim_due_deliveries(engine, 2, "a", lease_seconds=3600)
    held_until = rows(engine)[0].lease_expires_at
    assert extend_leases(engine, [1, 2], "a", store_now() + timedelta(seconds=30)) == 0
    assert {row.lease_expires_at for row in rows(engine)} == {held_until}
    later = store_now() + timedelta(hours=2)
    assert extend_leases(engine, [1], "a", later) == 1
    assert [to_ms(row.lease_expires_at) for row in rows(engine)] == [to_ms(later), to_ms(held_until)]


def test_record_outcomes_writes_states_and_attempts_in_one_go(store_url: str) -> None:
    engine = get_engine(store_url)
    enqueue("crm", [track(n) for n in range(3)])
    now = store_now()
    later = now + timedelta(minutes=1)
    record_outcomes(engine, OutcomeRecords(
        delivered=[Delivered(1, attempts=1, first_attempt_at=now, at=now, destination="crm")],
        failed=[Failed(2, "permanent: HTTP 404", attempts=1, first_attempt_at=now, destination="crm")],
        rescheduled=[Rescheduled(3, attempts=1, first_attempt_at=now, reason="HTTP 503", next_attempt_at=later)],
        attempts=[Attempt(i, now, "http://a/", status_code=s, error=None, latency_ms=1.5, outcome=o)
                  for i, s, o in ((1, 200, "delivered"), (2, 404, "permanent"), (3, 503, "retry"))],
    ))
    stored = every_message(engine)
    assert [(row.state, row.reason) for row in stored] == [
        (DELIVERED, None), (FAILED, "permanent: HTTP 404"), (PENDING, "HTTP 503")]
    # The finished ones left the queue for the log, with their attempts; the rescheduled one's attempt waits beside it.
    assert [row.id for row in rows(engine)] == [3]
    # A kept message's finish time is when it got there (to the millisecond: retention counts from it).
    assert stored[0].next_attempt_at == to_ms(now) and stored[1].next_attempt_at >= to_ms(now)
    assert stored[2].next_attempt_at == later
    assert [(a.outbox_id, a.status_code) for a in every_attempt(engine)] == [(1, 200), (2, 404), (3, 503)]
    with engine.connect() as connection:
        assert connection.execute(select(ATTEMPTS.c.status_code)).scalars().all() == [503]


def test_replay_puts_failed_rows_back_with_a_fresh_deadline(store_url: str) -> None:
    engine = get_engine(store_url)
    enqueue("crm", [track(n) for n in range(4)])
    enqueue("ads", [track(9)])
    old = datetime(2025, 1, 1)
    with engine.begin() as connection:
        connection.execute(update(OUTBOX).where(OUTBOX.c.id == 2).values(created_at=old))
    finish(engine, [1], FAILED, reason="permanent: HTTP 404", attempts=7, first_attempt_at=old, at=old)
    finish(engine, [2, 3, 4, 5], FAILED, reason="expired: HTTP 500", attempts=7, first_attempt_at=old, at=old)
    assert replay_failed("crm", reason_prefix="expired", created_after=datetime(2025, 6, 1)) == 2
    stored = {row.id: row for row in every_message(engine)}
    assert [stored[i].state for i in (1, 2, 3, 4, 5)] == [FAILED, FAILED, PENDING, PENDING, FAILED]
    # Its history is counted (7 attempts, from its first); its retries start afresh: the queue row's own count and
    # first attempt, which its deadline runs from, are reset.
    assert (stored[3].attempts, stored[3].first_attempt_at, stored[3].reason) == (7, old, None)
    with engine.connect() as connection:
        assert connection.execute(select(OUTBOX.c.attempts, OUTBOX.c.first_attempt_at).where(OUTBOX.c.id == 3)).one(
        ) == (0, None)
    assert stored[3].next_attempt_at <= store_now()
    assert replay_failed("crm") == 2
    assert replay_failed("crm") == 0


def test_record_outcomes_groups_rows_with_equal_values(store_url: str) -> None:
    engine = get_engine(store_url)
    enqueue("crm", [track(n) for n in range(5)])
    now = store_now()
    earlier = now - timedelta(minutes=5)
    same = {"attempts": 1, "first_attempt_at": now, "at": now, "destination": "crm"}
    record_outcomes(engine, OutcomeRecords(delivered=[
        Delivered(1, **same), Delivered(2, **same), Delivered(4, **same),
        Delivered(5, **{**same, "attempts": 3, "first_attempt_at": earlier})]))
    stored = every_message(engine)
    assert [row.state for row in stored] == [DELIVERED, DELIVERED, PENDING, DELIVERED, DELIVERED]
    assert [row.attempts for row in stored] == [1, 1, 0, 1, 3]
    assert stored[4].first_attempt_at == to_ms(earlier) and stored[0].first_attempt_at == to_ms(now)
    assert all(row.next_attempt_at == to_ms(now) for row in stored if row.id != 3)


def test_replay_leaves_rows_purged_by_a_deletion_request_failed(store_url: str) -> None:
    engine = get_engine()
    enqueue("crm", [{"version": 1, "type": "track", "userId": "u", "timestamp": "x", "event": "E"}] * 2)
    with engine.begin() as connection:
        connection.execute(update(OUTBOX).where(OUTBOX.c.id == 1).values(body=None, user_id=None))
    finish(engine, [1, 2], FAILED, reason="permanent: HTTP 404")
    assert replay_failed("crm") == 1
    assert {row.id: row.state for row in every_message(engine)} == {1: FAILED, 2: PENDING}


def test_bring_forward_makes_waiting_rows_of_the_destinations_due_now(store_url: str) -> None:
    engine = get_engine(store_url)
    enqueue("crm", [track(n) for n in range(4)])
    enqueue("other", [track(9)])
    enqueue("crm", [track(10)])
    later = store_now() + timedelta(minutes=10)
    set_rows(engine, next_attempt_at=later, attempts=3, reason="HTTP 503")
    with engine.begin() as connection:
        # Row 2 comes due first; row 4 waits for an in-process retry under a live lease; row 6 for a Retry-After.
        connection.execute(update(OUTBOX).where(OUTBOX.c.id == 2).values(next_attempt_at=later - timedelta(minutes=5)))
        connection.execute(update(OUTBOX).where(OUTBOX.c.id == 4).values(lease_owner="w", lease_expires_at=later))
        connection.execute(update(OUTBOX).where(OUTBOX.c.id == 6).values(
            next_attempt_at=later - timedelta(minutes=9), reason="HTTP 429; Retry-After 2026-01-01 00:10:00 UTC"))

    # One, to carry a probe: the one that would come due first.
    assert bring_forward(engine, ["crm"], limit=1) == 1
    assert [row.id for row in claim_due_deliveries(engine, 10, "me")] == [2]
    # All: the rest of crm except the leased row; other destinations and attempt counts untouched.
    assert bring_forward(engine, ["crm"]) == 2
    assert sorted(row.id for row in claim_due_deliveries(engine, 10, "me")) == [1, 3]
    assert {row.id: row.attempts for row in rows(engine)} == {1: 3, 2: 3, 3: 3, 4: 3, 5: 3, 6: 3}
    assert bring_forward(engine, []) == 0
