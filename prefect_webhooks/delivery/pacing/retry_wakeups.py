"""When this process's retries fall due, so the claim loop claims them on time instead of at its next idle tick.

A batch that reschedules messages notes their due times here as it records them (``waves``: while its other
requests are still out); the claim loop (``claims.py``) claims again at the first of them. Without it a retry waits
up to the loop's idle spacing (0.3 s) past its due time, which an ordered user pays once per refused message, one
after another. Due times are kept to the millisecond, rounded up; a due time already past when it is noted (its record
came late) is due at once. The claim for a retry is made ``LEAD`` before it falls due and takes what is due by then
(``claim_due_deliveries(due_by=...)``): the claim and its batch's store calls go before the due time, and the batch
sends the message at it (``batch.process_batch``), never before.

Claims for retries are paced by a token bucket: ``BURST`` may come one right after another, and on average one per
``GRAIN`` (20 a second). A retry due alone is claimed at its due time; a retry storm costs at most 20 claims a second
(each takes every message due by then), as it did when due times were rounded up to 50 ms slots, which made every
retry up to 50 ms late. Only this process's retries are noted: another process's are found by its own loop, or by
this one's regular claims.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Iterable
from datetime import datetime

from prefect_webhooks.store.schema.tables import store_now

GRAIN = 0.05
"""Seconds per claim for retries, on average."""

BURST = 4
"""Claims for retries that may come one right after another."""

LEAD = 0.05
"""Seconds before a retry falls due that its claim is made."""

MOST_KEPT = 4096
"""Due times noted at most; a process with more waiting retries finds the rest at its regular claims."""


class RetryWakeups:
    """Due times of retries this process scheduled, in milliseconds on the monotonic clock."""

    def __init__(self) -> None:
        self._due: list[int] = []  # a heap
        self._noted: set[int] = set()
        self._paced_until = -math.inf
        """The token bucket as the time its claims have been spent until (a claim may come ``BURST`` grains before)."""

    def __len__(self) -> int:
        return len(self._due)

    def note(self, due_times: Iterable[datetime]) -> bool:
        """Remember when messages rescheduled by this process fall due (store times, UTC).

        Returns:
            Whether a due time was added (the claim loop's next claim may be planned later than it).
        """
        now, monotonic = store_now(), time.monotonic()
        added = False
        for due in due_times:
            if len(self._due) >= MOST_KEPT:
                break
            at = math.ceil(max(monotonic + (due - now).total_seconds(), monotonic) * 1000)
            if at not in self._noted:
                self._noted.add(at)
                heapq.heappush(self._due, at)
                added = True
        return added

    def first_after(self, seen_until: float) -> float | None:
        """When to claim for the retries due after ``seen_until`` (the last claim took every message due by then):
        ``LEAD`` before the first one falls due, or later when the pace of claims asks; None: none."""
        # A microsecond of slack: ``seen_until`` is a claim's time plus ``LEAD`` in floating point, and a due time
        # on the millisecond it reached must count as taken (it came back a hair short, 1 run in 4 of the tests).
        while self._due and self._due[0] / 1000 <= seen_until + 1e-6:
            self._noted.discard(heapq.heappop(self._due))
        if not self._due:
            return None
        return max(self._due[0] / 1000 - LEAD, self._paced_until - (BURST - 1) * GRAIN)

    def claiming(self, at: float) -> None:
        """A claim for due retries starts at ``at`` (monotonic): it spends a token."""
        self._paced_until = max(self._paced_until, at) + GRAIN
