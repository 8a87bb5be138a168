"""Due times of this process's retries: coalesced per grain, only future ones kept, bounded."""

from __future__ import annotations

import time
from datetime import timedelta

from prefect_webhooks.delivery.retry_wakeups import GRAIN, MOST_KEPT, RetryWakeups
from prefect_webhooks.store.tables import store_now


def test_the_first_due_time_after_the_last_claim_comes_first_and_close_ones_share_a_claim() -> None:
    wakeups = RetryWakeups()
    now, monotonic = store_now(), time.monotonic()
    wakeups.note([now + timedelta(seconds=2), now + timedelta(seconds=1), now + timedelta(seconds=1.001)])
    first = wakeups.first_after(monotonic)
    assert first is not None and 1.0 <= first - monotonic < 1.0 + GRAIN + 0.05
    # The claim at that time saw both messages due at about 1 s, unless a grain's edge fell in the millisecond between
    # them: then the later one has the next grain's claim (about 1 in 50 runs). The next wake-up after is at 2 s.
    second = wakeups.first_after(first)
    if second is not None and second - first < GRAIN * 1.5:
        assert 1.0 <= second - monotonic < 1.0 + 2 * GRAIN + 0.05
        second = wakeups.first_after(second)
    assert second is not None and 2.0 <= second - monotonic < 2.0 + GRAIN + 0.05
    assert wakeups.first_after(second) is None


def test_a_due_time_noted_again_after_it_passed_is_kept_and_the_count_is_bounded() -> None:
    wakeups = RetryWakeups()
    now = store_now()
    wakeups.note([now + timedelta(seconds=1)])
    assert wakeups.first_after(time.monotonic() + 5) is None
    wakeups.note([now + timedelta(seconds=1)])
    assert wakeups.first_after(time.monotonic() - 5) is not None
    wakeups.note(now + timedelta(seconds=10 + slot * GRAIN) for slot in range(MOST_KEPT + 100))
    assert len(wakeups) == MOST_KEPT
