"""The delivery engine: claimed outbox rows → HTTP requests → outcomes → attempt records.

One ``aiohttp`` session per delivering process carries every request (keep-alive, at most
``delivery_concurrency`` in flight). A batch of claimed rows is one unit of work: ``process_batch`` sends every
message to every URL of its destination, decides each message's fate with the retry policy and writes all of it
back in one transaction. ``deliver_batch`` is the same as a Prefect task whose retries carry the short-term
policy; ``deliver_due`` claims batch after batch and is what the ``deliver`` flow, the serve command and the
benchmark run.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import socket
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from prefect_webhooks.circuit import CIRCUIT_OPEN_ERROR, EndpointGuard
from prefect_webhooks.destinations import (
    DestinationCache,
    DestinationNotFound,
    InvalidDestination,
    ResolvedDestination,
)
from prefect_webhooks.events import emit_delivery_failed
from prefect_webhooks.filters import split_filtered
from prefect_webhooks.message_headers import message_key_prefix
from prefect_webhooks.network import BlockedAddressError, delivery_connector
from prefect_webhooks.outbox import (
    Claimed,
    bring_forward,
    claim_due_deliveries,
    extend_leases,
    leased_rows,
    record_outcomes,
    release_leases,
)
from prefect_webhooks.retry import (
    DELIVERED,
    JITTER,
    PERMANENT,
    RETRY,
    RETRY_AFTER_REASON,
    RETRY_AFTER_STATUSES,
    RetryableDeliveryError,
    classify_status,
    deadline_of,
    is_retryable_delivery_error,
    next_attempt_at,
    parse_retry_after,
    task_retry_delays,
)
from prefect_webhooks.settings import WebhooksSettings, get_settings
from prefect_webhooks.store import get_engine, store_key, store_now

logger = logging.getLogger("prefect_webhooks.delivery")

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
    if settings.tls_ca_file:
        context.load_verify_locations(cafile=settings.tls_ca_file)
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
        self._slots = asyncio.Semaphore(self.settings.delivery_concurrency)
        self.guard = EndpointGuard(
            threshold=self.settings.circuit_failure_threshold,
            cooldown=self.settings.circuit_cooldown_seconds,
            concurrency=min(self.settings.endpoint_concurrency, self.settings.delivery_concurrency),
        )

    async def __aenter__(self) -> Sender:
        connector = delivery_connector(
            self.settings.block_private_networks,
            limit=self.settings.delivery_concurrency, ssl=tls_context(self.settings), keepalive_timeout=30
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self.settings.request_timeout),
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
                error = f"timeout after {self.settings.request_timeout:g} s"
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

    async def send_all(self, items: Sequence[tuple[ResolvedDestination, bytes, str]]) -> list[list[RequestResult]]:
        """Send many ``(destination, body, message id)``; results in the same order.

        A fixed set of workers pulls from the list instead of one task per message: 500 waiting tasks cost the
        event loop more than the requests themselves.
        """
        results: list[list[RequestResult]] = [[] for _ in items]
        pending = iter(range(len(items)))

        async def worker() -> None:
            for index in pending:
                destination, body, key = items[index]
                results[index] = await self.send(destination, body, key)

        workers = min(self.settings.delivery_concurrency, len(items))
        if workers:
            await asyncio.gather(*(worker() for _ in range(workers)))
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


@dataclass
class EndpointStats:
    """Per-URL request counts and latencies of one delivering run."""

    destination: str
    url: str
    delivered: int = 0
    retried: int = 0
    failed: int = 0
    latencies_ms: list[float] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        """One table-artifact row."""
        latencies = sorted(self.latencies_ms)
        return {
            "destination": self.destination,
            "endpoint": display_url(self.url),
            "delivered": self.delivered,
            "retried": self.retried,
            "failed": self.failed,
            "p50_ms": round(_percentile(latencies, 0.50), 1),
            "p95_ms": round(_percentile(latencies, 0.95), 1),
        }


def _percentile(ordered: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile of sorted values, interpolated as ``statistics.quantiles(method="inclusive")``.

    Read straight from the sorted list: a run of a busy delivery worker holds hundreds of thousands of latencies,
    and ``statistics.quantiles`` would sort them again on the worker's event loop.
    """
    if not ordered:
        return 0.0
    if len(ordered) == 1:
        return ordered[0]
    position = fraction * (len(ordered) - 1)
    below = int(position)
    if below + 1 >= len(ordered):
        return ordered[-1]
    return ordered[below] + (ordered[below + 1] - ordered[below]) * (position - below)


