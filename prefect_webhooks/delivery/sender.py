"""The HTTP sender: one aiohttp session per delivering process, each message signed and sent to every URL.

``Sender.post`` makes one request and classifies what happened (``RequestResult``); ``request`` sends one shaped
request (``request_shape``) with its method, client certificate and OAuth2 token; ``send`` fans one message out to
its destination's URLs; ``send_all`` sends a batch with a fixed set of workers.
"""

from __future__ import annotations

import asyncio
import errno
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from prefect_webhooks.delivery.answers import answer_excerpt
from prefect_webhooks.delivery.auth import TokenCache, TokenRequestError
from prefect_webhooks.delivery.circuit import CIRCUIT_OPEN_ERROR, EndpointGuard
from prefect_webhooks.delivery.destinations import ResolvedDestination
from prefect_webhooks.delivery.network import BlockedAddressError, delivery_connector
from prefect_webhooks.delivery.request_shape import AUTHORIZATION_HEADER, Request, shape_requests
from prefect_webhooks.messages.outcomes import DELIVERED, PERMANENT, RETRY, Attempt
from prefect_webhooks.messages.retry import RETRY_AFTER_STATUSES, classify_status
from prefect_webhooks.settings import WebhooksSettings, get_settings
from prefect_webhooks.store.tables import store_now
from prefect_webhooks.utilities.urls import display_url

# aiohttp's timeouts raise asyncio.TimeoutError, which is the builtin TimeoutError only from Python 3.11 on.
TIMEOUT_ERRORS = (TimeoutError, asyncio.TimeoutError)


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
    body: bytes | None = None
    """The response body, kept only when asked for (a token request)."""
    answer: str | None = None
    """The start of the response body, kept with the attempt (``answers.answer_excerpt``)."""

    def summary(self) -> str:
        """The status or error, for a reason text."""
        return f"HTTP {self.status}" if self.status is not None else (self.error or "unknown error")

    def attempt(self, outbox_id: int, *, error: str | None = None, outcome: str | None = None) -> Attempt:
        """This request's record in message ``outbox_id``'s attempts. The URL is kept as logs show it: its query
        and credentials may hold tokens, and attempts are shown by ``messages show``, the admin API and the
        console."""
        return Attempt(outbox_id, self.attempted_at, display_url(self.url), self.status,
                       self.error if error is None else error, self.latency_ms, outcome or self.outcome, self.answer)


