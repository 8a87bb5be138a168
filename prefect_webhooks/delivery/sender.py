"""The HTTP sender: one aiohttp session per delivering process, each message signed and posted to every URL.

``Sender.post`` makes one request and classifies what happened (``RequestResult``); ``send`` fans one message out to
its destination's URLs; ``send_all`` sends a batch with a fixed set of workers.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from prefect_webhooks.delivery.circuit import CIRCUIT_OPEN_ERROR, EndpointGuard
from prefect_webhooks.delivery.destinations import ResolvedDestination
from prefect_webhooks.delivery.network import BlockedAddressError, delivery_connector
from prefect_webhooks.messages.outcomes import PERMANENT, RETRY
from prefect_webhooks.messages.retry import RETRY_AFTER_STATUSES, classify_status
from prefect_webhooks.settings import WebhooksSettings, get_settings
from prefect_webhooks.store.tables import store_now

# aiohttp's timeouts raise asyncio.TimeoutError, which is the builtin TimeoutError only from Python 3.11 on.
TIMEOUT_ERRORS = (TimeoutError, asyncio.TimeoutError)


def display_url(url: str) -> str:
    """A URL for logs, reasons and artifacts: scheme, host, port and path; the query (may hold tokens) dropped."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


def tls_context(settings: WebhooksSettings | None = None) -> ssl.SSLContext:
    """The client TLS context: system trust store (plus ``tls_ca_file``), certificates and host names verified."""
    settings = settings or get_settings()
    context = ssl.create_default_context()
    if settings.delivery.tls_ca_file:
        context.load_verify_locations(cafile=settings.delivery.tls_ca_file)
    return context


@dataclass(slots=True)
class RequestResult:
    """What one POST to one URL came to."""

    url: str
    attempted_at: datetime
    outcome: str
    status: int | None = None
    error: str | None = None
    latency_ms: float = 0.0
    retry_after: str | None = None

    def summary(self) -> str:
        """The status or error, for a reason text."""
        return f"HTTP {self.status}" if self.status is not None else (self.error or "unknown error")