@dataclass
class DeliveryStats:
    """What a delivering run did: messages by outcome and requests per endpoint."""

    delivered: int = 0
    failed: int = 0
    rescheduled: int = 0
    filtered: int = 0
    batches: int = 0
    endpoints: dict[tuple[str, str], EndpointStats] = field(default_factory=dict)
    filtered_by_rule: dict[tuple[str, str], int] = field(default_factory=dict)
    """Filtered messages per (destination, reason naming the rule)."""

    def add_requests(self, destination: str, results: Sequence[RequestResult]) -> None:
        """Count requests (2xx → delivered, retryable → retried, permanent → failed) and their latencies."""
        for result in results:
            stats = self.endpoints.get((destination, result.url))
            if stats is None:
                stats = self.endpoints[(destination, result.url)] = EndpointStats(destination, result.url)
            if result.outcome == DELIVERED:
                stats.delivered += 1
            elif result.outcome == RETRY:
                stats.retried += 1
            else:
                stats.failed += 1
            stats.latencies_ms.append(result.latency_ms)

    def summary(self) -> dict[str, int]:
        """Message counts for logs and flow results."""
        return {"delivered": self.delivered, "failed": self.failed, "rescheduled": self.rescheduled,
                "filtered": self.filtered, "batches": self.batches}


class ClaimedBatch:
    """Rows claimed together; a plain object so Prefect passes it to the task without walking 500 bodies."""

    __slots__ = ("rows",)

    def __init__(self, rows: list[Claimed]) -> None:
        self.rows = rows

    @property
    def ids(self) -> list[int]:
        """The outbox ids of the batch."""
        return [row.id for row in self.rows]

    def __repr__(self) -> str:
        return f"ClaimedBatch({len(self.rows)} messages)"


class DeliveryContext:
    """Everything batches of one delivering process share."""

    def __init__(
        self,
        engine: Engine,
        sender: Sender,
        *,
        owner: str | None = None,
        destinations: DestinationCache | None = None,
        settings: WebhooksSettings | None = None,
    ) -> None:
        self.engine = engine
        self.sender = sender
        self.owner = owner or new_owner()
        self.destinations = destinations or DestinationCache()
        self.settings = settings or get_settings()
        self.stats = DeliveryStats()
        self.key_prefix: str | None = None
        """``msg_<store key>_``: message ids are this plus the outbox id (read from the store once)."""

    def __repr__(self) -> str:
        return f"DeliveryContext(owner={self.owner!r})"


@dataclass(eq=False)
class Shift:
    """A run's turn in a delivery worker: the worker's open sender and destination cache, and the handover.

    A delivery worker (``prefect_webhooks.delivery_worker``) runs the ``deliver`` flow back to back in one process;
    each run is a shift. The run's claim loop sets ``claiming`` once it has made its first claim, so the worker
    knows the successor is delivering; the worker then sets the predecessor's ``handed_over``, and that run stops
    claiming, finishes the batches it holds and ends. The two overlap by at least one claim: delivery never pauses.
    """

    sender: Sender
    destinations: DestinationCache
    claiming: asyncio.Event = field(default_factory=asyncio.Event)
    handed_over: asyncio.Event = field(default_factory=asyncio.Event)


current_shift: contextvars.ContextVar[Shift | None] = contextvars.ContextVar("prefect_webhooks_shift", default=None)
"""The shift of the run executing in this context (set by the delivery worker; None elsewhere)."""


def new_owner() -> str:
    """A lease owner id unique to this process and run."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def is_store_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the store could not be reached (restarting, connection lost, locked) — worth a retry."""
    if isinstance(exc, (OperationalError, InterfaceError)):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


