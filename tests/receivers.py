"""A real HTTP receiver on 127.0.0.1 for delivery tests, scriptable per request.

It runs an aiohttp server in its own thread and event loop, records every request it gets (method, path, headers,
raw body, time), and answers from a script: a list of behaviours consumed one per request, then ``default``.
A behaviour is an int status, or a dict ``{"status": 429, "headers": {...}, "delay": 6.0, "reset": True, "text":
"...", "echo_headers": True}`` (the answer's text, "ok" by default; the request's headers as JSON before it).
An ``answer_for`` (raw body → behaviour, or None for the script) picks a behaviour by what was sent.
With a ``verifier`` (raw body, headers → accepted?) a request it refuses is answered 401 and kept in ``rejected``,
as a receiver checking signatures would.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class ReceivedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    peer: Any = None
    """The sender's address and port: requests on one kept-alive connection share it."""


@dataclass
class Receiver:
    """A scripted HTTP receiver; use as a context manager."""

    script: list[Any] = field(default_factory=list)
    default: Any = 200
    ssl_context: ssl.SSLContext | None = None
    requests: list[ReceivedRequest] = field(default_factory=list)
    port: int = 0
    verifier: Callable[[bytes, dict[str, str]], bool] | None = None
    rejected: list[ReceivedRequest] = field(default_factory=list)
    answer_for: Callable[[bytes], Any] | None = None

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context else "http"
        return f"{scheme}://127.0.0.1:{self.port}/hook"

    def _next_behaviour(self) -> Any:
        with self._lock:
            return self.script.pop(0) if self.script else self.default

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        received = ReceivedRequest(request.method, request.path, dict(request.headers), body, time.time(),
                                   request.transport.get_extra_info("peername") if request.transport else None)
        with self._lock:
            self.requests.append(received)
        if self.verifier is not None and not self.verifier(body, received.headers):
            with self._lock:
                self.rejected.append(received)
            return web.Response(status=401, text="bad signature")
        chosen = self.answer_for(body) if self.answer_for is not None else None
        behaviour = chosen if chosen is not None else self._next_behaviour()
        if isinstance(behaviour, int):
            behaviour = {"status": behaviour}
        if behaviour.get("delay"):
            await asyncio.sleep(behaviour["delay"])
        if behaviour.get("reset"):
            assert request.transport is not None
            request.transport.abort()
            return web.Response(status=500)
        text = behaviour.get("text", "ok")
        if behaviour.get("echo_headers"):  # as a careless receiver's error page might
            text = json.dumps(dict(request.headers)) + text
        return web.Response(status=behaviour.get("status", 200), headers=behaviour.get("headers"), text=text)

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=2**24)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self.ssl_context)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def start(self) -> Receiver:
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("receiver did not start")
        return self

    def stop(self) -> None:
        if self._loop and self._thread:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_for(self, count: int, timeout: float = 30.0) -> list[ReceivedRequest]:
        """Wait until at least ``count`` requests arrived; return them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.requests) >= count:
                    return list(self.requests)
            time.sleep(0.02)
        raise AssertionError(f"receiver got {len(self.requests)} requests, expected {count}")
