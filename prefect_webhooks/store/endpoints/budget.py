"""Request budget: time slots for requests to rate-limited endpoints, shared by every process of a store.

Each endpoint's ``EndpointState`` row is a GCRA cell (the generic cell rate algorithm, as RudderStack throttles): its
``tat`` is when the next slot is free, one slot every ``1 / rate`` seconds, and ``burst`` slots may be taken at once
after a quiet spell. ``admit`` takes slots for a destination's messages in one transaction under the rows' locks,
so the requests of all processes together never exceed the rate, however many hosts they run on.

A message that gets no slot within ``horizon`` seconds is *parked*: its caller puts it off to an estimated time
from the ``parked_until`` cursor, spaced at the rate, so it leaves the due messages and no claim reads it again
before its turn (claiming and discarding throttled messages is what loaded RudderStack's database: rudder-server
PR #5685). While parked messages wait, fresh ones queue behind them.

The rate ramps up after a recovery or a ``Retry-After`` pause: it starts at the endpoint's ramp start rate (a share
of what it took in its best recent seconds, at least the ``ramp_up_start_rate`` setting:
``delivery.pacing.rate_limits.ramp_start_of``) and doubles six times over ``ramp_seconds``, capped by the endpoint's own
limit; past the ramp an endpoint without a limit has none.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import update
from sqlalchemy.engine import Engine

from prefect_webhooks.messages.outcomes import PENDING, THROTTLED_REASON
from prefect_webhooks.store.endpoints.states import lock_rows, write_row
from prefect_webhooks.store.schema.clock import read_database_clock
from prefect_webhooks.store.schema.tables import OutboxMessage, free_of_lease, store_now

OUTBOX = OutboxMessage.__table__

RAMP_DOUBLINGS = 6
# A ramp from the endpoint's own recent rate: from ``ramp_up_share`` of it (half) to twice it in two doublings, then
# no ramp at all. Beyond twice what the endpoint took, the ramp only slowed the backlog's drain: every request kept
# taking a budget slot for six doublings (12 s) while the delivery process could not send faster anyway; a doubling
# every second, not every two, gave a 20-second outage's backlog 2 s more of full speed (bench/README.md).
MEASURED_DOUBLINGS = 2
MEASURED_DOUBLING_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Limit:
    """One endpoint of a destination as the budget sees it: its key, display URL and configured limit."""

    key: str
    url: str
    rate: float | None
    burst: int = 1


@dataclass(frozen=True, slots=True)
class Ramp:
    """How an endpoint's rate grows back after a recovery: from ``start_rate``, doubling over ``seconds``."""

    start_rate: float
    seconds: float

    def rate(self, started_at: float, at: float, start_rate: float | None = None) -> float:
        """The ramp's rate at ``at`` for a ramp that started at ``started_at`` from ``start_rate`` (the endpoint's,
        kept with its state; ``self.start_rate`` without one), infinite once it is over.

        A ramp from the endpoint's own recent rate (above the setting's) is already near what the endpoint takes:
        it doubles every ``MEASURED_DOUBLING_SECONDS``, ``MEASURED_DOUBLINGS`` times, so the endpoint has all of its
        rate back within seconds; one from the setting's absolute rate probes upwards over the whole ``seconds``.
        """
        seconds, doublings = self.seconds, RAMP_DOUBLINGS
        if start_rate is not None and start_rate > self.start_rate:
            doublings = MEASURED_DOUBLINGS
            seconds = min(seconds, MEASURED_DOUBLINGS * MEASURED_DOUBLING_SECONDS)
        if seconds <= 0 or not started_at or at >= started_at + seconds:
            return math.inf
        elapsed = max(at - started_at, 0.0)
        return (start_rate or self.start_rate) * 2 ** (doublings * elapsed / seconds)


