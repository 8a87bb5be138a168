"""Endpoint states: what every delivery process of a store shares about an endpoint (``EndpointState`` rows).

Two concerns live in one row: the request budget (``budget`` reserves slots from it; here a receiver's
``Retry-After`` pauses it and a recovery starts a ramp) and the endpoint's health (failures in a row, since when,
and which operational events were sent). Every change that must happen once across processes (an event, disabling
the endpoint) is decided under the row's lock, so exactly one process acts on it.

Budget times are seconds since the epoch by the database's clock (``clock.read_database_clock``): on PostgreSQL
processes on several hosts then agree on the time slots even when the hosts' clocks do not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, delete, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Engine

from prefect_webhooks.store.schema.clock import read_database_clock
from prefect_webhooks.store.schema.tables import EndpointState, store_now

STATES = EndpointState.__table__
FAILING = "failing"
RECOVERED = "recovered"
DISABLED = "disabled"


def url_key(url: str) -> str:
    """The key of an endpoint URL in the store: 32 hex digits of its SHA-256 (a URL may hold a token)."""
    return hashlib.sha256(url.encode()).hexdigest()[:32]


def ensure_rows(connection: Connection, destination: str, endpoints: Sequence[tuple[str, str]]) -> None:
    """Create the missing rows of ``(url_key, url)`` endpoints of ``destination`` (a write: it takes SQLite's lock)."""
    dialect_insert = postgresql_insert if connection.dialect.name == "postgresql" else sqlite_insert
    now = store_now()
    rows = [{"destination": destination, "url_key": key, "url": url, "updated_at": now} for key, url in endpoints]
    connection.execute(dialect_insert(STATES).on_conflict_do_nothing(), rows)


def lock_rows(connection: Connection, destination: str, endpoints: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """The rows of the endpoints (created when missing), locked until the transaction ends; by url key."""
    ensure_rows(connection, destination, endpoints)
    statement = (
        select(STATES)
        .where(STATES.c.destination == destination, STATES.c.url_key.in_([key for key, _ in endpoints]))
        .order_by(STATES.c.url_key)
        .with_for_update()
    )
    return {row.url_key: row for row in connection.execute(statement)}


def write_row(connection: Connection, destination: str, key: str, values: dict[str, Any]) -> None:
    """Update one endpoint's row."""
    connection.execute(
        update(STATES)
        .where(STATES.c.destination == destination, STATES.c.url_key == key)
        .values(**values, updated_at=store_now())
    )


def read_states(engine: Engine, destinations: Iterable[str]) -> dict[tuple[str, str], Any]:
    """The rows of ``destinations``' endpoints, by ``(destination, url_key)``."""
    names = sorted(set(destinations))
    with engine.connect() as connection:
        found: dict[tuple[str, str], Any] = {}
        if names:
            for row in connection.execute(select(STATES).where(STATES.c.destination.in_(names))):
                found[(row.destination, row.url_key)] = row
        return found


def _later(column: Any, value: float) -> Any:
    return case((column < value, value), else_=column)


def pause(engine: Engine, destination: str, key: str, url: str, seconds: float, ramp_from: float | None) -> None:
    """No request to this endpoint, from any process, for ``seconds`` (a receiver's ``Retry-After``).

    With ``ramp_from`` (requests per second) the endpoint ramps up again from that rate when the pause ends instead
    of getting its backlog at once.
    """
    with engine.begin() as connection:
        ensure_rows(connection, destination, [(key, url)])
        until = read_database_clock(connection) + seconds
        values: dict[str, Any] = {"paused_until": _later(STATES.c.paused_until, until)}
        if ramp_from is not None:
            values["ramp_started_at"] = _later(STATES.c.ramp_started_at, until)
            values["ramp_start_rate"] = ramp_from
        write_row(connection, destination, key, values)


def start_ramps(engine: Engine, endpoints: Sequence[tuple[str, str, str]], ramp_from: float) -> None:
    """Make ``(destination, url_key, url)`` endpoints ramp up from now (their circuit just closed), from
    ``ramp_from`` requests per second."""
    if not endpoints:
        return
    with engine.begin() as connection:
        now = read_database_clock(connection)
        for destination, key, url in endpoints:
            ensure_rows(connection, destination, [(key, url)])
            write_row(connection, destination, key, {"ramp_started_at": _later(STATES.c.ramp_started_at, now),
                                                     "ramp_start_rate": ramp_from})


@dataclass(frozen=True, slots=True)
class HealthReport:
    """What one batch's requests to one endpoint came to (requests not sent, e.g. circuit open, left out)."""

    key: str
    url: str
    succeeded: bool
    """Whether any request got a 2xx."""
    trailing_failures: int
    """Requests after the batch's last success (all of them without one) that got no 2xx."""
    first_failure_at: datetime | None
    """When the first of those was made."""
    last_error: str | None


@dataclass(frozen=True, slots=True)
class Transition:
    """An endpoint's change that one process acts on: ``failing``, ``recovered`` or ``disabled``."""

    kind: str
    destination: str
    key: str
    url: str
    failures: int
    failing_since: datetime | None
    last_error: str | None


def needs_recording(report: HealthReport, known: Any | None) -> bool:
    """Whether ``report`` changes anything: a failure, or a success after failures (``known``: the cached row)."""
    if report.trailing_failures:
        return True
    return known is not None and (known.failures > 0 or known.failing_notified_at is not None)


def record_health(
    engine: Engine,
    destination: str,
    reports: Sequence[HealthReport],
    *,
    failing_threshold: int,
    disable_after: timedelta | None,
) -> list[Transition]:
    """Add one batch's outcomes to the endpoints' health and return the transitions this process must act on."""
    if not reports:
        return []
    now = store_now()
    transitions = []
    with engine.begin() as connection:
        rows = lock_rows(connection, destination, [(report.key, report.url) for report in reports])
        for report in reports:
            row = rows[report.key]
            failures, failing_since = row.failures, row.failing_since
            notified = row.failing_notified_at
            values: dict[str, Any] = {"url": report.url}
            found: list[str] = []
            if report.succeeded:
                failures, failing_since = 0, None
                if notified is not None:
                    found.append(RECOVERED)
                    notified = None
            if report.trailing_failures:
                failures += report.trailing_failures
                started = report.first_failure_at
                if row.disabled_at is not None and started is not None and started < row.disabled_at:
                    # Requests made before the endpoint was disabled, reported by another process's batch after it:
                    # part of the run that disabled it, not a new one (that disabled it again, a second event).
                    started = row.disabled_at
                failing_since = failing_since or started
                values["last_error"] = report.last_error
            if notified is None and failures >= failing_threshold:
                found.append(FAILING)
                notified = now
            streak_since = failing_since
            if disable_after is not None and failing_since is not None and now - failing_since >= disable_after:
                found.append(DISABLED)
                values["disabled_at"] = now
                # A new run starts once the endpoint is enabled again: a full disable_after before the next.
                failing_since = None
            values.update(failures=failures, failing_since=failing_since, failing_notified_at=notified)
            write_row(connection, destination, report.key, values)
            transitions += [Transition(kind, destination, report.key, report.url, failures,
                                       row.failing_since if kind == RECOVERED else streak_since,
                                       values.get("last_error", row.last_error)) for kind in found]
    return transitions


def undo_disable(engine: Engine, destination: str, key: str, failing_since: datetime | None) -> None:
    """Take back a ``disabled`` transition the block could not be saved for: the failure run goes on."""
    with engine.begin() as connection:
        write_row(connection, destination, key, {"failing_since": failing_since, "disabled_at": None})


def reset_health(engine: Engine, destination: str, keys: Sequence[str]) -> int:
    """Forget the failures of endpoints a user enabled again; returns how many rows were reset."""
    with engine.begin() as connection:
        return connection.execute(
            update(STATES)
            .where(STATES.c.destination == destination, STATES.c.url_key.in_(list(keys)))
            .values(failures=0, failing_since=None, updated_at=store_now())
        ).rowcount


def prune_states(engine: Engine, idle_for: timedelta) -> int:
    """Delete rows of endpoints not touched for ``idle_for`` (a removed endpoint or destination)."""
    with engine.begin() as connection:
        return connection.execute(delete(STATES).where(STATES.c.updated_at < store_now() - idle_for)).rowcount
