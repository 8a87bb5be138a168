"""SQLite's one writer, taken in turn: a write transaction first waits at a gate the kernel keeps.

SQLite lets one transaction write at a time, and a writer that finds the lock taken sleeps and polls: 1 ms, 2, 5 …
then every 100 ms until its busy timeout. So a writer that has waited a while sleeps 100 ms between looks while the
newcomers' first short sleeps win the lock, and the lock may lie free while every waiter sleeps. With serve's
writers on one store (the ingest API's group commit, each delivery worker's claims, leases and records, the pruner)
this made the longest waits hundreds of ms and cost throughput. Measured (``bench/bench_write_gate.py``, three
writer processes on two cores holding the lock 3 ms each): 216 transactions/s, waits p99 104 ms and max 630 ms
polling; 282/s, p99 8 ms and max 15 ms at the gate.

The gate is an exclusive ``flock`` on a file beside the store (``<store>-write-gate``), taken before a connection's
first write of a transaction and given back when it commits or rolls back. A blocked ``flock`` is woken by the
kernel the moment the holder lets go, so the lock passes from writer to writer without a sleep, and a writer that
has waited long is not overtaken by newcomers polling faster. Within a process the waiting writers go in the order
they came: one waiter thread blocks in ``flock`` for each in turn.

The wait is bounded: past the store's busy timeout (30 s) a writer goes on without the gate and SQLite's own busy
handler decides from there, so a writer that hangs inside its transaction makes the others fail with "database is
locked" as before (after up to twice the busy timeout) rather than wait for ever. A holder killed with ``SIGKILL``
lets go with its descriptor. Only statements that start a write (``INSERT``, ``UPDATE``, ``DELETE``, ``REPLACE``,
``BEGIN IMMEDIATE``) take it; reads never wait here, and a write the gate does not recognise simply meets SQLite's
busy handler.
"""

from __future__ import annotations

import os
import queue
import re
import sqlite3
import stat
import threading
from collections.abc import Callable
from typing import IO, Any

try:
    import fcntl
except ImportError:  # not on Windows: there, SQLite's busy handler alone orders the writers
    fcntl = None  # type: ignore[assignment]

GATE_SUFFIX = "-write-gate"
_WRITES = re.compile(r"\s*(INSERT|UPDATE|DELETE|REPLACE|BEGIN\s+(IMMEDIATE|EXCLUSIVE))\b", re.IGNORECASE)


