"""Searching by what only a message's record holds (its reason's start, an endpoint among its attempts): the matches
newest first, a bound on what one call reads, and pages that go on where the last one stopped."""

from __future__ import annotations

from prefect_webhooks.messages.outcomes import Attempt, Failed, OutcomeRecords
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.log.lookups import MessageQuery
from prefect_webhooks.store.log.message_search import Refinement, search_messages
from prefect_webhooks.store.queue.outbox import claim_due_deliveries, enqueue, record_outcomes
from prefect_webhooks.store.schema.tables import store_now

A, B = "https://a.example.com/in", "https://b.example.com/hooks/x"


def history(engine: object, count: int) -> None:
    """``count`` failed messages, all finished at once (so newest first is highest id first): every third with
    HTTP 410 at A, every third expired at B, the rest with HTTP 400 at A."""
    enqueue("crm", [{"type": "track", "userId": f"u{n}", "event": "E"} for n in range(count)])
    now = store_now()
    records = OutcomeRecords()
    for row in claim_due_deliveries(engine, count, "test"):
        kind = row.id % 3
        url = B if kind == 2 else A
        reason = ("permanent: HTTP 400", "permanent: HTTP 410", "expired: HTTP 503 (after 9 attempts)")[kind]
        records.failed.append(Failed(row.id, reason, 1, now, "crm"))
        records.attempts.append(Attempt(row.id, now, url, 410, None, 3.0, "permanent"))
    record_outcomes(engine, records)


def test_matches_come_newest_first_and_pages_go_on_where_the_last_stopped(backend_url: str) -> None:
    engine = get_engine(backend_url)
    history(engine, 30)
    with engine.connect() as connection:
        refinement = Refinement(reason_prefix="permanent: HTTP 41")
        first = search_messages(connection, MessageQuery(), refinement, limit=4)
        assert [m.id for m in first.messages] == [28, 25, 22, 19] and first.resume_at is not None
        rest = search_messages(connection, MessageQuery(before=first.resume_at), refinement, limit=100)
        assert [m.id for m in rest.messages] == [16, 13, 10, 7, 4, 1] and rest.resume_at is None
        # By endpoint: a prefix of the URL as attempts keep it; a query or credentials in what is asked are ignored.
        at_b = search_messages(connection, MessageQuery(), Refinement(endpoint="https://u:p@b.example.com/hooks?t=1"))
        assert [m.id for m in at_b.messages] == list(range(29, 0, -3))
        both = Refinement(reason_prefix="permanent: HTTP 410", endpoint=B)
        assert search_messages(connection, MessageQuery(), both).messages == []
        # Without a refinement: the lookup's own page.
        plain = search_messages(connection, MessageQuery(states=["failed"]), limit=3)
        assert [m.id for m in plain.messages] == [30, 29, 28] and plain.resume_at == plain.messages[-1].position


def test_one_call_reads_at_most_its_bound_and_says_where_it_stopped(backend_url: str) -> None:
    engine = get_engine(backend_url)
    history(engine, 30)
    with engine.connect() as connection:
        bounded = search_messages(connection, MessageQuery(), Refinement(reason_prefix="expired"), limit=50, scan=7)
        # The newest 7 messages (30…24) hold two expired ones; the next call starts after the 7th.
        assert bounded.read == 7 and [m.id for m in bounded.messages] == [29, 26]
        assert bounded.resume_at is not None and bounded.resume_at[1] == 24
        after = search_messages(connection, MessageQuery(before=bounded.resume_at), Refinement(reason_prefix="expired"),
                                limit=50, scan=7)
        assert [m.id for m in after.messages] == [23, 20, 17]
