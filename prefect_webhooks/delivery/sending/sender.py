"""The HTTP sender: one transport per delivering process (``transport``: libcurl on the event loop), each message
signed and sent to every URL.

``Sender.post`` makes one request and classifies what happened (``RequestResult``); ``request`` sends one shaped
request (``request_shape``) with its method, client certificate and OAuth2 token; ``send`` fans one message out to
its destination's URLs; ``send_all`` sends a batch with a fixed set of workers.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, Protocol
from urllib.parse import urlsplit

import pycurl

from prefect_webhooks.delivery.sending.answers import answer_excerpt
from prefect_webhooks.delivery.sending.auth import TokenCache, TokenRequestError
from prefect_webhooks.delivery.sending.circuit import CIRCUIT_OPEN_ERROR, EndpointGuard
from prefect_webhooks.delivery.sending.destinations import ResolvedDestination
from prefect_webhooks.delivery.sending.network import blocked_reason
from prefect_webhooks.delivery.sending.request_shape import AUTHORIZATION_HEADER, Request, shape_requests
from prefect_webhooks.delivery.sending.transport import READ_LIMIT, ClientTls, CurlTransport, TransportError
from prefect_webhooks.messages.outcomes import DELIVERED, PERMANENT, RETRY, Attempt
from prefect_webhooks.messages.retry import RETRY_AFTER_STATUSES, classify_status
from prefect_webhooks.settings import WebhooksSettings, get_settings
from prefect_webhooks.store.schema.tables import store_now
from prefect_webhooks.utilities.urls import display_url

# What is read of a token endpoint's answer at most (its JSON is kept whole); webhook answers: ``transport.READ_LIMIT``.
TOKEN_ANSWER_LIMIT = 1024 * 1024


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


class SendProgress(Protocol):
    """What ``Sender.send_all`` tells of a batch's items while it sends them (a batch records its outcomes in waves:
    ``delivery.batches.waves``)."""

    def finished(self, index: int, results: list[RequestResult]) -> None:
        """Item ``index``'s results are final: its requests were answered, or it is not sent (no results)."""

    def all_started(self) -> None:
        """Every item has been taken by a worker, or waits for its rate-limit slot: what is left is waiting."""


