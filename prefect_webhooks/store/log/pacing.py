"""Pacing of a background pass over the store: a pause after each of its steps, so that ingest and delivery keep
the store and the CPU while the pass runs.

A pruning pass that catches up (a store stopped for a while, a history built into the past) drops several partitions
and reads each one before it goes. Run back to back, its transactions of 50-200 ms left a waiting writer blocked for
0.4-0.6 s per partition (SQLite has one writer, and its busy handler polls at intervals that grow to 100 ms and
missed the short gaps); and the pass took a core for 32 s while it caught up 1.7M expired messages under 2,500
events/s. After each step, a paced pass pauses ``ratio`` times as long as the step took. A waiter polls at an interval
shorter than the time it has waited, so a pause as long as the step gives it the lock before the next step; and the
pass takes at most ``1 / (1 + ratio)`` of a core.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass


@dataclass
class Pacer:
    """Pauses after each step of a pass; counts what it paused.

    Attributes:
        ratio: How many times as long as the step took to pause after it.
        floor: The shortest pause after a step.
        sleep: How to pause.
        paused: Seconds paused so far.
        steps: Steps taken so far.
    """

    ratio: float = 1.0
    floor: float = 0.01
    sleep: Callable[[float], None] = time.sleep
    paused: float = 0.0
    steps: int = 0

    @contextmanager
    def step(self) -> Iterator[None]:
        """One step (a read, or a transaction: enter it inside this block, so the pause follows its commit)."""
        began = time.monotonic()
        yield
        pause = max((time.monotonic() - began) * self.ratio, self.floor)
        self.steps += 1
        self.paused += pause
        self.sleep(pause)


def paced(pacer: Pacer | None) -> AbstractContextManager[None]:
    """A step of ``pacer``, or no pause at all when there is none (a call outside a pass)."""
    return pacer.step() if pacer is not None else nullcontext()
