"""Prefect events the delivery engine emits, so automations can alert on messages and endpoints.

- ``prefect-webhooks.delivery.failed``: a message will not be attempted again (permanent error or expired).
- ``prefect-webhooks.delivery.exhausted``: a message expired, its retries ran out after ``max_retry_age``.
- ``prefect-webhooks.endpoint.failing``: ``endpoint_failing_threshold`` requests in a row to an endpoint failed.
- ``prefect-webhooks.endpoint.recovered``: an endpoint that was failing answered 2xx again.
- ``prefect-webhooks.endpoint.disabled``: an endpoint failed for its destination's ``disable_after`` and was disabled.

The resource of the first two is the message, of the others the endpoint. Each endpoint event is emitted by one
delivery process only (decided under the endpoint's row lock in the store).
Payloads carry ids, names, the URL without query or credentials, reasons and counts, and, while the console is on,
``console_url``: the console's page of the message or destination; never a body, header or secret.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from datetime import datetime
from typing import Any
from urllib.parse import quote

from prefect.events import emit_event

from prefect_webhooks.settings import get_settings

logger = logging.getLogger("prefect_webhooks.delivery")

DELIVERY_FAILED = "prefect-webhooks.delivery.failed"
DELIVERY_EXHAUSTED = "prefect-webhooks.delivery.exhausted"
ENDPOINT_FAILING = "prefect-webhooks.endpoint.failing"
ENDPOINT_RECOVERED = "prefect-webhooks.endpoint.recovered"
ENDPOINT_DISABLED = "prefect-webhooks.endpoint.disabled"
ENDPOINT_EVENTS = {"failing": ENDPOINT_FAILING, "recovered": ENDPOINT_RECOVERED, "disabled": ENDPOINT_DISABLED}


def outbox_resource_id(outbox_id: int) -> str:
    """The Prefect resource id of one outbox row."""
    return f"prefect-webhooks.outbox.{outbox_id}"


def endpoint_resource_id(destination: str, key: str) -> str:
    """The Prefect resource id of one endpoint: its destination and the key of its URL (a URL may hold a token)."""
    return f"prefect-webhooks.endpoint.{destination}.{key}"


def _destination(destination: str) -> list[dict[str, str]]:
    return [{"prefect.resource.id": f"prefect-webhooks.destination.{destination}",
             "prefect.resource.role": "destination"}]


def _add_console_link(payload: dict[str, Any], path: str) -> None:
    """The console's page of what the event is about, as ``console_url``, while the console is on."""
    link = get_settings().console_link(path)
    if link is not None:
        payload["console_url"] = link


def emit_delivery_failed(outbox_id: int, destination: str, reason: str, attempts: int) -> None:
    """Emit ``prefect-webhooks.delivery.failed`` for a message that will not be attempted again, and
    ``prefect-webhooks.delivery.exhausted`` too when it expired (its retries ran out).

    Args:
        outbox_id: The outbox row's id.
        destination: The WebhookDestination block name.
        reason: ``permanent: …`` or ``expired: …`` (an HTTP status or a transport error, no secrets).
        attempts: How many attempts the message had.
    """
    resource = {"prefect.resource.id": outbox_resource_id(outbox_id),
                "prefect.resource.name": f"outbox message {outbox_id}"}
    payload: dict[str, Any] = {"outbox_id": outbox_id, "destination": destination, "reason": reason,
                               "attempts": attempts}
    _add_console_link(payload, f"/messages/{outbox_id}")
    emit_event(event=DELIVERY_FAILED, resource=resource, related=_destination(destination), payload=payload)
    if reason.startswith("expired"):
        emit_event(event=DELIVERY_EXHAUSTED, resource=resource, related=_destination(destination), payload=payload)


def in_background(emit: Callable[..., None], *args: Any, **kwargs: Any) -> Future[None]:
    """Emit from the events thread, in the order asked; a failure is logged, never raised to delivery.

    The first event of a process may wait seconds for Prefect's events client: never on the delivery event loop.
    The emit runs in a copy of the caller's context: Prefect's settings (the API URL among them) may live there
    rather than in the environment, and without them the thread's ``emit_event`` would start a temporary server.
    """
    future: Future[None] = Future()
    future.add_done_callback(_log_failure)
    _events.put((future, contextvars.copy_context(), emit, args, kwargs))
    _start_events_thread()
    return future


def wait_for_queued_events(timeout: float) -> bool:
    """Wait until the events queued so far are emitted, at most ``timeout`` seconds; returns whether they were. A
    process that delivers once and ends calls it: what is still queued when its main thread ends is dropped."""
    done, _ = wait([in_background(_nothing)], timeout=timeout)
    return bool(done)


def _nothing() -> None:
    """A place in the queue: done once everything before it is."""


# What the events thread has yet to emit. The thread is a daemon and emits nothing once the main thread has ended:
# an event emitted while the interpreter shuts down finds Prefect's clients closing, and in a process without a
# Prefect server it started a temporary server that nothing stopped (an executor's thread is joined at exit and
# emitted what was queued then). An orderly stop that must not lose its events waits for their futures.
_events: queue.SimpleQueue[tuple[Future[None], contextvars.Context, Callable[..., None], tuple, dict]] = (
    queue.SimpleQueue())
_thread: threading.Thread | None = None
_thread_lock = threading.Lock()


def _start_events_thread() -> None:
    global _thread
    with _thread_lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_emit_queued, name="prefect-webhooks-events", daemon=True)
            _thread.start()


def _emit_queued() -> None:
    while True:
        future, context, emit, args, kwargs = _events.get()
        if not threading.main_thread().is_alive() or not future.set_running_or_notify_cancel():
            future.cancel()
            continue
        try:
            context.run(emit, *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the future, logged by its callback
            future.set_exception(exc)
        else:
            future.set_result(None)


def _log_failure(future: Future[None]) -> None:
    if future.cancelled():
        return
    exc = future.exception()
    if exc is not None:
        logger.warning("emitting an event failed: %s", type(exc).__name__)


def emit_endpoint_event(
    kind: str,
    destination: str,
    key: str,
    url: str,
    *,
    position: int | None,
    failures: int,
    failing_since: datetime | None,
    last_error: str | None,
) -> None:
    """Emit ``prefect-webhooks.endpoint.<kind>`` (``failing``, ``recovered`` or ``disabled``) for one endpoint.

    Args:
        kind: Which change.
        destination: The WebhookDestination block name.
        key: The URL's key in the store.
        url: The URL without query or credentials.
        position: The endpoint's place in the block's list (from 1), when known.
        failures: Requests in a row that got no 2xx.
        failing_since: When the current run of failures began.
        last_error: The last failure (an HTTP status or a transport error, no secrets).
    """
    payload: dict[str, Any] = {
        "destination": destination, "url": url, "position": position, "failures": failures,
        "failing_since": failing_since.isoformat() + "Z" if failing_since else None, "last_error": last_error,
    }
    _add_console_link(payload, f"/destinations/{quote(destination, safe='')}")
    emit_event(
        event=ENDPOINT_EVENTS[kind],
        resource={"prefect.resource.id": endpoint_resource_id(destination, key),
                  "prefect.resource.name": f"{destination} endpoint {position or url}"},
        related=_destination(destination),
        payload=payload,
    )
