"""The store's clock: the one "now" behind every time that decides who owns a message and when it is due.

Leases and claims, next attempts, messages parked for a rate budget, maintenance leases, retention and dedupe
cut-offs: each compares a time written by one process with "now" in another. SQLite is one host's file, so its
clock is that host's. On PostgreSQL several hosts share the store and their clocks can disagree by seconds or
minutes; there **the database's clock decides**, so that a host a minute ahead neither sends a retry early nor takes
a message whose lease another host still holds.

``store_now()`` is that now, as the store keeps times (naive UTC). It costs no round trip: each process reads the
database's clock now and then (``SELECT clock_timestamp()``) and carries the reading forward on its own monotonic
clock, so a host's wall clock (however far off, or stepped by NTP meanwhile) never enters.

- **Readings.** On every new connection, and when a connection is taken from the pool and the last reading is older
  than ``READ_EVERY`` seconds (5): one round trip every few seconds per process, in the thread making a store call,
  never on an event loop. The rate budget's transactions read the clock anyway (``budget.admit``); those readings
  count too.
- **Error.** A reading is placed at the middle of its round trip: it is off by at most half of it (under a
  millisecond on a LAN; tens of ms on a machine so busy that the reading thread waits for the GIL): a new connection
  reads three times, and a reading whose round trip took over 1.5 times the kept one's replaces it only once that
  one is ``TRUST_SECONDS`` old. Between readings the monotonic
  clock may drift from the database's by NTP's slew (500 ppm at most: 2.5 ms over 5 s).
- **A new server.** After a failover (libpq's several hosts, ``target_session_attrs=read-write``) new connections
  reach the promoted standby, whose clock is another machine's. A reading from another server than the kept one's
  (the host and port the connection reached) replaces it whatever its round trip: the old server's reading, however
  exact, is of a clock that no longer decides.
- **What it does not cover.** A machine suspended and resumed: its monotonic clock stood still, and the first store
  times until the next reading (taken by the first store call) are behind by the suspension. A database whose
  clock is stepped: followed at the next reading.

Which clock: ``store_now(engine)`` (or a connection) is that store's clock; ``store_now()`` is the clock of this
process's store, the configured one (``engines.get_engine``), which is how the delivery path, the ingest API and
maintenance read it without passing an engine around. Before the process has opened its store, and on SQLite, it is
the host's clock.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

READ_EVERY = 5.0
"""Seconds between readings of the database's clock, at most, while the process uses its store."""
TRUST_SECONDS = 60.0
"""A reading with a slower round trip than the kept one's replaces it only once the kept one is this old."""
READ_SQL = "SELECT extract(epoch from clock_timestamp())"
READINGS_AT_CONNECT = 3

_EPOCH = datetime(1970, 1, 1)


def host_now() -> datetime:
    """This host's clock, as the store keeps times (naive UTC)."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


class DatabaseClock:
    """A PostgreSQL database's clock as this process knows it: the last good reading, carried forward."""

    def __init__(self) -> None:
        # (seconds since the epoch by the database, this process's monotonic time at that moment, the round trip)
        self._reading: tuple[float, float, float] | None = None
        self._read_at = -float("inf")  # monotonic time of the last attempt to read, good or not
        self._server: str | None = None  # the server (host:port) the kept reading came from, when known
        self._lock = threading.Lock()

    def seconds(self) -> float:
        """Now, in seconds since the epoch by the database's clock (the host's until the first reading)."""
        reading = self._reading
        if reading is None:
            return time.time()
        return reading[0] + (time.monotonic() - reading[1])

    def now(self) -> datetime:
        """Now by the database's clock, naive UTC."""
        return _EPOCH + timedelta(seconds=self.seconds())

    def due(self) -> bool:
        """Whether a new reading is due (none yet, or the last one is ``READ_EVERY`` old)."""
        return time.monotonic() - self._read_at >= READ_EVERY

    def read(self, dbapi_connection: Any) -> float:
        """Read the database's clock on a DBAPI connection and keep the reading; returns it."""
        self._read_at = time.monotonic()
        cursor = dbapi_connection.cursor()
        try:
            sent = time.monotonic()
            cursor.execute(READ_SQL)
            value = float(cursor.fetchone()[0])
            answered = time.monotonic()
        finally:
            cursor.close()
        self.note(value, sent, answered, server=server_of(dbapi_connection))
        return value

    def note(self, value: float, sent: float, answered: float, *, server: str | None = None) -> None:
        """Keep a reading ``value`` (epoch seconds) taken by a round trip from ``sent`` to ``answered`` (monotonic)
        unless it is less exact than the kept one, which is still recent and of the same server (``server``: the
        host and port it came from; None when not known, taken as the kept one's)."""
        round_trip = answered - sent
        with self._lock:
            kept = self._reading
            same_server = server is None or self._server is None or server == self._server
            if (
                kept is not None
                and same_server
                and round_trip > 1.5 * kept[2] + 0.001
                and answered - kept[1] < TRUST_SECONDS
            ):
                return
            self._reading = (value, (sent + answered) / 2, round_trip)
            if server is not None:
                self._server = server

    def offset(self) -> float:
        """Seconds the database's clock is ahead of this host's wall clock (for logs and tests)."""
        return self.seconds() - time.time()