@dataclass(slots=True)
class _Cell:
    """One endpoint's budget while a transaction holds its row."""

    limit: Limit
    ramp: Ramp
    tat: float
    parked_until: float
    paused_until: float
    ramp_started_at: float
    ramp_start_rate: float | None

    def interval(self, at: float) -> float:
        rate = min(self.limit.rate or math.inf, self.ramp.rate(self.ramp_started_at, at, self.ramp_start_rate))
        return 0.0 if math.isinf(rate) else 1.0 / rate

    def next_slot(self, now: float) -> float:
        start = max(now, self.paused_until)
        tolerance = (self.limit.burst - 1) * self.interval(start)
        return max(start, self.tat - tolerance)

    def take(self, slot: float) -> None:
        self.tat = max(self.tat, slot) + self.interval(slot)

    def park_start(self, now: float) -> float:
        return max(now, self.parked_until, self.tat, self.paused_until)


@dataclass(slots=True)
class Admission:
    """Per message, in the order asked: seconds from now until its slot (admitted) or its parked time."""

    admitted: list[bool] = field(default_factory=list)
    delays: list[float] = field(default_factory=list)
    config_changed: bool = False
    """The limit differs from the one the store last saw: budget and parking cursor were reset."""
    now: float = 0.0
    """The database's now the delays count from."""


def admit(
    engine: Engine,
    destination: str,
    limits: Sequence[Limit],
    returning: Sequence[bool],
    *,
    horizon: float,
    ramp: Ramp,
) -> Admission:
    """Take slots for messages to ``destination``, whose requests go to every endpoint in ``limits``.

    Args:
        engine: The store.
        destination: The destination block name.
        limits: Its endpoints that are limited, paused or ramping.
        returning: Per message, in priority order: whether it is coming back from being parked (it goes first).
        horizon: Slots further away than this are not taken: the message is parked instead.
        ramp: The ramp after a recovery.

    Returns:
        Each message's slot or parked time, as seconds from the database's now.
    """
    admission = Admission()
    with engine.begin() as connection:
        rows = lock_rows(connection, destination, [(limit.key, limit.url) for limit in limits])
        now = admission.now = read_database_clock(connection)
        cells = []
        for limit in limits:
            row = rows[limit.key]
            cell = _Cell(limit, ramp, row.tat, row.parked_until, row.paused_until, row.ramp_started_at,
                         row.ramp_start_rate)
            if (row.rate, row.burst) != (limit.rate, limit.burst):
                # A new limit: the old schedule means nothing to it.
                cell.tat = cell.parked_until = 0.0
                admission.config_changed = True
            cells.append(cell)
        backlog = any(cell.parked_until > now for cell in cells)
        for comes_back in returning:
            slot = max(cell.next_slot(now) for cell in cells)
            if slot <= now + horizon and (comes_back or not backlog):
                for cell in cells:
                    cell.take(slot)
                admission.admitted.append(True)
                admission.delays.append(slot - now)
                continue
            parked_at = max(cell.park_start(now) for cell in cells)
            for cell in cells:
                cell.parked_until = parked_at + cell.interval(parked_at)
            admission.admitted.append(False)
            admission.delays.append(parked_at - now)
            backlog = True
        for cell in cells:
            write_row(connection, destination, cell.limit.key, {
                "tat": cell.tat, "parked_until": cell.parked_until, "rate": cell.limit.rate,
                "burst": cell.limit.burst, "url": cell.limit.url})
    return admission


def release_parked(engine: Engine, destination: str) -> int:
    """Make the messages of ``destination`` waiting for budget due now (its limit changed); returns how many."""
    now = store_now(engine)
    statement = (
        update(OUTBOX)
        .where(OUTBOX.c.destination == destination, OUTBOX.c.state == PENDING, OUTBOX.c.next_attempt_at > now,
               OUTBOX.c.reason.startswith(THROTTLED_REASON),
               free_of_lease(now))
        .values(next_attempt_at=now)
    )
    with engine.begin() as connection:
        return connection.execute(statement).rowcount
