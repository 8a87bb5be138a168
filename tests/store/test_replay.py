"""Replay selections: a time window as Svix's recover, several destinations, chunks of a bounded size."""

from __future__ import annotations

from datetime import datetime, timedelta

from prefect_webhooks.messages.outcomes import FAILED, PENDING
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import enqueue
from prefect_webhooks.store.queue.replay import ReplaySelection, count_selected, replay_failed, replay_selection
from tests.stored import every_message, finish

T0 = datetime(2026, 3, 1, 10, 0)


def failed_at(ids: list[int], first: datetime | None, last: datetime) -> None:
    finish(get_engine(), ids, FAILED, reason="expired: HTTP 503", attempts=3, first_attempt_at=first, at=last)


def states() -> list[str]:
    return [row.state for row in every_message(get_engine())]


def test_a_window_selects_messages_attempted_during_it(store_url: str) -> None:
    enqueue("d", [{"type": "track", "userId": f"u{n}", "event": "E"} for n in range(5)])
    hour = timedelta(hours=1)
    failed_at([1], T0 - 5 * hour, T0 - hour)  # attempted before the window only
    failed_at([2], T0 - 3 * hour, T0 + hour)  # attempted into the window (Svix: a failed attempt in it)
    failed_at([3], T0 + hour, T0 + 2 * hour)  # inside
    failed_at([4], None, T0 + 3 * hour)  # failed without an attempt inside (e.g. every endpoint disabled)
    failed_at([5], T0 + 5 * hour, T0 + 6 * hour)  # after the window
    assert replay_failed("d", since=T0, until=T0 + 4 * hour) == 3
    assert states() == [FAILED, PENDING, PENDING, PENDING, FAILED]


def test_a_large_replay_runs_in_chunks_over_several_destinations(store_url: str) -> None:
    for name in ("a", "b", "c"):
        enqueue(name, [{"type": "track", "userId": f"u{n}", "event": "E"} for n in range(1000)])
    failed_at(list(range(1, 3001)), T0, T0)
    selection = ReplaySelection(("a", "b"))
    assert count_selected(get_engine(), selection) == 2000
    progress: list[int] = []
    assert replay_selection(selection, chunk=300, on_chunk=progress.append) == 2000
    assert progress == [300, 600, 900, 1200, 1500, 1800, 2000]
    assert states().count(PENDING) == 2000
