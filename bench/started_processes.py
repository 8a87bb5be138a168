"""Processes a benchmark starts and stops: each in its own session, its output to a log, stopped with its whole
group at the end; a free port, a wait until an HTTP server answers, and the receiver (``recorder.py``) with its
per-step figures.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, process: subprocess.Popen[Any] | None, timeout: float, what: str) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready after {timeout:.0f} s")


def stop_process(process: subprocess.Popen[Any] | None, sig: int = signal.SIGTERM, timeout: float = 60) -> None:
    """Stop a process started in its own session, and whatever is left of its group."""
    if process is None:
        return
    if process.poll() is None:
        with suppress(ProcessLookupError):
            process.send_signal(sig)
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout)
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with suppress(subprocess.TimeoutExpired):
        process.wait(10)


@contextmanager
def started(command: list[str], *, env: dict[str, str], log: Path, sig: int = signal.SIGTERM,
            cwd: Path = ROOT):
    """Run ``command`` in its own session (output to ``log``) until the block ends."""
    with log.open("ab") as handle:
        process = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=cwd,
                                   start_new_session=True)
    try:
        yield process
    finally:
        stop_process(process, sig)


def recorder(workdir: Path):
    port = free_port()
    return port, started([sys.executable, str(BENCH / "recorder.py"), str(port)], env=dict(os.environ),
                         log=workdir / "recorder.log")


def receiver_stats(port: int, step: int) -> dict[str, Any]:
    import httpx

    return httpx.get(f"http://127.0.0.1:{port}/_stats/{step}", timeout=30).json()

