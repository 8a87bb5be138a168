"""The receiver-outage fault step of ``bench_capacity.py`` (``--receiver-outage SECONDS``).

During the first load step the receiver (``recorder.py``) answers ``503`` to every request for SECONDS, from
``--outage-at`` seconds into the step; then it takes everything again. Reported for the step: the rate delivered
before the outage, how long after the receiver's recovery the backlog built meanwhile was gone (everything offered
until then received), and how long until every later second's slowest message arrived within 1 s of being sent.
Compare runs with ``--env PREFECT_WEBHOOKS_RAMP_UP_SHARE 0`` (every endpoint restarts at the absolute
``ramp_up_start_rate``) and without (half of the destination's recent rate at once).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from outage_fault import Outage


@dataclass
class ReceiverOutage(Outage):
    """The receiver answering 503 for ``seconds``, ``at`` seconds into the step (timed as ``Outage`` is; no server
    to kill: ``server`` and ``wait_healthy`` are None)."""

    receiver_port: int = 0
    failed_at: float = 0.0
    recovered_at: float = 0.0

    def inject(self) -> None:
        import httpx

        httpx.get(f"http://127.0.0.1:{self.receiver_port}/_fail/{self.seconds}", timeout=10)
        self.failed_at = time.time()
        self.recovered_at = self.failed_at + self.seconds

    def describe(self, stats: dict[str, Any], offered: float, started_at: float, ended_at: float) -> str:
        per_second = {int(second): count for second, count in stats["per_second"].items()}
        worst = {int(second): delay for second, delay in stats["worst_per_second"].items()}
        before = sum(per_second.get(s, 0) for s in range(int(self.failed_at) - 10, int(self.failed_at))) / 10
        backlog_gone = caught_up(per_second, offered, started_at, self.recovered_at, ended_at)
        fast_again = delays_back_under(worst, 1.0, self.recovered_at)
        shape = " ".join(f"{sum(per_second.get(s, 0) for s in range(start, start + 5)) / 5:,.0f}"
                         for start in range(int(self.recovered_at), int(self.recovered_at) + 120, 5))
        return (f"  receiver answered 503 for {self.seconds:.0f} s from {self.failed_at - started_at:.0f} s into the "
                f"step; delivered {before:,.0f}/s before; after its recovery: backlog gone in "
                f"{_seconds(backlog_gone)}, every message within 1 s of being sent again after {_seconds(fast_again)}"
                f"\n          delivered/s after the recovery, 5 s at a time: {shape}")


def _seconds(value: float | None) -> str:
    return "never (within the step and its drain)" if value is None else f"{value:.0f} s"


def caught_up(per_second: dict[int, int], offered: float, started_at: float, recovered_at: float,
              ended_at: float) -> float | None:
    """Seconds from ``recovered_at`` to the first second by whose end everything offered until then had arrived (1 %
    short allowed: the generator's pace is not exact); None when that never happened."""
    received = sum(count for second, count in per_second.items() if second < int(recovered_at))
    last = max(per_second, default=int(recovered_at))
    for second in range(int(recovered_at), last + 1):
        received += per_second.get(second, 0)
        offered_until = offered * (min(second + 1, ended_at) - started_at)
        if received >= 0.99 * offered_until:
            return max(second + 1 - recovered_at, 0.0)
    return None


def delays_back_under(worst: dict[int, float], bound: float, recovered_at: float) -> float | None:
    """Seconds from ``recovered_at`` to the first second from which every later second's slowest arrival took at
    most ``bound`` seconds; None when that never happened."""
    seconds = sorted(second for second in worst if second >= int(recovered_at))
    for index, second in enumerate(seconds):
        if all(worst[later] <= bound for later in seconds[index:]):
            return max(second - recovered_at, 0.0)
    return None
