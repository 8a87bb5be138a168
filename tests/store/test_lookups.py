"""Looking messages up wherever the store keeps them: queued in the outbox, kept in the message log."""

from __future__ import annotations

from datetime import timedelta

from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, PENDING
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.log.lookups import MessageQuery, find_messages
from prefect_webhooks.store.queue.outbox import add_to_outbox, outbox_rows
from prefect_webhooks.store.schema.tables import store_now
from tests.store.test_message_log import deliver_all, track


def test_queued_and_kept_messages_answer_in_one_shape_newest_first(backend_url: str) -> None:
    engine = get_engine(backend_url)
    with engine.begin() as connection:
        add_to_outbox(connection, outbox_rows("crm", [track("ann", n) for n in range(3)], source="web",
                                              message_ids=["m-0", "m-1", "m-2"]))
    deliver_all(engine, {2: FAILED})
    with engine.begin() as connection:
        add_to_outbox(connection, outbox_rows("crm", [track("ann", 3)], source="web", message_ids=["m-3"]))
        add_to_outbox(connection, outbox_rows("ads", [track("bob")], source="ios", message_ids=["m-4"]))
    with engine.connect() as connection:
        everything = find_messages(connection)
        # Queued ones by when they were stored, kept ones by when they got there (the failure is recorded a moment
        # after the deliveries, in the same millisecond or not).
        assert [(m.id, m.state) for m in everything[:2]] == [(5, PENDING), (4, PENDING)]
        assert sorted((m.id, m.state) for m in everything[2:]) == [(1, DELIVERED), (2, FAILED), (3, DELIVERED)]
        newest_two = find_messages(connection, MessageQuery(user_id="ann"), limit=2)
        assert [m.id for m in newest_two][0] == 4 and len(newest_two) == 2 and newest_two[1].state != PENDING
        assert [m.id for m in find_messages(connection, MessageQuery(states=[PENDING]))] == [5, 4]
        (failed,) = find_messages(connection, MessageQuery(states=[FAILED]))
        assert (failed.message_id, failed.reason, [t.status_code for t in failed.tries]) == (
            "m-1", "permanent: HTTP 410", [410])
        assert [m.id for m in find_messages(connection, MessageQuery(message_id="m-3"))] == [4]
        assert [m.id for m in find_messages(connection, MessageQuery(destination="ads"))] == [5]
        assert [m.id for m in find_messages(connection, MessageQuery(ids=[1, 5]))] == [5, 1]
        assert find_messages(connection, MessageQuery(since=store_now() + timedelta(minutes=1))) == []