def ends_in_a_retry(results: Sequence[RequestResult]) -> bool:
    """Whether one message's results mean it is to be retried: no endpoint took it and one may yet (``decision``)."""
    return not any(result.outcome == DELIVERED for result in results) and any(
        result.outcome == RETRY for result in results)


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
        self.tokens = TokenCache()

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

    async def post(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        *,
        method: str = "POST",
        ssl: ssl.SSLContext | None = None,
        keep_body: bool = False,
    ) -> RequestResult:
        """Send ``body`` to ``url`` once (POST unless ``method`` says otherwise; ``ssl``: a client certificate's
        context) unless its circuit is open, and classify what happened.

        The URL's own slot is taken before a process slot, so a hanging endpoint holds at most
        ``endpoint_concurrency`` of them; after a failure the request may wait there for answers in flight
        (``EndpointGuard.admit``). Never raises for network outcomes.
        """
        async with self.guard.slots(url):
            generation = await self.guard.admit(url)
            if generation is None:
                return RequestResult(url, store_now(), RETRY, error=CIRCUIT_OPEN_ERROR)
            result: RequestResult | None = None
            try:
                result = await self._post(url, body, headers, method, ssl, keep_body)
            finally:
                # A cancelled probe counts as a failure, so the circuit never waits for a probe that is gone.
                self.guard.record(url, generation, result is not None and result.outcome != RETRY)
            return result

    async def _post(
        self, url: str, body: bytes, headers: dict[str, str], method: str, ssl: ssl.SSLContext | None, keep_body: bool
    ) -> RequestResult:
        assert self._session is not None, "use Sender as an async context manager"
        async with self._slots:
            attempted_at = store_now()
            started = time.perf_counter()
            try:
                async with self._session.request(method, url, data=body, headers=headers, allow_redirects=False,
                                                 ssl=ssl if ssl is not None else True) as response:
                    answer = await response.read()
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
                return RequestResult(url, attempted_at, RETRY, error=_connection_error(url, exc),
                                     latency_ms=_ms(started))
            except (aiohttp.ClientError, OSError) as exc:
                return RequestResult(url, attempted_at, RETRY, error=_connection_error(url, exc),
                                     latency_ms=_ms(started))
        return RequestResult(url, attempted_at, classify_status(status), status=status, latency_ms=_ms(started),
                             retry_after=retry_after, body=answer if keep_body else None,
                             answer=None if keep_body else answer_excerpt(answer, status, url, headers))

    async def request(self, request: Request) -> RequestResult:
        """Send one shaped request; with OAuth2, with a token, and once more with a new token after a 401."""
        endpoint = request.endpoint
        if endpoint.oauth2 is None:
            return await self._send(request, request.headers)
        result, token = await self._with_token(request)
        if result.status == 401 and token is not None:
            # A token can be revoked before it expires: one new token, one more try.
            self.tokens.discard(endpoint.oauth2, token)
            result, _ = await self._with_token(request)
        return result

    async def _with_token(self, request: Request) -> tuple[RequestResult, str | None]:
        assert request.endpoint.oauth2 is not None
        try:
            token = await self.tokens.get(request.endpoint.oauth2, self._post_token_form)
        except TokenRequestError as exc:
            return RequestResult(request.endpoint.url, store_now(), exc.outcome, error=str(exc)), None
        return await self._send(request, {**request.headers, AUTHORIZATION_HEADER: f"Bearer {token}"}), token

    async def _send(self, request: Request, headers: dict[str, str]) -> RequestResult:
        endpoint = request.endpoint
        return await self.post(endpoint.url, request.body, headers, method=endpoint.method, ssl=endpoint.ssl)

    async def _post_token_form(self, url: str, body: bytes, headers: dict[str, str]) -> RequestResult:
        return await self.post(url, body, headers, keep_body=True)

    async def send(self, destination: ResolvedDestination, body: bytes, key: str) -> list[RequestResult]:
        """Send one message (stable id ``key``) to every URL of its destination at once (fan-out)."""
        requests = shape_requests(destination.endpoints, destination.signer, key,
                                  lambda endpoint: endpoint.render(body))
        if len(requests) == 1:
            return [await self.request(requests[0])]
        return list(await asyncio.gather(*(self.request(request) for request in requests)))

    async def send_all(
        self,
        items: Sequence[tuple[ResolvedDestination, bytes, str]],
        not_before: Sequence[float] | None = None,
        in_turn: Sequence[Sequence[int]] = (),
        not_after: Sequence[datetime | None] | None = None,
    ) -> list[list[RequestResult]]:
        """Send many ``(destination, body, message id)``; results in the same order.

        A fixed set of workers pulls from the list instead of one task per message: 500 waiting tasks cost the
        event loop more than the requests themselves. ``not_before`` gives each item the event loop time before
        which it is not sent (its rate-limit slot); the items of one destination with a slot ahead go one after
        the other, each keeping its planned distance from the previous one. Each group of ``in_turn`` (indexes of
        items due now: one user's messages of an ordered destination) goes one after another and stops at the first
        that is to be retried; the items after it are not sent and get no results. ``not_after`` gives each item
        its deadline (naive UTC; None: none): an item whose turn comes at or after it is not sent and gets no
        results, like the items after it in its group.
        """
        results: list[list[RequestResult]] = [[] for _ in items]

        async def send_one(index: int) -> None:
            # Checked at the item's turn, not when its batch was claimed: the store calls and rate-limit slots
            # between the two may take a message that was due before its deadline past it.
            deadline = not_after[index] if not_after is not None else None
            if deadline is not None and store_now() >= deadline:
                return
            destination, body, key = items[index]
            results[index] = await self.send(destination, body, key)

        async def send_in_turn(indexes: Sequence[int]) -> None:
            for index in indexes:
                await send_one(index)
                if not results[index] or ends_in_a_retry(results[index]):
                    return

        def pool(units: list[Sequence[int]]) -> list[Coroutine[Any, Any, None]]:
            pending = iter(units)

            async def worker() -> None:
                for unit in pending:
                    await send_in_turn(unit)

            return [worker() for _ in range(min(self.settings.delivery.delivery_concurrency, len(units)))]

        grouped = {index for group in in_turn for index in group}
        units: list[Sequence[int]] = [*in_turn, *([index] for index in range(len(items)) if index not in grouped)]
        if not_before is None:
            workers = pool(units)
        else:
            now = asyncio.get_running_loop().time()
            chains: dict[tuple[str, str | None], list[int]] = {}
            for unit in units:
                if not_before[unit[0]] > now:
                    chains.setdefault(items[unit[0]][0].lane, []).append(unit[0])
            workers = [*pool([unit for unit in units if not_before[unit[0]] <= now]),
                       *(run_paced([(not_before[i], partial(send_one, i)) for i in chain])
                         for chain in chains.values())]
        if workers:
            await asyncio.gather(*workers)
        return results


