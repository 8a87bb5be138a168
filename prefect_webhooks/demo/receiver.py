"""The demo's webhook receiver: a local aiohttp server (own thread) that verifies every request's signature."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import orjson

from prefect_webhooks.signing.signatures import SIGNATURE_HEADER, verify


class SigningReceiver:
    """A local webhook receiver (aiohttp, own thread) that verifies ``X-Signature`` on every request."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.port = 0
        self.bodies: list[dict[str, Any]] = []
        self.verified = 0
        self.rejected = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        """The URL the destination block points at."""
        return f"http://127.0.0.1:{self.port}/webhook"

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.read()
        signature = request.headers.get(SIGNATURE_HEADER, "")
        authentic = bool(signature) and verify(body, signature, self.secret)
        with self._lock:
            if authentic:
                self.verified += 1
                self.bodies.append(orjson.loads(body))
            else:
                self.rejected += 1
        # A receiver that cannot authenticate a request must not accept it.
        return web.Response(status=200 if authentic else 401, text="ok" if authentic else "bad signature")

    def _serve(self) -> None:
        from aiohttp import web

        self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/webhook", self._handle)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())
        self._loop.close()

    def start(self) -> SigningReceiver:
        """Start serving; returns once the port is bound."""
        self._thread = threading.Thread(target=self._serve, name="demo-receiver", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the demo receiver did not start")
        return self

    def stop(self) -> None:
        """Stop serving and join the thread."""
        if self._loop and self._thread:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def counts(self) -> Counter[str]:
        """Verified requests per message type."""
        with self._lock:
            return Counter(body.get("type", "?") for body in self.bodies)
