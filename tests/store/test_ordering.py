"""Ordered destinations in the store: a claim takes only each user's oldest pending message (SQLite, PostgreSQL)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import inspect

from prefect_webhooks.messages.outcomes import DELIVERED, FAILED
from prefect_webhooks.store.engine.engines import create_schema, get_engine
from prefect_webhooks.store.queue.ordering import behind_earlier, set_ordered
from prefect_webhooks.store.queue.outbox import claim_due_deliveries, enqueue
from tests.stored import finish as give_outcome


def calls(*users: str | None) -> list[dict[str, Any]]:
    return [{"type": "track", "event": "E", **({"userId": user} if user else {"anonymousId": None})}
            for user in users]


def claim_ids() -> list[int]:
    return sorted(row.id for row in claim_due_deliveries(get_engine(), 100, "o", lease_seconds=600))


def finish(ids: list[int], state: str = DELIVERED) -> None:
    give_outcome(get_engine(), ids, state)


def test_only_each_users_oldest_pending_message_is_claimed(backend_url: str) -> None:
    set_ordered(get_engine(), "ordered", True)
    enqueue("ordered", calls("a", "a", "b", "a", "b", None, None))  # ids 1-7
    enqueue("plain", calls("a", "a"))  # ids 8, 9: another destination is not held back
    assert claim_ids() == [1, 3, 6, 7, 8, 9]
    # Claimed (leased) but not finished: the users' later messages still wait.
    assert claim_ids() == []
    finish([1])
    assert claim_ids() == [2]
    # A message that failed for good lets the next one go too.
    finish([2, 3], FAILED)
    assert claim_ids() == [4, 5]


def test_unordered_again_claims_everything_and_the_recheck_finds_what_waits(backend_url: str) -> None:
    enqueue("d", calls("a", "a", "a"))
    set_ordered(get_engine(), "d", True)
    assert behind_earlier(get_engine(), [1, 2, 3]) == [2, 3]
    set_ordered(get_engine(), "d", False)
    assert claim_ids() == [1, 2, 3]


def test_the_index_is_added_to_a_store_made_before_it(backend_url: str) -> None:
    engine = get_engine()
    with engine.begin() as connection:
        connection.exec_driver_sql("DROP INDEX ix_outbox_pending_user")
    create_schema(engine)
    assert "ix_outbox_pending_user" in {index["name"] for index in inspect(engine).get_indexes("outbox")}
