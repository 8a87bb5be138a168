"""The processes below ``serve``: whether one runs (a lease owner of this host included), what it started, stopping
them, and their log lines."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Sequence

import psutil


def process_running(pid: int) -> bool:
    """Whether ``pid`` exists and has not exited (a zombie waiting to be reaped counts as exited)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def descendant_pids(pid: int) -> list[int]:
    """The processes below ``pid`` (children, grandchildren…); empty where there is none or ``pid`` is gone."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def terminate_and_wait(pids: Sequence[int], timeout: float) -> None:
    """SIGTERM each of ``pids`` and wait up to ``timeout`` seconds for all of them to exit."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(process_running(pid) for pid in pids):
        time.sleep(0.05)


def log_to_stderr(logger: logging.Logger) -> None:
    """Send ``logger``'s lines (INFO and up) to stderr, timestamped like Prefect's, and only there: a child process
    of ``serve`` logs beside Prefect's console output without going through Prefect's handlers."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)-7s | %(name)s - %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def dead_local_owners(owners: Sequence[str], hostname: str | None = None) -> list[str]:
    """The lease owners (``host:pid:run``, ``delivery.pacing.context.new_owner``) of this host whose process is gone."""
    host = (hostname or socket.gethostname())[:40]
    dead = []
    for owner in owners:
        owner_host, _, rest = owner.partition(":")
        pid = rest.partition(":")[0]
        if owner_host == host and pid.isdigit() and not psutil.pid_exists(int(pid)):
            dead.append(owner)
    return dead