class GatedConnection(sqlite3.Connection):
    """A ``sqlite3`` connection whose write transactions wait their turn at the store's gate (``sqlite3.connect``'s
    ``factory``). A store without a file (``:memory:``, a URI) has no gate."""

    def __init__(self, database: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(database, *args, **kwargs)
        self._gate: IO[bytes] | None = None
        self._holds = False
        self._pid = os.getpid()
        self._wait = float(kwargs.get("timeout", args[0] if args else 5.0))
        path = os.fsdecode(database) if isinstance(database, (str, bytes, os.PathLike)) else ""
        if fcntl is not None and path and path != ":memory:" and not kwargs.get("uri"):
            self._gate = _open_gate(path)

    def cursor(self, factory: type[sqlite3.Cursor] | None = None) -> sqlite3.Cursor:  # type: ignore[override]
        return super().cursor(factory or GatedCursor)

    @property
    def holds_gate(self) -> bool:
        """Whether this connection's open write transaction holds the gate."""
        return self._holds

    def take_gate(self, statement: str) -> None:
        """Wait at the gate before ``statement`` if it starts this connection's write transaction."""
        if self._gate is None or self._holds or self.in_transaction or not _WRITES.match(statement):
            return
        self._holds = _take(self._gate, self._wait)

    def leave_gate(self) -> None:
        """Give the gate back once no transaction is open (after a commit, a rollback, or a write that failed before
        it began one)."""
        if self._holds and not self.in_transaction:
            self._holds = False
            fcntl.flock(self._gate, fcntl.LOCK_UN)

    def _ending(self, end: Callable[..., Any], *args: Any) -> Any:
        try:
            return end(*args)
        finally:
            self.leave_gate()

    def commit(self) -> None:
        self._ending(super().commit)

    def rollback(self) -> None:
        self._ending(super().rollback)

    def __exit__(self, *exc_info: Any) -> Any:
        # sqlite3 commits or rolls back here without calling the methods above.
        return self._ending(super().__exit__, *exc_info)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._gate is not None:
                # Not in a forked child that inherited the descriptor: unlocking there would free its parent's turn.
                if self._holds and self._pid == os.getpid():
                    fcntl.flock(self._gate, fcntl.LOCK_UN)
                self._holds = False
                self._gate.close()
                self._gate = None


class GatedCursor(sqlite3.Cursor):
    """A cursor of a ``GatedConnection``: a statement that starts a write transaction waits at the gate first."""

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        return self._in_turn(super().execute, sql, parameters)

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> sqlite3.Cursor:
        return self._in_turn(super().executemany, sql, seq_of_parameters)

    def _in_turn(self, run: Callable[[str, Any], sqlite3.Cursor], sql: str, parameters: Any) -> sqlite3.Cursor:
        connection: GatedConnection = self.connection  # type: ignore[assignment]
        connection.take_gate(sql)
        try:
            return run(sql, parameters)
        finally:
            connection.leave_gate()


def _open_gate(store: str) -> IO[bytes] | None:
    """The gate file of the store file ``store``, made with the store's permissions (owner-only for a store
    ``serve`` created; a store its owner shares with a group shares its gate too); None where it cannot be opened,
    and then SQLite's busy handler alone orders this connection's writes."""
    try:
        mode = stat.S_IMODE(os.stat(store).st_mode) & 0o666
    except OSError:
        mode = 0o600
    try:
        # Read-only is enough for a flock, and lets every user who may read the store take turns.
        return os.fdopen(os.open(store + GATE_SUFFIX, os.O_RDONLY | os.O_CREAT, mode), "rb", buffering=0)
    except OSError:
        return None


def _take(gate: IO[bytes], wait: float) -> bool:
    """Take ``gate`` (True), or give up after ``wait`` seconds (False): at once when it is free, else through the
    process's waiter, which blocks in ``flock`` so that the kernel wakes it when the holder lets go."""
    try:
        fcntl.flock(gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        pass
    request = _Request(gate)
    _waiter().put(request)
    if request.taken.wait(wait):
        return True
    with request.lock:
        if request.taken.is_set():  # taken just as the wait ended
            return True
        request.abandoned = True
    return False


class _Request:
    __slots__ = ("gate", "taken", "abandoned", "lock")

    def __init__(self, gate: IO[bytes]) -> None:
        self.gate = gate
        self.taken = threading.Event()
        self.abandoned = False
        self.lock = threading.Lock()


_requests: queue.SimpleQueue[_Request] | None = None
_requests_lock = threading.Lock()


def _waiter() -> queue.SimpleQueue[_Request]:
    """The process's waiter thread's requests, started on first need (and again in a forked child, which has no
    threads)."""
    global _requests, _waiter_pid
    with _requests_lock:
        if _requests is None or _waiter_pid != os.getpid():
            _requests = queue.SimpleQueue()
            _waiter_pid = os.getpid()
            threading.Thread(target=_wait_in_turn, args=(_requests,), name="store-write-gate", daemon=True).start()
        return _requests


_waiter_pid = 0


def _wait_in_turn(requests: queue.SimpleQueue[_Request]) -> None:
    while True:
        request = requests.get()
        try:
            fcntl.flock(request.gate, fcntl.LOCK_EX)
        except (OSError, ValueError):  # its connection closed meanwhile
            continue
        with request.lock:
            if not request.abandoned:
                request.taken.set()
                continue
        fcntl.flock(request.gate, fcntl.LOCK_UN)
