"""Real Prefect API outages for tests.

- ``ApiSwitch``: a TCP forwarder (in the test's event loop) in front of a real Prefect API. ``down()`` closes it
  (connections refused, as when the server is killed), ``hang()`` keeps accepting but never answers (a hung
  server, a partition), ``up()`` forwards again on the same address — the code under test keeps its URL throughout.
- ``PrefectServer``: ``prefect server start`` in a subprocess on a fixed port, SIGKILLed and started again on the
  same port with the same database (the slow outage tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from prefect.settings import PREFECT_API_URL, temporary_settings

from tests.servers import free_port


class ApiSwitch:
    """A switchable forwarder to a Prefect API, in a thread and event loop of its own; ``url`` is its API URL.

    Its own loop: the code under test may block its loop while a thread of Prefect's reaches the API (the flow
    engine's observers do), which a forwarder in the same loop would turn into a deadlock.
    """

    def __init__(self, target_url: str) -> None:
        target = urlsplit(target_url)
        self.target = (target.hostname or "127.0.0.1", target.port or 80)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}{target.path}"
        self.server: asyncio.AbstractServer | None = None
        self.hanging = False
        self.connections: set[asyncio.StreamWriter] = set()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def _do(self, coroutine: Any) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(10)

    def up(self) -> None:
        """Forward connections to the API."""
        self._do(self._up())

    def down(self) -> None:
        """Refuse connections and drop the open ones (a killed server)."""
        self._do(self._down())

    def hang(self) -> None:
        """Accept connections and requests, answer nothing (open connections stop answering too)."""
        self._do(self._up())
        self.hanging = True

    def close(self) -> None:
        """Stop the forwarder and its thread."""
        self._do(self._down())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _up(self) -> None:
        self.hanging = False
        if self.server is None:
            self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _down(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for writer in list(self.connections):
            writer.transport.abort()
        self.connections.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.add(writer)
        try:
            if self.hanging:
                await reader.read()  # until the client gives up
                return
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
            self.connections.add(upstream_writer)
            await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))
        except (ConnectionError, OSError):
            pass
        finally:
            self.connections.discard(writer)
            writer.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                while self.hanging:
                    await asyncio.sleep(0.05)
                writer.write(data)
                await writer.drain()
        finally:
            self.connections.discard(writer)
            writer.transport.abort()


@contextmanager
def switched_api() -> Iterator[ApiSwitch]:
    """The session's Prefect API behind an ``ApiSwitch`` (up), set as ``PREFECT_API_URL`` for the block."""
    from prefect.events.worker import EventsWorker

    switch = ApiSwitch(PREFECT_API_URL.value())
    switch.up()
    try:
        with temporary_settings(updates={PREFECT_API_URL: switch.url}):
            yield switch
    finally:
        # Events sent to the forwarder's address go out while it still forwards (else the session's end waits for
        # them to give up, a minute).
        switch.up()
        # From a thread: called where an event loop runs, drain_all returns a coroutine instead of waiting.
        drainer = threading.Thread(target=EventsWorker.drain_all, kwargs={"timeout": 15}, daemon=True)
        drainer.start()
        drainer.join(20)
        switch.close()


class PrefectServer:
    """``prefect server start`` on a fixed port, with its own home (database) that survives a kill."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/api"
        self.env = {**env, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                    "PREFECT_API_URL": self.url}
        self.process: subprocess.Popen[bytes] | None = None
        self.log = home / "server.log"

    def start(self, timeout: float = 120) -> float:
        """Start it and wait until ``/health`` answers; returns the seconds that took."""
        self.home.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        while time.monotonic() - started < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"prefect server exited with {self.process.returncode}; see {self.log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return time.monotonic() - started
            time.sleep(0.2)
        raise TimeoutError(f"prefect server not healthy after {timeout:.0f} s; see {self.log}")

    def kill(self) -> None:
        """SIGKILL the server and everything it started."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def stop(self) -> None:
        """Stop it cleanly (the end of a test)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


@contextmanager
def prefect_server(home: Path, env: dict[str, str]) -> Iterator[PrefectServer]:
    """A started ``PrefectServer``, stopped at the end whatever happens."""
    server = PrefectServer(home, env)
    try:
        server.start()
        yield server
    finally:
        server.stop()
