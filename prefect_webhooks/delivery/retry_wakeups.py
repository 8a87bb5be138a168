"""When this process's retries fall due, so the claim loop claims them on time instead of at its next idle tick.

A batch that reschedules messages notes their due times here; the claim loop (``claims.py``) claims again at the
first of them. Without it a retry waits up to the loop's idle spacing (0.3 s) past its due time, which an ordered
user pays once per refused message, one after another. Due times are rounded up to ``GRAIN`` so a retry storm costs
at most one claim per grain, and only future ones are kept: another process's retries are found by its own loop or
by this one's regular claims.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Iterable
from datetime import datetime

from prefect_webhooks.store.tables import store_now

GRAIN = 0.05
"""Seconds: due times closer than this share one claim."""

MOST_KEPT = 4096
"""Due times noted at most; a process with more waiting retries finds the rest at its regular claims."""


class RetryWakeups:
    """Due times of retries this process scheduled, as slots of ``GRAIN`` seconds on the monotonic clock."""

    def __init__(self) -> None:
        self._slots: list[int] = []  # a heap
        self._noted: set[int] = set()

    def __len__(self) -> int:
        return len(self._slots)

    def note(self, due_times: Iterable[datetime]) -> None:
        """Remember when messages rescheduled by this process fall due (store times, UTC)."""
        now, monotonic = store_now(), time.monotonic()
        for due in due_times:
            if len(self._slots) >= MOST_KEPT:
                return
            slot = math.ceil((monotonic + (due - now).total_seconds()) / GRAIN)
            if slot not in self._noted:
                self._noted.add(slot)
                heapq.heappush(self._slots, slot)

    def first_after(self, claimed_at: float) -> float | None:
        """The first due time after ``claimed_at`` (the last claim's start, which saw everything due before it)."""
        while self._slots and self._slots[0] * GRAIN <= claimed_at:
            self._noted.discard(heapq.heappop(self._slots))
        return self._slots[0] * GRAIN if self._slots else None
