"""The statements of lookups in the message log: built once per group of partitions and filters, values bound."""

from __future__ import annotations

from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.log.message_log import find_kept
from prefect_webhooks.store.log.statements import group_statement, lookup_parameters
from prefect_webhooks.store.queue.outbox import enqueue
from tests.stored import finish


def test_lookups_of_other_users_reuse_one_statement_with_their_own_values(backend_url: str) -> None:
    engine = get_engine(backend_url)
    assert enqueue("crm", [{"type": "track", "userId": user, "event": "E"} for user in ("ann", "bob", "ann")],
                   source="web") == 3
    finish(engine, [1, 2, 3], "delivered")
    group_statement.cache_clear()
    with engine.connect() as connection:
        assert [m.id for m in find_kept(connection, user_id="ann", limit=10)] == [3, 1]
        built = group_statement.cache_info().misses
        assert [m.id for m in find_kept(connection, user_id="bob", limit=10)] == [2]
        assert [m.id for m in find_kept(connection, user_id="cy", limit=10)] == []
    assert group_statement.cache_info().misses == built and group_statement.cache_info().hits >= 2


def test_only_the_filters_given_are_parameters() -> None:
    assert lookup_parameters(user_id="ann", limit=5).keys() == {"user_key", "limit"}
    assert lookup_parameters(states=["failed", "delivered"], ids=[4]) == {"states": [3, 1], "ids": [4]}