class Sender:
    """The process's HTTP client: one transport, bounded concurrency, per-request timeout."""

    def __init__(self, settings: WebhooksSettings | None = None) -> None:
        self.settings = settings or get_settings()
        self._transport: CurlTransport | None = None
        # Queueing for a slot must not eat into an endpoint's 5 s, so the timeout starts inside the slot.
        self._slots = asyncio.Semaphore(self.settings.delivery.delivery_concurrency)
        self.guard = EndpointGuard(
            threshold=self.settings.delivery.circuit_failure_threshold,
            cooldown=self.settings.delivery.circuit_cooldown_seconds,
            concurrency=min(self.settings.delivery.endpoint_concurrency, self.settings.delivery.delivery_concurrency),
        )
        self.tokens = TokenCache()

    async def __aenter__(self) -> Sender:
        delivery = self.settings.delivery
        self._transport = CurlTransport(
            timeout=delivery.request_timeout, tls_ca_file=delivery.tls_ca_file or None,
            block_private_networks=delivery.block_private_networks, keepalive_seconds=30,
            connections=delivery.delivery_concurrency,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._transport is not None:
            await self._transport.close()
            self._transport = None

    async def post(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        *,
        method: str = "POST",
        tls: ClientTls | None = None,
        keep_body: bool = False,
    ) -> RequestResult:
        """Send ``body`` to ``url`` once (POST unless ``method`` says otherwise; ``tls``: a client certificate)
        unless its circuit is open, and classify what happened.

        The URL's own slot is taken before a process slot, so a hanging endpoint holds at most
        ``endpoint_concurrency`` of them; after a failure the request may wait there for answers in flight
        (``EndpointGuard.admit``). Never raises for network outcomes.
        """
        async with self.guard.slots(url):
            circuit = self.guard.circuit(url)
            # Most requests go at once: only one after a failure may wait for the answers in flight.
            generation = await self.guard.admit(url) if circuit.holding() else circuit.admit(time.monotonic())
            if generation is None:
                return RequestResult(url, store_now(), RETRY, error=CIRCUIT_OPEN_ERROR)
            result: RequestResult | None = None
            try:
                result = await self._post(url, body, headers, method, tls, keep_body)
            finally:
                # A cancelled probe counts as a failure, so the circuit never waits for a probe that is gone.
                self.guard.record(url, generation, result is not None and result.outcome != RETRY)
            return result

    async def _post(
        self, url: str, body: bytes, headers: dict[str, str], method: str, tls: ClientTls | None, keep_body: bool
    ) -> RequestResult:
        assert self._transport is not None, "use Sender as an async context manager"
        async with self._slots:
            attempted_at = store_now()
            started = time.perf_counter()
            try:
                answer = await self._transport.request(method, url, body, headers, tls=tls,
                                                       limit=TOKEN_ANSWER_LIMIT if keep_body else READ_LIMIT)
            except TransportError as exc:
                return RequestResult(url, attempted_at, *_failure(url, exc, self.settings.delivery.request_timeout),
                                     latency_ms=_ms(started))
            except ValueError as exc:
                # A malformed request (a header the block should have rejected); the message may quote a header
                # value, so only the type is kept.
                return RequestResult(url, attempted_at, PERMANENT, error=f"invalid request: {type(exc).__name__}",
                                     latency_ms=_ms(started))
        status = answer.status
        retry_after = answer.header(b"retry-after") if status in RETRY_AFTER_STATUSES else None
        return RequestResult(url, attempted_at, classify_status(status), status=status, latency_ms=_ms(started),
                             retry_after=retry_after, body=answer.body if keep_body else None,
                             answer=None if keep_body else answer_excerpt(answer.body, status, url, headers))

    async def request(self, request: Request) -> RequestResult:
        """Send one shaped request; with OAuth2, with a token, and once more with a new token after a 401."""
        endpoint = request.endpoint
        if endpoint.oauth2 is None:
            return await self.post(endpoint.url, request.body, request.headers, method=endpoint.method,
                                   tls=endpoint.tls)
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
        return await self.post(endpoint.url, request.body, headers, method=endpoint.method, tls=endpoint.tls)

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
        progress: SendProgress | None = None,
    ) -> list[list[RequestResult]]:
        """Send many ``(destination, body, message id)``; results in the same order.

        A fixed set of workers pulls from the list instead of one task per message: 500 waiting tasks cost the
        event loop more than the requests themselves. ``not_before`` gives each item the event loop time before
        which it is not sent (its rate-limit slot); the items of one destination with a slot ahead go one after
        the other, each keeping its planned distance from the previous one. Each group of ``in_turn`` (indexes of
        items due now: one user's messages of an ordered destination) goes one after another and stops at the first
        that is to be retried; the items after it are not sent and get no results. ``not_after`` gives each item
        its deadline (naive UTC; None: none): an item whose turn comes at or after it is not sent and gets no
        results, like the items after it in its group. ``progress`` hears of each item as soon as its results are
        final, and of the moment every item is on its way (``SendProgress``).
        """
        results: list[list[RequestResult]] = [[] for _ in items]
        finished = progress.finished if progress is not None else None

        async def send_one(index: int) -> None:
            # Checked at the item's turn, not when its batch was claimed: the store calls and rate-limit slots
            # between the two may take a message that was due before its deadline past it.
            deadline = not_after[index] if not_after is not None else None
            if deadline is None or store_now() < deadline:
                destination, body, key = items[index]
                results[index] = await self.send(destination, body, key)
            if finished is not None:
                finished(index, results[index])

        async def send_in_turn(indexes: Sequence[int]) -> None:
            for position, index in enumerate(indexes):
                await send_one(index)
                if not results[index] or ends_in_a_retry(results[index]):
                    if finished is not None:  # the rest of the group is not sent: final too
                        for rest in indexes[position + 1:]:
                            finished(rest, results[rest])
                    return

        def pool(units: list[Sequence[int]]) -> list[Coroutine[Any, Any, None]]:
            pending = iter(enumerate(units, start=1))
            last = len(units)

            async def worker() -> None:
                for taken, unit in pending:
                    if taken == last and progress is not None:
                        progress.all_started()
                    await send_in_turn(unit)

            return [worker() for _ in range(min(self.settings.delivery.delivery_concurrency, len(units)))]

        grouped = {index for group in in_turn for index in group}
        units: list[Sequence[int]] = [*in_turn, *([index] for index in range(len(items)) if index not in grouped)]
        paced: list[Coroutine[Any, Any, None]] = []
        if not_before is not None:
            now = asyncio.get_running_loop().time()
            chains: dict[tuple[str, str | None], list[int]] = {}
            for unit in units:
                if not_before[unit[0]] > now:
                    chains.setdefault(items[unit[0]][0].lane, []).append(unit[0])
            if chains:
                units = [unit for unit in units if not_before[unit[0]] <= now]
                paced = [run_paced([(not_before[i], partial(send_one, i)) for i in chain]) for chain in chains.values()]
        if not units and progress is not None:
            progress.all_started()  # each item waits for its rate-limit slot, or there is none
        workers = [*pool(units), *paced]
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


