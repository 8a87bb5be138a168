"""Due times of this process's retries: claimed just before they fall due, paced in a storm, a late note due at once,
bounded."""

from __future__ import annotations

import time
from datetime import timedelta

from prefect_webhooks.delivery.pacing.retry_wakeups import BURST, GRAIN, LEAD, MOST_KEPT, RetryWakeups
from prefect_webhooks.store.schema.tables import store_now


def test_the_claim_for_the_first_retry_not_taken_comes_just_before_it_falls_due() -> None:
    wakeups = RetryWakeups()
    now, monotonic = store_now(), time.monotonic()
    assert wakeups.note([now + timedelta(seconds=2), now + timedelta(seconds=1), now + timedelta(seconds=1.0004)])
    first = wakeups.first_after(monotonic)
    # LEAD before the due time (the tolerance: a loaded machine may pause a thread between its two clock readings).
    assert first is not None and abs(first - monotonic - (1.0 - LEAD)) < 0.01
    # That claim took what was due by LEAD after it: the message due 0.4 ms later too. The next is at 2 s.
    second = wakeups.first_after(first + LEAD + 0.001)
    assert second is not None and abs(second - monotonic - (2.0 - LEAD)) < 0.01
    assert wakeups.first_after(second + LEAD + 0.001) is None
    assert not wakeups.note([]), "nothing noted: the claim loop's plan stands"


def test_claims_for_retries_come_back_to_back_up_to_a_burst_then_one_per_grain() -> None:
    wakeups = RetryWakeups()
    now, monotonic = store_now(), time.monotonic()
    wakeups.note(now + timedelta(seconds=1 + n * 0.001) for n in range(200))  # a storm: one due every millisecond
    seen_until = monotonic
    times = []
    for _ in range(BURST + 2):
        at = wakeups.first_after(seen_until)
        assert at is not None
        times.append(at - monotonic)
        wakeups.claiming(at)
        seen_until = at + LEAD
    # Each of the first BURST claims just before its retry's due time (1 ms apart), then one per grain.
    assert abs(times[0] - (1 - LEAD)) < 0.01
    assert all(abs(times[n] - (times[0] + n * 0.001)) < 0.0015 for n in range(BURST))
    assert abs(times[BURST] - (times[0] + GRAIN)) < 0.0015
    assert abs(times[BURST + 1] - (times[0] + 2 * GRAIN)) < 0.0015


def test_a_due_time_past_when_noted_is_due_at_once_and_the_count_is_bounded() -> None:
    wakeups = RetryWakeups()
    now, monotonic = store_now(), time.monotonic()
    # Recorded after its due time (a slow transaction): claimed at once, not forgotten behind the last claim.
    wakeups.note([now - timedelta(seconds=1)])
    at = wakeups.first_after(monotonic - 5)
    assert at is not None and at <= time.monotonic()
    # A claim after it took it.
    assert wakeups.first_after(time.monotonic() + 1) is None
    wakeups.note(now + timedelta(seconds=10 + slot * 0.001) for slot in range(MOST_KEPT + 100))
    assert len(wakeups) == MOST_KEPT