class Sender:
    """The process's HTTP client: one aiohttp session, bounded concurrency, per-request timeout."""

    def __init__(self, settings: WebhooksSettings | None = None) -> None:
        self.settings = settings or get_settings()
        self._session: aiohttp.ClientSession | None = None
        # Queueing for a slot must not eat into an endpoint's 5 s, so the timeout starts inside the slot.
        self._slots = asyncio.Semaphore(self.settings.delivery.delivery_concurrency)
        self.guard = EndpointGuard(
            threshold=self.settings.delivery.circuit_failure_threshold,
            cooldown=self.settings.delivery.circuit_cooldown_seconds,
            concurrency=min(self.settings.delivery.endpoint_concurrency, self.settings.delivery.delivery_concurrency),
        )

    async def __aenter__(self) -> Sender:
        connector = delivery_connector(
            self.settings.delivery.block_private_networks,
            limit=self.settings.delivery.delivery_concurrency, ssl=tls_context(self.settings), keepalive_timeout=30
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self.settings.delivery.request_timeout),
            # Keep the wire to what the destination spec lists (no cookies echoed back to other endpoints).
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> RequestResult:
        """POST ``body`` to ``url`` once unless its circuit is open, and classify what happened.

        The URL's own slot is taken before a process slot, so a hanging endpoint holds at most
        ``endpoint_concurrency`` of them. Never raises for network outcomes.
        """
        async with self.guard.slots(url):
            if not self.guard.allow(url):
                return RequestResult(url, store_now(), RETRY, error=CIRCUIT_OPEN_ERROR)
            result: RequestResult | None = None
            try:
                result = await self._post(url, body, headers)
            finally:
                # A cancelled probe counts as a failure, so the circuit never waits for a probe that is gone.
                self.guard.record(url, result is not None and result.outcome != RETRY)
            return result

    async def _post(self, url: str, body: bytes, headers: dict[str, str]) -> RequestResult:
        assert self._session is not None, "use Sender as an async context manager"
        async with self._slots:
            attempted_at = store_now()
            started = time.perf_counter()
            try:
                async with self._session.post(url, data=body, headers=headers, allow_redirects=False) as response:
                    await response.read()
                    status = response.status
                    retry_after = response.headers.get("Retry-After") if status in RETRY_AFTER_STATUSES else None
            except aiohttp.ClientConnectorCertificateError as exc:
                # The handshake failed, so no HTTP request left this process; retrying cannot fix a certificate.
                return RequestResult(url, attempted_at, PERMANENT, error=_certificate_error(url, exc),
                                     latency_ms=_ms(started))
            except TIMEOUT_ERRORS:
                error = f"timeout after {self.settings.delivery.request_timeout:g} s"
                return RequestResult(url, attempted_at, RETRY, error=error, latency_ms=_ms(started))
            except ValueError as exc:
                # aiohttp refuses a malformed request (e.g. a header the block should have rejected); the message
                # may quote a header value, so only the type is kept.
                return RequestResult(url, attempted_at, PERMANENT, error=f"invalid request: {type(exc).__name__}",
                                     latency_ms=_ms(started))
            except aiohttp.ClientConnectorError as exc:
                if isinstance(exc.os_error, BlockedAddressError):
                    # The SSRF guard refused the address before connecting; retrying would be refused again.
                    return RequestResult(url, attempted_at, PERMANENT, error=str(exc.os_error), latency_ms=_ms(started))
                return RequestResult(url, attempted_at, RETRY, error=f"connection error: {_describe(exc)}",
                                     latency_ms=_ms(started))
            except (aiohttp.ClientError, OSError) as exc:
                return RequestResult(url, attempted_at, RETRY, error=f"connection error: {_describe(exc)}",
                                     latency_ms=_ms(started))
        return RequestResult(url, attempted_at, classify_status(status), status=status, latency_ms=_ms(started),
                             retry_after=retry_after)

    async def send(self, destination: ResolvedDestination, body: bytes, key: str) -> list[RequestResult]:
        """Send one message (stable id ``key``) to every URL of its destination at once (fan-out)."""
        headers_extra = destination.signer.headers(body, key)
        requests = []
        for endpoint in destination.endpoints:
            requests.append(self.post(endpoint.url, body, {**endpoint.headers, **headers_extra}))
        if len(requests) == 1:
            return [await requests[0]]
        return list(await asyncio.gather(*requests))

    async def send_all(
        self,
        items: Sequence[tuple[ResolvedDestination, bytes, str]],
        not_before: Sequence[float] | None = None,
    ) -> list[list[RequestResult]]:
        """Send many ``(destination, body, message id)``; results in the same order.

        A fixed set of workers pulls from the list instead of one task per message: 500 waiting tasks cost the
        event loop more than the requests themselves. ``not_before`` gives each item the event loop time before
        which it is not sent (its rate-limit slot); the items of one destination with a slot ahead go one after
        the other, each keeping its planned distance from the previous one.
        """
        results: list[list[RequestResult]] = [[] for _ in items]
        loop = asyncio.get_running_loop()

        async def send_one(index: int) -> None:
            destination, body, key = items[index]
            results[index] = await self.send(destination, body, key)

        def pool(indexes: list[int]) -> list[Coroutine[Any, Any, None]]:
            pending = iter(indexes)

            async def worker() -> None:
                for index in pending:
                    await send_one(index)

            return [worker() for _ in range(min(self.settings.delivery.delivery_concurrency, len(indexes)))]

        async def paced(indexes: list[int]) -> None:
            # One destination's slots in order. A send that went late (a busy event loop) pushes the next one back
            # by the planned gap, so late sends never bunch up above the endpoint's rate.
            assert not_before is not None
            started, previous = [], None
            for index in indexes:
                at = not_before[index]
                if previous is not None:
                    at = max(at, previous[1] + at - previous[0])
                if at > loop.time():
                    await asyncio.sleep(at - loop.time())
                previous = (not_before[index], loop.time())
                started.append(asyncio.ensure_future(send_one(index)))
            await asyncio.gather(*started)

        everything = list(range(len(items)))
        if not_before is None:
            workers = pool(everything)
        else:
            now = loop.time()
            chains: dict[str, list[int]] = {}
            for index in everything:
                if not_before[index] > now:
                    chains.setdefault(items[index][0].name, []).append(index)
            workers = [*pool([i for i in everything if not_before[i] <= now]),
                       *(paced(sorted(chain, key=not_before.__getitem__)) for chain in chains.values())]
        if workers:
            await asyncio.gather(*workers)
        return results


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000.0, 3)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:500]


def _certificate_error(url: str, exc: aiohttp.ClientConnectorCertificateError) -> str:
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
    certificate_error = exc.certificate_error
    detail = getattr(certificate_error, "verify_message", None) or str(certificate_error)
    return f"TLS certificate verification failed for {origin}: {detail}"
