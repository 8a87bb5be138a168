"""Outcomes per destination and minute: counted where outcomes are recorded, read for a chart, pruned."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, Sender, deliver_due
from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, FILTERED
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.figures.counters import add_outcomes
from prefect_webhooks.store.figures.minute_counts import (
    KEPT_FOR,
    MINUTES,
    REASONS,
    ReasonCount,
    minute_of,
    minute_series,
    reason_kind,
    top_reasons,
)
from prefect_webhooks.store.queue.outbox import enqueue
from prefect_webhooks.store.schema.tables import store_now
from prefect_webhooks.store.upkeep.retention import prune_store
from tests.receivers import Receiver

# Failed messages emit Prefect events: send them to the session's test server.
pytestmark = pytest.mark.usefixtures("prefect_harness")


async def test_a_delivery_run_counts_its_outcomes_in_the_minute_they_were_recorded(store_url: str) -> None:
    with Receiver(script=[200] * 7 + [400] * 3) as receiver:
        enqueue("crm", [{"type": "track", "userId": f"u{n}", "event": "E"} for n in range(10)])
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender)
            context.destinations.remember("crm", WebhookDestination(endpoints=[{"url": receiver.url}]))
            before = store_now()
            await deliver_due(DeliveryOptions(), context=context)
            after = store_now()
    assert len(receiver.requests) == 10
    with get_engine().connect() as connection:
        # The three 400s are one kind of reason; its sample is the newest of them.
        assert top_reasons(connection, "crm", after) == [ReasonCount(FAILED, "permanent: HTTP 400", 3, 10)]
        series = minute_series(connection, "crm", after, minutes=5)
        assert series.totals() == {DELIVERED: 7, FAILED: 3, FILTERED: 0}
        # Every count sits in a minute the run was recording in.
        minutes = {series.start + timedelta(minutes=index)
                   for values in series.counts.values() for index, count in enumerate(values) if count}
        assert minutes <= {minute_of(before), minute_of(after)}


def test_a_series_has_one_entry_per_minute_and_sums_what_each_minute_got(backend_url: str) -> None:
    now = store_now()
    engine = get_engine()
    with engine.begin() as connection:
        add_outcomes(connection, {("crm", DELIVERED): 5, ("crm", FAILED): 1, ("other", DELIVERED): 9})
    with engine.begin() as connection:
        add_outcomes(connection, {("crm", DELIVERED): 2, ("crm", FILTERED): 4})
    with engine.connect() as connection:
        series = minute_series(connection, "crm", now + timedelta(seconds=70), minutes=3)
    assert {outcome: len(values) for outcome, values in series.counts.items()} == {DELIVERED: 3, FAILED: 3, FILTERED: 3}
    assert series.totals() == {DELIVERED: 7, FAILED: 1, FILTERED: 4}
    assert series.start == minute_of(now + timedelta(seconds=70)) - timedelta(minutes=2)


def test_pruning_removes_minutes_older_than_a_day_and_keeps_the_rest(backend_url: str) -> None:
    engine = get_engine()
    now = store_now()
    with engine.begin() as connection:
        add_outcomes(connection, {("crm", DELIVERED): 3}, [("crm", FAILED, "permanent: HTTP 410", 1)])
    report = prune_store(engine, now=now + KEPT_FOR - timedelta(minutes=2))
    assert report.removed["outcome_minutes"] == 0
    report = prune_store(engine, now=now + KEPT_FOR + timedelta(minutes=2))
    assert report.removed["outcome_minutes"] >= 1
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(MINUTES)).scalar() == 0
        assert connection.execute(select(func.count()).select_from(REASONS)).scalar() == 0


def test_reasons_are_counted_by_kind_with_the_newest_message_as_sample(backend_url: str) -> None:
    engine = get_engine()
    now = store_now()
    with engine.begin() as connection:
        add_outcomes(connection, {("crm", FAILED): 3, ("crm", FILTERED): 1}, [
            ("crm", FAILED, "expired: HTTP 503 (after 9 attempts)", 4),
            ("crm", FAILED, "expired: HTTP 503; Retry-After 2026-03-04 05:06:07 UTC (after 12 attempts)", 9),
            ("crm", FAILED, "permanent: HTTP 410", 2), ("crm", FILTERED, "rule 1: event is Ping", 5)])
    with engine.begin() as connection:  # another transaction in the same minute adds to the same rows
        add_outcomes(connection, {("crm", FAILED): 1, ("other", FAILED): 1}, [
            ("crm", FAILED, "expired: HTTP 503 (after 3 attempts)", 7), ("other", FAILED, "permanent: HTTP 410", 8)])
    with engine.connect() as connection:
        assert top_reasons(connection, "crm", now + timedelta(seconds=61)) == [
            ReasonCount(FAILED, "expired: HTTP 503", 3, 9), ReasonCount(FAILED, "permanent: HTTP 410", 1, 2),
            ReasonCount(FILTERED, "rule 1: event is Ping", 1, 5)]
        assert top_reasons(connection, "crm", now, limit=1)[0].count == 3
        # Only the span asked for: a day later nothing is in it.
        assert top_reasons(connection, "crm", now + timedelta(days=1, minutes=2)) == []


def test_a_reason_kind_drops_what_varies_per_message_and_stays_short() -> None:
    assert reason_kind("expired: connection error: timeout (after 1 attempt)") == "expired: connection error: timeout"
    assert reason_kind("disabled: failing since 2026-03-04 05:06:07 UTC: HTTP 500") == (
        "disabled: failing since …: HTTP 500")
    assert reason_kind(None) == "(no reason)"
    assert len(reason_kind("permanent: " + "x" * 500)) == 200
