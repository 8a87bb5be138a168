"""A user's next messages claimed behind the one an ordered destination's claim took (SQLite, PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.followers import claim_followers
from prefect_webhooks.store.queue.ordering import set_ordered
from prefect_webhooks.store.queue.outbox import OUTBOX, claim_due_deliveries, enqueue
from prefect_webhooks.store.schema.tables import store_now
from tests.store.test_ordering import calls


def followers(heads: list[int], per_user: int = 50, owner: str = "o") -> dict[int, list[int]]:
    runs = claim_followers(get_engine(), heads, owner, per_user=per_user, lease_seconds=600)
    return {head: [row.id for row in rows] for head, rows in runs.items()}


def test_a_users_due_messages_behind_the_claimed_one_are_leased_in_order(backend_url: str) -> None:
    set_ordered(get_engine(), "ordered", True)
    enqueue("ordered", calls("a", "b", "a", "a", "b", None, "a"))  # ids 1-7
    enqueue("other", calls("a"))  # id 8: another destination's message of the same user is not in the run
    heads = sorted(row.id for row in claim_due_deliveries(get_engine(), 100, "o", lease_seconds=600))
    assert heads == [1, 2, 6, 8]
    assert followers([1, 2, 6]) == {1: [3, 4, 7], 2: [5]}
    # Leased: neither a claim nor a second call takes them again.
    assert claim_due_deliveries(get_engine(), 100, "p", lease_seconds=600) == []
    assert followers([1, 2], owner="p") == {}


def test_the_run_stops_at_a_message_not_due_or_leased_elsewhere_and_at_the_cap(backend_url: str) -> None:
    set_ordered(get_engine(), "ordered", True)
    enqueue("ordered", calls(*["a"] * 6, *["b"] * 4))  # a: ids 1-6, b: ids 7-10
    with get_engine().begin() as connection:
        # a's third message waits for a retry; b's second is leased by another process.
        connection.execute(update(OUTBOX).where(OUTBOX.c.id == 3).values(
            next_attempt_at=store_now() + timedelta(seconds=60)))
        connection.execute(update(OUTBOX).where(OUTBOX.c.id == 8).values(
            lease_owner="other", lease_expires_at=store_now() + timedelta(seconds=60)))
    assert sorted(row.id for row in claim_due_deliveries(get_engine(), 100, "o", lease_seconds=600)) == [1, 7]
    assert followers([1, 7]) == {1: [2]}
    with get_engine().begin() as connection:
        connection.execute(update(OUTBOX).where(OUTBOX.c.id.in_([2, 3])).values(
            next_attempt_at=store_now(), lease_owner=None, lease_expires_at=None))
    assert followers([1], per_user=2) == {1: [2, 3]}