async def store_call(settings: WebhooksSettings, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a blocking store call in a thread, retrying it while the store is unreachable.

    A restart of the database must not cost a batch whose requests were already sent (that would mean sending
    them again after the lease expires), so the call is retried with a growing pause for up to
    ``store_retry_seconds``; after that the error propagates and the rows wait for their lease to expire.
    """
    give_up_at = time.monotonic() + settings.store_retry_seconds
    pause = 0.2
    while True:
        try:
            return await asyncio.to_thread(function, *args, **kwargs)
        except Exception as exc:
            if not is_store_unavailable(exc) or time.monotonic() + pause > give_up_at:
                raise
            logger.warning("store unavailable (%s); retrying in %.1f s", type(exc).__name__, pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 5.0)


@dataclass
class BatchResult:
    """What one try of a batch did."""

    delivered: int = 0
    failed: int = 0
    rescheduled: int = 0
    filtered: int = 0
    held: list[int] = field(default_factory=list)
    """Rows kept leased for an in-process retry."""


class BatchWrites:
    """The bulk writes one batch try produces, gathered message by message (see ``record_outcomes``)."""

    def __init__(self) -> None:
        self.delivered: list[dict[str, Any]] = []
        self.failed: list[dict[str, Any]] = []
        self.rescheduled: list[dict[str, Any]] = []
        self.attempts: list[dict[str, Any]] = []
        self.failures: list[tuple[Claimed, str, int]] = []
        self.held: list[int] = []
        self.filtered: list[dict[str, Any]] = []

    def fail(self, row: Claimed, reason: str, attempts: int, first_attempt_at: datetime | None) -> None:
        """Mark ``row`` failed for good (an event is emitted once the batch is recorded)."""
        self.failed.append({"b_id": row.id, "b_reason": reason, "b_attempts": attempts,
                            "b_first_attempt_at": first_attempt_at})
        self.failures.append((row, reason, attempts))


def _reason(results: Sequence[RequestResult], outcome: str) -> str:
    relevant = [result for result in results if result.outcome == outcome] or list(results)
    if len(relevant) == 1:
        return relevant[0].summary()
    return "; ".join(f"{display_url(result.url)}: {result.summary()}" for result in relevant)


def _latest_retry_after(results: Sequence[RequestResult], now: datetime) -> datetime | None:
    times = [parse_retry_after(result.retry_after, now) for result in results if result.retry_after]
    times = [value for value in times if value is not None]
    return max(times) if times else None


def decide(
    row: Claimed,
    results: Sequence[RequestResult],
    writes: BatchWrites,
    *,
    now: datetime,
    hold_until: datetime | None,
    owner: str,
    settings: WebhooksSettings,
    sent_at: datetime | None = None,
) -> str:
    """Turn one message's request results into its new state (added to ``writes``); returns the outcome.

    Any 2xx delivers it; otherwise any retryable result reschedules it (held under this process's lease when an
    in-process retry follows, else due at the backoff time, never after the deadline); otherwise it failed for good.
    """
    attempts = row.attempts + 1
    # A first attempt counts from when its batch began sending (shared by the batch, so updates group well).
    first_attempt_at = row.first_attempt_at or sent_at or min(result.attempted_at for result in results)
    for result in results:
        writes.attempts.append({"outbox_id": row.id, "attempted_at": result.attempted_at, "url": result.url,
                                "status_code": result.status, "error": result.error,
                                "latency_ms": result.latency_ms, "outcome": result.outcome})
    winner = next((result for result in results if result.outcome == DELIVERED), None)
    if winner is not None:
        writes.delivered.append({"b_id": row.id, "b_attempts": attempts, "b_first_attempt_at": first_attempt_at,
                                 "b_at": now, "b_url": winner.url})
        return DELIVERED
    if not any(result.outcome == RETRY for result in results):
        writes.fail(row, f"permanent: {_reason(results, PERMANENT)}", attempts, first_attempt_at)
        return PERMANENT
    reason = _reason(results, RETRY)
    retry_after = _latest_retry_after(results, now)
    if retry_after is not None:
        # Said in the reason, so a recovered endpoint's backlog is not brought forward past the receiver's wish.
        reason = f"{reason}; {RETRY_AFTER_REASON} {retry_after:%Y-%m-%d %H:%M:%S} UTC"
    deadline = deadline_of(first_attempt_at, settings)
    if hold_until is not None and now < deadline and (retry_after is None or retry_after <= deadline):
        # The task retry waits the backoff; the lease keeps other runs away meanwhile.
        when, lease_owner, lease_expires_at = max(now, retry_after or now), owner, hold_until
        writes.held.append(row.id)
    else:
        when = next_attempt_at(now, attempts, first_attempt_at, retry_after, settings)
        lease_owner, lease_expires_at = None, None
    if when is None:
        writes.fail(row, f"expired: {reason} (after {attempts} attempts)", attempts, first_attempt_at)
        return PERMANENT
    writes.rescheduled.append({"b_id": row.id, "b_attempts": attempts, "b_first_attempt_at": first_attempt_at,
                               "b_reason": reason, "b_next_attempt_at": when, "b_lease_owner": lease_owner,
                               "b_lease_expires_at": lease_expires_at})
    return RETRY


async def _resolve_all(
    rows: Sequence[Claimed], context: DeliveryContext, writes: BatchWrites
) -> tuple[list[tuple[Claimed, ResolvedDestination]], list[Claimed]]:
    """Pair rows with their destinations; unknown destinations fail, unreachable block storage defers."""
    resolved: dict[str, ResolvedDestination | None] = {}
    unavailable: dict[str, str] = {}
    for name in {row.destination for row in rows}:
        try:
            resolved[name] = await context.destinations.get(name)
        except DestinationNotFound:
            resolved[name] = None
        except InvalidDestination as exc:
            # Saved bypassing validation (API, UI): the rows wait until the block is fixed.
            unavailable[name] = str(exc)
            logger.warning("%s", unavailable[name])
        except Exception as exc:
            # Prefect API briefly unreachable: try these rows again later, not a reason to fail them.
            unavailable[name] = f"destination block {name!r} could not be loaded: {type(exc).__name__}"
            logger.warning("%s", unavailable[name])
    ready, deferred = [], []
    for row in rows:
        if row.destination in unavailable:
            deferred.append(row)
            continue
        destination = resolved[row.destination]
        if destination is None:
            writes.fail(row, f"permanent: destination block {row.destination!r} not found", row.attempts,
                        row.first_attempt_at)
        else:
            ready.append((row, destination))
    return ready, deferred


def _drop_filtered(
    ready: list[tuple[Claimed, ResolvedDestination]], writes: BatchWrites, stats: DeliveryStats
) -> list[tuple[Claimed, ResolvedDestination]]:
    """Take out the messages a destination filter drops: they end ``filtered`` with the rule as reason, unsent."""
    send, dropped = split_filtered(ready, lambda item: item[0].body, lambda item: item[1].filters)
    for (row, destination), reason in dropped:
        writes.filtered.append({"b_id": row.id, "b_reason": reason})
        key = (destination.name, reason)
        stats.filtered_by_rule[key] = stats.filtered_by_rule.get(key, 0) + 1
    return send


def _log_timeouts(results_by_row: Sequence[Sequence[RequestResult]], log: Any) -> None:
    timeouts: dict[str, int] = {}
    for results in results_by_row:
        for result in results:
            if result.error and result.error.startswith("timeout"):
                timeouts[result.url] = timeouts.get(result.url, 0) + 1
    for url, count in timeouts.items():
        log.error("%d request(s) to %s timed out; they will be retried", count, display_url(url))


async def process_batch(
    batch: ClaimedBatch,
    context: DeliveryContext,
    *,
    first_try: bool = True,
    hold_seconds: float | None = None,
    log: Any = None,
) -> BatchResult:
    """Deliver one claimed batch once: send, decide, record, emit events for messages that failed for good.

    Args:
        batch: Rows this process claimed.
        context: The process's sender, store and destination cache.
        first_try: False on a task retry: the rows are read again and only those still pending, still leased by
            this process and due are sent (the others are released to the outbox).
        hold_seconds: When an in-process retry follows after about this many seconds, retryable rows stay leased
            for it; None means retryable rows go back to the outbox at their backoff time.
        log: Logger to use (the task run's); the module logger by default.

    Returns:
        Counts, and the ids held for the in-process retry.
    """
    log = log or logger
    settings, engine = context.settings, context.engine
    rows = batch.rows
    if not first_try:
        rows = await store_call(settings, leased_rows, engine, batch.ids, context.owner)
    now = store_now()
    writes = BatchWrites()
    due = []
    for row in rows:
        if row.next_attempt_at > now:
            continue
        if row.first_attempt_at is not None and now >= deadline_of(row.first_attempt_at, settings):
            writes.fail(row, f"expired: {row.reason or 'not delivered'} (after {row.attempts} attempts)",
                        row.attempts, row.first_attempt_at)
        else:
            due.append(row)
    not_due = [row.id for row in rows if row.next_attempt_at > now]
    if not_due:
        # A Retry-After longer than the task's wait: the outbox delivers these when they are due.
        await store_call(settings, release_leases, engine, not_due, context.owner)

    ready, deferred = await _resolve_all(due, context, writes)
    if any(destination.filters is not None for _, destination in ready):
        ready = _drop_filtered(ready, writes, context.stats)
    if context.key_prefix is None:
        context.key_prefix = message_key_prefix(await store_call(settings, store_key, engine))
    prefix = context.key_prefix
    # A batch to a slow endpoint can take longer than the lease (2,000 messages at 32 in flight and 2 s each: two
    # minutes): its leases are renewed while it sends, so no other run claims and sends them again meanwhile.
    keeper = asyncio.ensure_future(_keep_leases(context, [row.id for row, _ in ready]))
    try:
        results_by_row = await context.sender.send_all([(destination, row.body, f"{prefix}{row.id}")
                                                        for row, destination in ready])
    finally:
        keeper.cancel()
    finished = store_now()
    hold_until = None
    if hold_seconds is not None:
        hold_until = finished + timedelta(seconds=hold_seconds * (1 + JITTER) + settings.lease_seconds)
    for (row, destination), results in zip(ready, results_by_row, strict=True):
        decide(row, results, writes, now=finished, hold_until=hold_until, owner=context.owner, settings=settings,
               sent_at=now)
        context.stats.add_requests(destination.name, results)
    for row in deferred:
        writes.rescheduled.append({"b_id": row.id, "b_attempts": row.attempts,
                                   "b_first_attempt_at": row.first_attempt_at, "b_reason": row.reason,
                                   "b_next_attempt_at": finished + timedelta(seconds=settings.retry_base_delay),
                                   "b_lease_owner": None, "b_lease_expires_at": None})
    await store_call(settings, record_outcomes, engine, delivered=writes.delivered, failed=writes.failed,
                     rescheduled=writes.rescheduled, attempts=writes.attempts, filtered=writes.filtered)
    _log_timeouts(results_by_row, log)
    for row, reason, attempts in writes.failures:
        emit_delivery_failed(row.id, row.destination, reason, attempts)
    result = BatchResult(delivered=len(writes.delivered), failed=len(writes.failed),
                         rescheduled=len(writes.rescheduled) - len(writes.held), filtered=len(writes.filtered),
                         held=writes.held)
    stats = context.stats
    stats.delivered += result.delivered
    stats.failed += result.failed
    stats.rescheduled += result.rescheduled
    stats.filtered += result.filtered
    return result


async def _keep_leases(context: DeliveryContext, ids: list[int]) -> None:
    """Renew this process's lease on ``ids`` every third of the lease until cancelled."""
    lease = context.settings.lease_seconds
    while ids:
        await asyncio.sleep(lease / 3)
        try:
            await store_call(context.settings, extend_leases, context.engine, ids, context.owner,
                             store_now() + timedelta(seconds=lease))
        except Exception as exc:
            # The lease runs out as it would have without renewal: at worst a message is sent twice.
            logger.warning("renewing the leases of a batch in flight failed: %s", type(exc).__name__)


def _task_retry_plan() -> tuple[bool, float | None]:
    """(first try?, seconds until the next task try or None on the final try) from the running task's context."""
    task_context = TaskRunContext.get()
    if task_context is None:
        return True, None
    run_count = max(task_context.task_run.run_count, 1)
    task_obj = task_context.task
    delays = task_obj.retry_delay_seconds
    if run_count > task_obj.retries:
        return run_count == 1, None
    if isinstance(delays, (int, float)):
        delay = float(delays)
    elif isinstance(delays, list) and delays:
        delay = float(delays[min(run_count - 1, len(delays) - 1)])
    else:
        delay = 0.0
    return run_count == 1, delay


@task(
    name="deliver_batch",
    cache_policy=NO_CACHE,
    retry_condition_fn=is_retryable_delivery_error,
    retry_jitter_factor=JITTER,
    persist_result=False,
)
async def deliver_batch(batch: ClaimedBatch, context: DeliveryContext) -> dict[str, int]:
    """Deliver one claimed batch; raise ``RetryableDeliveryError`` so Prefect retries what is left.

    The task's ``retries``/``retry_delay_seconds`` come from settings (see ``delivery_task``); Prefect's jitter
    (factor 0.2) draws each wait from about 0.36x to 1.2x of it. On a retry only the rows still pending, leased by
    this process and due are sent. On the final try the task returns normally and
    whatever is left waits in the outbox for a later run, with the same deadline.
    """
    from prefect.logging import get_run_logger

    first_try, next_delay = _task_retry_plan()
    result = await process_batch(batch, context, first_try=first_try, hold_seconds=next_delay,
                                 log=get_run_logger())
    if result.held:
        # ``decide`` already extended the held rows' lease past the task's wait.
        raise RetryableDeliveryError(f"{len(result.held)} message(s) will be retried in about {next_delay:g} s")
    return {"delivered": result.delivered, "failed": result.failed, "rescheduled": result.rescheduled,
            "filtered": result.filtered}


def delivery_task(settings: WebhooksSettings | None = None) -> Any:
    """``deliver_batch`` with retries and delays from settings (read at call time, so tests can shrink them)."""
    settings = settings or get_settings()
    return deliver_batch.with_options(retries=settings.task_retries, retry_delay_seconds=task_retry_delays(settings))


BatchRunner = Callable[[ClaimedBatch, DeliveryContext], Awaitable[Any]]


async def run_batch_plain(batch: ClaimedBatch, context: DeliveryContext) -> BatchResult:
    """Run a batch without Prefect: one try; retryable rows wait in the outbox for their backoff time."""
    return await process_batch(batch, context)


async def deliver_due(
    *,
    destination: str | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
    run_for_seconds: float | None = None,
    until_empty: bool = False,
    parallel_batches: int = 2,
    idle_sleep: float = 0.3,
    run_batch: BatchRunner | None = None,
    engine: Engine | None = None,
    context: DeliveryContext | None = None,
) -> DeliveryStats:
    """Claim due messages batch after batch and deliver them until nothing is due (or for a while).

    Args:
        destination: Only this destination block's messages; all when None.
        batch_size: Messages per claim; ``settings.claim_batch_size`` by default.
        max_batches: Stop after claiming this many batches.
        run_for_seconds: Keep going this long (continuous mode); None means stop as soon as nothing is due and no
            batch is in flight.
        until_empty: In continuous mode, stop early once nothing is due and no batch is in flight.
        parallel_batches: Batches in flight at once (they share one HTTP session and its concurrency limit).
        idle_sleep: Continuous mode: seconds from a claim that was not full (or found nothing) to the next claim.
        run_batch: How a batch is run: the Prefect task (``delivery_task()``) or ``run_batch_plain`` (default).
        engine: The store; the configured one by default.
        context: A prepared context (its sender must be open); one is made for the call by default.

    Returns:
        What the run did, with per-endpoint request stats.
    """
    shift = current_shift.get()
    if context is None and shift is not None:
        # In a delivery worker: the worker's warm session, circuit breakers and destination cache.
        context = DeliveryContext(engine or get_engine(), shift.sender, destinations=shift.destinations,
                                  settings=shift.sender.settings)
    if context is None:
        settings = get_settings()
        async with Sender(settings) as sender:
            own = DeliveryContext(engine or get_engine(), sender, settings=settings)
            return await _claim_loop(own, destination, batch_size, max_batches, run_for_seconds, until_empty,
                                     parallel_batches, idle_sleep, run_batch or run_batch_plain)
    return await _claim_loop(context, destination, batch_size, max_batches, run_for_seconds, until_empty,
                             parallel_batches, idle_sleep, run_batch or run_batch_plain)


async def _claim_loop(
    context: DeliveryContext,
    destination: str | None,
    batch_size: int | None,
    max_batches: int | None,
    run_for_seconds: float | None,
    until_empty: bool,
    parallel_batches: int,
    idle_sleep: float,
    run_batch: BatchRunner,
) -> DeliveryStats:
    size = batch_size or context.settings.claim_batch_size
    stop_at = time.monotonic() + run_for_seconds if run_for_seconds is not None else None
    # Continuous mode: after a claim that was not full (no backlog) the next one waits ``idle_sleep``, so it finds
    # more. Each batch is a Prefect task run, which costs the Prefect server ~10-25 ms of CPU whatever its size:
    # this keeps task runs to a few per second at any rate, their batches growing with the rate.
    spacing = idle_sleep if stop_at is not None else 0.0
    # Only a run that keeps delivering brings messages forward for a circuit's probe or recovery: in a run that ends
    # once nothing is due, each probe would make one more message due, and a hanging endpoint would keep it going.
    follow_circuits = stop_at is not None and not until_empty
    shift = current_shift.get()
    in_flight: set[asyncio.Task[Any]] = set()
    claimed_batches = 0
    next_claim_at = 0.0
    exhausted = False
    while True:
        out_of_time = (stop_at is not None and time.monotonic() >= stop_at) or (
            shift is not None and shift.handed_over.is_set())
        out_of_batches = max_batches is not None and claimed_batches >= max_batches
        exhausted = False
        if follow_circuits:
            await _follow_circuits(context)
        while (not (out_of_time or out_of_batches) and len(in_flight) < max(parallel_batches, 1)
               and time.monotonic() >= next_claim_at):
            try:
                rows = await store_call(context.settings, claim_due_deliveries, context.engine, size, context.owner,
                                        destination)
            except Exception as exc:
                if stop_at is None or not is_store_unavailable(exc):
                    raise
                # Continuous mode outlives a store outage: claim again after a pause.
                logger.error("claiming failed, store unavailable: %s", type(exc).__name__)
                next_claim_at = time.monotonic() + max(idle_sleep, 1.0)
                break
            if shift is not None:
                shift.claiming.set()
            if not rows:
                exhausted = True
                next_claim_at = time.monotonic() + spacing
                break
            claimed_batches += 1
            context.stats.batches += 1
            in_flight.add(asyncio.ensure_future(run_batch(ClaimedBatch(rows), context)))
            out_of_batches = max_batches is not None and claimed_batches >= max_batches
            if len(rows) < size:
                next_claim_at = time.monotonic() + spacing
        if not in_flight:
            if out_of_time or out_of_batches or (exhausted and (stop_at is None or until_empty)):
                break
            await _idle(max(next_claim_at - time.monotonic(), 0.0) if next_claim_at else idle_sleep, shift)
            continue
        wait = next_claim_at - time.monotonic()
        timeout = wait if wait > 0 else (idle_sleep if exhausted else None)
        done, in_flight = await asyncio.wait(in_flight, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for finished in done:
            _log_batch_failure(finished)
    return context.stats


async def _idle(seconds: float, shift: Shift | None) -> None:
    """Sleep between claims; a handover ends the sleep at once."""
    if shift is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
        await asyncio.wait_for(shift.handed_over.wait(), seconds)


async def _follow_circuits(context: DeliveryContext) -> None:
    """Bring waiting messages forward for endpoints whose circuit is due a probe (one) or recovered (all)."""
    guard = context.sender.guard
    for url, limit in [*((url, 1) for url in guard.take_due_probes()), *((url, None) for url in
                                                                          guard.take_recovered())]:
        names = context.destinations.names_for_url(url)
        try:
            moved = await store_call(context.settings, bring_forward, context.engine, names, limit=limit)
        except Exception as exc:
            # Only a shortcut: the messages are still due at their backoff time.
            logger.warning("bringing messages forward for %s failed: %s", display_url(url), type(exc).__name__)
            continue
        if moved and limit is None:
            logger.info("%s answers again: %d waiting message(s) are due now", display_url(url), moved)


def _log_batch_failure(finished: asyncio.Task[Any]) -> None:
    exc = finished.exception()
    if exc is not None and not isinstance(exc, RetryableDeliveryError):
        # The batch's rows stay leased and come back when the lease expires; nothing is lost.
        logger.error("delivery batch failed: %s: %s", type(exc).__name__, exc)