async def run_paced(jobs: Sequence[tuple[float, Callable[[], Awaitable[Any]]]]) -> None:
    """Start each ``(event loop time, job)`` at its time, in time order, and wait for all of them.

    The jobs of one rate-limited destination go this way: a start that went late (a busy event loop) pushes the
    next one back by the planned gap, so late requests never bunch up above the endpoint's rate.
    """
    loop = asyncio.get_running_loop()
    started, previous = [], None
    for planned, job in sorted(jobs, key=lambda pair: pair[0]):
        at = planned if previous is None else max(planned, previous[1] + planned - previous[0])
        if at > loop.time():
            await asyncio.sleep(at - loop.time())
        previous = (planned, loop.time())
        started.append(asyncio.ensure_future(job()))
    await asyncio.gather(*started)


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000.0, 3)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:500]


def _connection_error(url: str, exc: BaseException) -> str:
    """A connection failure's reason, naming a TLS handshake the receiver ended where that can be told apart.

    Over TLS 1.2 a receiver that refuses the client certificate (or demands one that was not sent) ends the
    handshake, which is part of connecting: a reset or TLS alert while connecting to an ``https`` URL is that. Over
    TLS 1.3 it closes the connection after the handshake, before answering, which looks like any other disconnect:
    the reason says what it may be.
    """
    described = f"connection error: {_describe(exc)}"
    if not url.lower().startswith("https:"):
        return described
    if isinstance(exc, aiohttp.ClientConnectorError) and isinstance(
            exc.os_error, (ConnectionResetError, ConnectionAbortedError, ssl.SSLError)):
        return (f"TLS handshake failed: {_describe(exc.os_error)} (the receiver ended the handshake, as it does when "
                "it refuses the client certificate or demands one that was not sent)")
    if isinstance(exc, aiohttp.ServerDisconnectedError) or (
            isinstance(exc, aiohttp.ClientOSError) and exc.errno == errno.ECONNRESET):
        # Which of the two depends on whether the close reaches the sender before or while it writes the request.
        return (f"{described} (before answering; over TLS 1.3 this is also how a receiver refuses the client "
                "certificate or a missing one it demands)")
    return described


def _certificate_error(url: str, exc: aiohttp.ClientConnectorCertificateError) -> str:
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
    certificate_error = exc.certificate_error
    detail = getattr(certificate_error, "verify_message", None) or str(certificate_error)
    return f"TLS certificate verification failed for {origin}: {detail}"
