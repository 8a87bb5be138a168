"""No process a test session starts outlives it.

Every process the session starts inherits a mark in its environment (``SESSION_MARK``, set before the first test,
inherited by pytest's workers and everything they start). When the session ends, a process still carrying this
session's mark, other than the session's own processes, was left behind: a server a test forgot, or one a server
started for itself (a temporary Prefect server started inside the test server). It is named, ended, and the run fails.
Processes started with an environment of their own (no ``os.environ`` in it) carry no mark and are not seen.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from contextlib import suppress
from pathlib import Path

SESSION_MARK = "WEBHOOKS_TESTS_SESSION_MARK"
GRACE_SECONDS = 15.0


def mark_session() -> None:
    """Give this session (and every process it starts) its mark, unless a parent session gave one already."""
    os.environ.setdefault(SESSION_MARK, uuid.uuid4().hex)


def _carries(pid: int, mark: bytes) -> bool:
    with suppress(OSError):
        return mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return False


def _command(pid: int) -> str:
    with suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    return "?"


def _parent(pid: int) -> int:
    with suppress(OSError, ValueError, IndexError):
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return 0


def _ends_with_this_process(pid: int, command: str) -> bool:
    """multiprocessing's resource tracker started by this very process (a test's spawned children start one): it
    reads a pipe this process holds open and exits when this process does."""
    return "multiprocessing.resource_tracker" in command and _parent(pid) == os.getpid()


def _own_line() -> set[int]:
    """This process and its ancestors."""
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        pid = _parent(pid)
    return pids


def marked_processes() -> dict[int, str]:
    """The live processes carrying this session's mark, but this one and its ancestors, with their command lines."""
    value = os.environ.get(SESSION_MARK)
    if not value or not Path("/proc").is_dir():
        return {}
    mark, own = f"{SESSION_MARK}={value}".encode(), _own_line()
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in own and _carries(int(entry.name), mark):
            state = ""
            with suppress(OSError, IndexError):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = _command(int(entry.name))
            # A zombie has ended; its parent has yet to reap it.
            if state != "Z" and not _ends_with_this_process(int(entry.name), command):
                found[int(entry.name)] = command
    return found


def leaked_processes() -> dict[int, str]:
    """The processes left behind once the session's own had ``GRACE_SECONDS`` to end (pytest's workers, servers
    stopping); each is killed after it is found."""
    deadline = time.monotonic() + GRACE_SECONDS
    left = marked_processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = marked_processes()
    for pid in left:
        with suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left
