"""A child of ``serve`` that is started again when it exits, instead of stopping the service.

The runner of the other deployments (deletions, audience syncs, replays) talks to the Prefect API all the time; on
some Prefect releases (3.4) it exits as soon as the API refuses a connection, and it cannot start at all while the
API is down. Ingest and delivery must not stop with it, so ``serve`` starts it again: after 1 s, then after twice
the previous wait, at most ``MAX_DELAY`` seconds; a runner that lived ``STEADY_SECONDS`` starts the count again.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Protocol

FIRST_DELAY = 1.0
MAX_DELAY = 60.0
STEADY_SECONDS = 300.0


class Restartable(Protocol):
    """What ``Restarts`` needs of a child."""

    name: str

    def start(self) -> object:
        """Start the process."""
        ...

    def running(self) -> bool:
        """Whether the process is alive."""
        ...


@dataclass
class Restarts:
    """When to start an exited child again."""

    delay: float = FIRST_DELAY
    due_at: float | None = None
    started_at: float = 0.0
    count: int = 0

    def tend(self, child: Restartable, now: float | None = None) -> None:
        """Call while the child is not running: schedules its restart, and starts it once the wait is over."""
        now = time.monotonic() if now is None else now
        if self.due_at is None:
            if self.started_at and now - self.started_at >= STEADY_SECONDS:
                self.delay = FIRST_DELAY
            self.due_at = now + self.delay
            print(f"prefect-webhooks serve: {child.name} exited; starting it again in {self.delay:.0f} s (ingest and "
                  "delivery go on)", file=sys.stderr, flush=True)
            self.delay = min(self.delay * 2, MAX_DELAY)
            return
        if now >= self.due_at:
            child.start()
            self.due_at, self.started_at = None, now
            self.count += 1