def _failure(url: str, exc: TransportError, timeout: float) -> tuple[str, None, str]:
    """(outcome, status, error) of a request that got no HTTP answer."""
    if exc.blocked is not None:
        # The private-network guard refused the address before connecting; retrying would be refused again.
        return PERMANENT, None, blocked_reason(urlsplit(url).hostname or url, exc.blocked)
    if exc.certificate_refused:
        # The handshake failed, so no HTTP request left this process; retrying cannot fix a certificate.
        return PERMANENT, None, _certificate_error(url, exc.detail)
    if exc.client_certificate_unusable:
        return PERMANENT, None, f"client certificate cannot be used: {exc.detail}"[:500]
    if exc.timed_out:
        return RETRY, None, f"timeout after {timeout:g} s"
    return RETRY, None, _connection_error(url, exc)


def _connection_error(url: str, exc: TransportError) -> str:
    """A connection failure's reason, naming a TLS handshake the receiver ended where that can be told apart.

    Over TLS 1.2 a receiver that refuses the client certificate (or demands one that was not sent) ends the
    handshake, which is part of connecting. Over TLS 1.3 it closes the connection after the handshake, before
    answering, which looks like any other disconnect: the reason says what it may be.
    """
    described = f"connection error: {exc.detail}"[:500]
    if not url.lower().startswith("https:"):
        return described
    if exc.in_handshake:
        return (f"TLS handshake failed: {exc.detail} (the receiver ended the handshake, as it does when it refuses "
                "the client certificate or demands one that was not sent)")
    if exc.code in _CLOSED_BEFORE_ANSWERING:
        return (f"{described} (before answering; over TLS 1.3 this is also how a receiver refuses the client "
                "certificate or a missing one it demands)")
    return described


# libcurl's errors of a connection closed or reset after it was made, before an answer came.
_CLOSED_BEFORE_ANSWERING = frozenset({pycurl.E_GOT_NOTHING, pycurl.E_RECV_ERROR, pycurl.E_SEND_ERROR})


def _certificate_error(url: str, detail: str) -> str:
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
    # libcurl words OpenSSL's reason "SSL certificate problem: <reason>" or "SSL certificate OpenSSL verify result:
    # <reason> (<code>)": the reason alone is what the receiver's operator needs.
    found = _VERIFY_REASON.fullmatch(detail)
    return f"TLS certificate verification failed for {origin}: {found.group(1) if found else detail}"


_VERIFY_REASON = re.compile(r"SSL certificate (?:problem|OpenSSL verify result): (.*?)(?: \(\d+\))?")
