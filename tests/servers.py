"""Real servers for tests: the ingest API in a subprocess (real uvicorn), and helpers that save blocks.

Interface used by other test modules (keep it stable):

- ``ingest_api_process(store_url, *, prefect_api_url, port=None, env=None, args=())``: context manager yielding an
  object with ``.url``, ``.process`` and ``.kill()``.
- ``save_source(name, write_key, destinations)`` and ``save_destination(name, urls, shared_secret=None)``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.blocks.source import Source

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class IngestServer:
    """A running ``prefect-webhooks ingest`` subprocess."""

    url: str
    process: subprocess.Popen
    log: IO[bytes] | None = None

    def output(self) -> str:
        """What the server printed so far (stdout and stderr)."""
        if self.log is None:
            return ""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def kill(self) -> None:
        """SIGKILL the server (no graceful shutdown)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)


def _wait_healthy(server: IngestServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"ingest API exited with {server.process.returncode}: {server.output()[-2000:]}")
        try:
            if httpx.get(f"{server.url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"ingest API at {server.url} not healthy after {timeout} s")


@contextmanager
def ingest_api_process(
    store_url: str,
    *,
    prefect_api_url: str,
    port: int | None = None,
    env: dict | None = None,
    startup_timeout: float = 60.0,
    args: tuple[str, ...] = (),
) -> Iterator[IngestServer]:
    """Run the ingest API (real uvicorn) in a subprocess on 127.0.0.1 until the block exits.

    Args:
        store_url: The store the API writes to.
        prefect_api_url: The Prefect API the Source blocks are read from
            (inside ``prefect_harness``: ``prefect.settings.PREFECT_API_URL.value()``).
        port: Port to listen on (a free one by default).
        env: Extra environment variables for the server.
        startup_timeout: Seconds to wait for ``/health``.
        args: Extra options of ``prefect-webhooks ingest`` (``--workers 2``).
    """
    port = port or free_port()
    child_env = {
        **os.environ,
        "PREFECT_API_URL": prefect_api_url,
        "PREFECT_WEBHOOKS_DATABASE_URL": store_url,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        **(env or {}),
    }
    # A file, not a pipe: a pipe nobody reads would block a chatty server.
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below
    process = subprocess.Popen(
        [sys.executable, "-m", "prefect_webhooks.cli", "ingest", "--host", "127.0.0.1", "--port", str(port), *args],
        env=child_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    server = IngestServer(url=f"http://127.0.0.1:{port}", process=process, log=log)
    try:
        _wait_healthy(server, startup_timeout)
        yield server
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                server.kill()
        log.close()


def save_source(name: str, write_key: str, destinations: list[str]) -> None:
    """Save (or overwrite) a Source block; call from sync code inside ``prefect_harness``."""
    Source(write_key=write_key, destinations=destinations).save(name, overwrite=True)


def save_destination(name: str, urls: list[str], shared_secret: str | None = None) -> None:
    """Save (or overwrite) a WebhookDestination block with these endpoint URLs."""
    WebhookDestination(endpoints=[{"url": url} for url in urls], shared_secret=shared_secret).save(
        name, overwrite=True
    )


def task_names(flow_run_id: object) -> set[str]:
    """The names of a flow run's tasks as the Prefect UI shows them (task run names without their suffix)."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        runs = client.request("POST", "/task_runs/filter", json={
            "flow_runs": {"id": {"any_": [str(flow_run_id)]}}, "limit": 200, "offset": 0}).json()
    return {run["name"].rsplit("-", 1)[0] for run in runs}



@dataclass
class Background:
    """A command running in its own process group, its output (stdout and stderr) collected in a file."""

    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float) -> None:
        """Block until ``text`` is in the output; fail with the output if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.process.poll() is not None:
                raise AssertionError(f"exited {self.process.returncode} before printing {text!r}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} after {timeout:.0f} s:\n{self.output()}")
            time.sleep(0.2)

    def stop(self, signum: int = signal.SIGINT, timeout: float = 60.0) -> float:
        """Send ``signum`` to the process and return the seconds it took to exit (its group is killed after
        ``timeout``)."""
        started = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(signum)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout)
        seconds = time.monotonic() - started
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # whatever it left behind
        self.process.wait()
        return seconds


@contextmanager
def background(command: list[str], *, env: dict[str, str], cwd: Path, name: str) -> Iterator[Background]:
    """Run ``command`` in the background for the ``with`` block; its output goes to ``cwd/name.log``."""
    log = cwd / f"{name}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(command, env=env, cwd=cwd, stdout=sink, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    running = Background(process, log)
    try:
        yield running
    finally:
        running.stop(signal.SIGTERM, timeout=20)