def server_of(dbapi_connection: Any) -> str | None:
    """The server a psycopg connection reached (``host:port``; of several hosts, the one libpq chose), or None."""
    info = getattr(dbapi_connection, "info", None)
    host, port = getattr(info, "host", None), getattr(info, "port", None)
    return f"{host}:{port}" if host else None


_clocks: WeakKeyDictionary[Engine, DatabaseClock] = WeakKeyDictionary()
_process_clock: DatabaseClock | None = None


def follow_database_clock(engine: Engine) -> DatabaseClock | None:
    """Give a PostgreSQL ``engine`` its clock: read on each new connection and, when due, on checkout. None for
    SQLite (the host's clock is the store's)."""
    if engine.dialect.name != "postgresql":
        return None
    clock = _clocks.get(engine)
    if clock is not None:
        return clock
    clock = _clocks[engine] = DatabaseClock()

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Three readings, the fastest kept: a first reading taken while the machine is busy can be tens of ms off.
        for _ in range(READINGS_AT_CONNECT):
            _read_quietly(clock, dbapi_connection)

    def on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if clock.due():
            _read_quietly(clock, dbapi_connection)

    event.listen(engine, "connect", on_connect)
    event.listen(engine, "checkout", on_checkout)
    return clock


def _read_quietly(clock: DatabaseClock, dbapi_connection: Any) -> None:
    """A reading outside any transaction of the caller's; a failure keeps the last reading (the connection's own
    next statement meets the same fault and reports it)."""
    try:
        clock.read(dbapi_connection)
        dbapi_connection.rollback()  # the SELECT began a transaction: the caller's starts fresh
    except Exception:  # noqa: BLE001 - a clock reading never fails a store call by itself
        clock._read_at = time.monotonic()


def use_as_process_clock(engine: Engine | None) -> None:
    """Make ``engine``'s clock the one ``store_now()`` reads (None: the host's)."""
    global _process_clock
    _process_clock = _clocks.get(engine) if engine is not None else None


def clock_of(bind: Engine | Connection | None) -> DatabaseClock | None:
    """The database clock behind ``bind`` (None: this process's store), or None where the host's clock is the
    store's."""
    if bind is None:
        return _process_clock
    return _clocks.get(bind.engine if isinstance(bind, Connection) else bind)


def store_now(bind: Engine | Connection | None = None) -> datetime:
    """Now by the store's clock, naive UTC: ``bind``'s database, by default this process's store (see the module)."""
    clock = _process_clock if bind is None else clock_of(bind)
    return host_now() if clock is None else clock.now()


def store_seconds(bind: Engine | Connection | None = None) -> float:
    """``store_now`` as seconds since the epoch (the rate budget's times, ``budget``)."""
    clock = _process_clock if bind is None else clock_of(bind)
    return time.time() if clock is None else clock.seconds()


def read_database_clock(connection: Connection) -> float:
    """Now in seconds since the epoch, read from the database itself in ``connection``'s transaction (the host's
    clock on SQLite); the reading also serves ``store_now``."""
    if connection.dialect.name != "postgresql":
        return time.time()
    clock = clock_of(connection)
    sent = time.monotonic()
    value = float(connection.exec_driver_sql(READ_SQL).scalar_one())
    if clock is not None:
        clock.note(value, sent, time.monotonic())
    return value
