"""Whether this process can reach the Prefect API now, so that no step of the data plane waits for it.

Prefect's client retries a refused connection five times (2 + 4 + 8 + 16 + 32 s) and waits up to a minute for each
answer of a hung server: a delivery batch or an ingest request that awaited it would stall for minutes. So every
Prefect call of a delivery or ingest process goes through ``PrefectApi``:

- ``call`` runs it bounded to ``api_wait_seconds`` and refuses at once (``PrefectApiUnavailable``) while the API is
  known to be down; a call already waiting stops waiting as soon as another one finds the API down (a run's
  artifacts published just as the server went away would otherwise hold the run, and a stop, for their whole bound);
- a call that could not reach the API marks it down; from then on a probe (``GET /health``, bounded, no retries)
  runs every ``api_probe_seconds`` until it answers, and then the callbacks registered with ``on_back`` run: what
  could not be recorded in Prefect meanwhile is recorded then.

One ``PrefectApi`` per event loop (``prefect_api()``): the batches, the shifts and the sources of a process share
what they learn.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
from prefect.client.orchestration import get_client
from prefect.context import AsyncClientContext, SyncClientContext

from prefect_webhooks.settings import get_settings

logger = logging.getLogger("prefect_webhooks.prefect_api")

T = TypeVar("T")

# Answers that say the server is there but cannot serve: a proxy in front of a restarting server, a maintenance.
_UNAVAILABLE_STATUSES = {502, 503, 504}


class PrefectApiUnavailable(RuntimeError):
    """The Prefect API could not be reached, or did not answer in time."""


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) says the Prefect API could not be reached or did not answer."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, (httpx.TransportError, TimeoutError, asyncio.TimeoutError, ConnectionError,
                              PrefectApiUnavailable)):
            return True
        if isinstance(cause, httpx.HTTPStatusError) and cause.response.status_code in _UNAVAILABLE_STATUSES:
            return True
        cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
    return False


class PrefectApi:
    """What this process knows about the Prefect API's reachability, and the work waiting for its return."""

    def __init__(self, wait_seconds: float | None = None, probe_seconds: float | None = None) -> None:
        settings = get_settings().outage
        self.wait_seconds = wait_seconds if wait_seconds is not None else settings.api_wait_seconds
        self.probe_seconds = probe_seconds if probe_seconds is not None else settings.api_probe_seconds
        self.reachable = True
        self.down_since: float | None = None
        """Unix time of the first failed call of the current outage."""
        self.outages = 0
        self._probe: asyncio.Task[None] | None = None
        self._on_back: list[Callable[[], Awaitable[Any]]] = []
        self._went_down: asyncio.Event | None = None

    def __repr__(self) -> str:
        return f"PrefectApi(reachable={self.reachable})"

    async def call(self, make: Callable[[], Awaitable[T]], *, wait: float | None = None) -> T:
        """Run the Prefect call ``make()`` for at most ``wait`` seconds (``api_wait_seconds``).

        Raises:
            PrefectApiUnavailable: the API is down (the call is not even made), or the call could not reach it or
                timed out. Any other error of the call (a missing block…) is an answer: it propagates as it is.
        """
        if not self.reachable:
            raise PrefectApiUnavailable("the Prefect API cannot be reached")
        return await self.settle(asyncio.ensure_future(make()), wait=wait, cancel=True)

    async def settle(self, pending: asyncio.Future[T], *, wait: float | None = None, cancel: bool = False) -> T:
        """Wait up to ``wait`` seconds for a Prefect call already running (a shared reload) and learn from it.

        On a timeout, or once another call finds the API down, the call is left running (or cancelled with
        ``cancel``) and ``PrefectApiUnavailable`` raised.
        """
        limit = self.wait_seconds if wait is None else wait
        if self._went_down is None or self._went_down.is_set():
            self._went_down = asyncio.Event()
        found_down = self._went_down
        went_down = asyncio.ensure_future(found_down.wait())
        try:
            await asyncio.wait({pending, went_down}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            if cancel:
                pending.cancel()
            raise
        finally:
            went_down.cancel()
        if not pending.done():
            if cancel:
                pending.cancel()
            reason = "found down by another call" if found_down.is_set() else "no answer in time"
            self.mark_down(TimeoutError(reason))
            raise PrefectApiUnavailable(f"the Prefect API did not answer ({reason})")
        try:
            result = pending.result()
        except Exception as exc:
            if not is_unreachable(exc):
                self.mark_up()
                raise
            self.mark_down(exc)
            raise PrefectApiUnavailable(f"the Prefect API did not answer ({type(exc).__name__})") from None
        self.mark_up()
        return result

    def learn(self, pending: asyncio.Future[Any]) -> None:
        """Learn from a background Prefect call once it is done (a done-callback; the call's error stays its own)."""

        def done(future: asyncio.Future[Any]) -> None:
            if future.cancelled():
                return
            exc = future.exception()
            if exc is None or not is_unreachable(exc):
                self.mark_up()
            else:
                self.mark_down(exc)

        pending.add_done_callback(done)

    def mark_down(self, exc: BaseException | None = None) -> None:
        """Note that a call could not reach the API; the probe starts."""
        if self.reachable:
            self.reachable = False
            self.down_since = time.time()
            if self._went_down is not None:
                self._went_down.set()
            self.outages += 1
            logger.warning("the Prefect API cannot be reached (%s): delivery and ingest go on without it; what "
                           "Prefect would record waits for its return", type(exc).__name__ if exc else "no answer")
        if self._probe is None or self._probe.done():
            try:
                self._probe = _start_outside_runs(self._probe_until_back())
            except RuntimeError:  # no running loop (a sync caller): the next async call probes
                self._probe = None

    def mark_up(self) -> None:
        """Note that a call was answered; if the API was down, the work waiting for its return runs."""
        if self.reachable:
            return
        down_for = time.time() - (self.down_since or time.time())
        self.reachable, self.down_since = True, None
        logger.warning("the Prefect API answers again after %.0f s", down_for)
        for callback in list(self._on_back):
            task = _start_outside_runs(_run_logged(callback))
            _background.add(task)
            task.add_done_callback(_background.discard)

    def on_back(self, callback: Callable[[], Awaitable[Any]]) -> None:
        """Run ``callback()`` (a coroutine function) each time the API answers again after an outage."""
        self._on_back.append(callback)

    async def _probe_until_back(self) -> None:
        while not self.reachable:
            await asyncio.sleep(self.probe_seconds)
            if self.reachable:
                return
            if await self.probe():
                self.mark_up()

    async def probe(self) -> bool:
        """Whether ``GET /health`` answers within ``wait_seconds`` (no retries)."""
        try:
            async with get_client() as client:
                error = await asyncio.wait_for(client.api_healthcheck(), self.wait_seconds)
        except Exception:
            return False
        return error is None


_background: set[asyncio.Task[Any]] = set()


def _start_outside_runs(work: Awaitable[T]) -> asyncio.Task[T]:
    """Start ``work`` as a task of its own that does not inherit the Prefect client of the flow run it was noticed
    in: that client is closed when the run ends, and ``get_client()`` in the probe or in the work left for the
    return (publishing a run's artifacts) would hand it out ("cannot be started again after closing")."""
    context = contextvars.copy_context()
    context.run(AsyncClientContext.__var__.set, None)  # type: ignore[arg-type]
    context.run(SyncClientContext.__var__.set, None)  # type: ignore[arg-type]
    return context.run(asyncio.get_running_loop().create_task, work)  # type: ignore[arg-type]


async def _run_logged(callback: Callable[[], Awaitable[Any]]) -> None:
    try:
        await callback()
    except Exception as exc:
        logger.warning("recording what waited for the Prefect API failed: %s: %s", type(exc).__name__, exc)


_instances: dict[int, tuple[asyncio.AbstractEventLoop, PrefectApi]] = {}


def prefect_api() -> PrefectApi:
    """The ``PrefectApi`` of the running event loop (one per loop, made on first use)."""
    loop = asyncio.get_running_loop()
    found = _instances.get(id(loop))
    if found is None or found[0] is not loop:
        for key, (other, _api) in list(_instances.items()):
            if other.is_closed():
                del _instances[key]
        found = _instances[id(loop)] = (loop, PrefectApi())
    return found[1]
