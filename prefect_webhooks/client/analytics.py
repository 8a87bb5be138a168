"""The ``Analytics`` class: the calls a program makes, and the client's life (start, flush, close, fork, exit)."""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from prefect_webhooks.client.batching import MessageQueue
from prefect_webhooks.client.calls import VERSION, encode_call
from prefect_webhooks.client.connection import BatchPoster, basic_auth, batch_url
from prefect_webhooks.client.errors import AnalyticsError, QueueFullError, UploadError
from prefect_webhooks.client.logs import debug_requested, enable_debug_logging, logger
from prefect_webhooks.client.options import client_options
from prefect_webhooks.client.reporter import ErrorCallback, Reporter, SuccessCallback
from prefect_webhooks.client.sender import Sender
from prefect_webhooks.client.upload import RetryPolicy
from prefect_webhooks.messages.model import BaseMessage
from prefect_webhooks.settings import get_settings

USER_AGENT = f"prefect-webhooks/{VERSION}"

JsonDict = dict[str, Any]
When = datetime | str

_LIVE_CLIENTS: weakref.WeakSet[Analytics] = weakref.WeakSet()


class Analytics:
    """A batching analytics client for one source (write key).

    Args:
        write_key: The source's write key, sent as the HTTP Basic user; never logged.
        endpoint: Ingest API base URL; defaults to the ``PREFECT_WEBHOOKS_ENDPOINT`` setting.
        flush_at: Messages waiting that trigger a flush, and the most one request carries (the seed's ``FlushAt``,
            default 20); 1 turns batching off. A backlog goes out as several requests of ``flush_at`` messages.
        flush_after: Seconds since the last flush that trigger one (the seed's ``FlushAfter``, default 5).
        size: The seed's ``Size``: the same as ``flush_at``.
        on_error: ``on_error(error, messages)`` for every message that failed or was dropped; ``error`` is an
            ``UploadError`` (``QueueFullError`` for a dropped message).
        on_success: ``on_success(messages)`` for every batch the API accepted.
        debug: Log the client at DEBUG to stderr; by default when the ``DEBUG`` variable names ``analytics``.
        **options: Any other field of ``ClientOptions`` (``max_queue_size``, ``on_full``, ``block_timeout``,
            ``gzip``, ``max_retries``, ``max_retry_time``, ``timeout``, ``senders``…); an unknown option raises
            ``AnalyticsError``.

    Each call (``identify``, ``track``, ``page``, ``screen``, ``group``, ``alias``, ``enqueue``) returns the message's
    messageId, or raises ``AnalyticsError`` naming the field at fault and queues nothing.

    Example:
        ```python
        from prefect_webhooks import Analytics

        analytics = Analytics("WRITE_KEY", on_error=lambda error, messages: print(error, len(messages)))
        analytics.track("user-1", "Order Completed", properties={"revenue": 42.0})
        analytics.flush()
        ```
    """

    def __init__(
        self,
        write_key: str,
        endpoint: str | None = None,
        flush_at: int | None = None,
        flush_after: float = 5.0,
        size: int | None = None,
        on_error: ErrorCallback | None = None,
        on_success: SuccessCallback | None = None,
        debug: bool | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(write_key, str) or not write_key.strip():
            raise AnalyticsError("write_key", "a non-empty write key is required")
        self.options = client_options(flush_at, size, flush_after, **options)
        self.endpoint = (endpoint or get_settings().resolved_endpoint()).rstrip("/")
        self._url = batch_url(self.endpoint)
        self._headers = {
            "Authorization": basic_auth(write_key),
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
        }
        # What a call waits for room in a full queue: block_timeout in block mode, nothing in drop mode.
        self._put_timeout = self.options.block_timeout if self.options.on_full == "block" else 0
        self._on_error = on_error
        self._on_success = on_success
        self._policy = RetryPolicy(
            self.options.max_retries, self.options.max_retry_time, self.options.backoff_base, self.options.backoff_cap
        )
        if debug or (debug is None and debug_requested()):
            enable_debug_logging()
        self._closed = False
        self._reset_runtime()
        _LIVE_CLIENTS.add(self)

    def _reset_runtime(self) -> None:
        """Fresh queue, counters and (lazily) sender threads: at construction and in a forked child."""
        self._queue = MessageQueue(self.options.max_queue_size, self.options.flush_at)
        self._reporter = Reporter(self._on_error, self._on_success)
        self._abort = threading.Event()
        self._start_lock = threading.Lock()
        self._senders: list[Sender] = []
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"Analytics(endpoint={self.endpoint!r}, flush_at={self.options.flush_at})"

    @classmethod
    def from_source(cls, name: str, **kwargs: Any) -> Analytics:
        """A client for the ``Source`` block saved as ``name`` (its write key).

        Args:
            name: The Source block's name.
            **kwargs: Passed to ``Analytics``.

        Example:
            ```python
            from prefect_webhooks import Analytics

            analytics = Analytics.from_source("BLOCK_NAME")
            ```
        """
        from prefect_webhooks.blocks.source import Source

        source = Source.load(name, _sync=True)
        if not source.enabled:
            logger.warning("source %r is disabled; the ingest API may refuse its messages", name)
        return cls(source.write_key.get_secret_value(), **kwargs)

    # -- calls ----------------------------------------------------------------------------------------------------

    def identify(
        self, user_id: str | None = None, traits: JsonDict | None = None, *,
        anonymous_id: str | None = None, context: JsonDict | None = None, timestamp: When | None = None,
        integrations: JsonDict | None = None, message_id: str | None = None,
    ) -> str:
        """Tie a user to traits (``user_id`` or ``anonymous_id`` is required)."""
        return self._call(
            "identify", userId=user_id, anonymousId=anonymous_id, traits=traits,
            context=context, timestamp=timestamp, integrations=integrations, messageId=message_id,
        )

    def track(
        self, user_id: str | None = None, event: str | None = None, properties: JsonDict | None = None, *,
        anonymous_id: str | None = None, context: JsonDict | None = None, timestamp: When | None = None,
        integrations: JsonDict | None = None, message_id: str | None = None,
    ) -> str:
        """Record a user action (``event`` is required)."""
        return self._call(
            "track", userId=user_id, anonymousId=anonymous_id, event=event, properties=properties,
            context=context, timestamp=timestamp, integrations=integrations, messageId=message_id,
        )

    def page(
        self, user_id: str | None = None, category: str | None = None, name: str | None = None,
        properties: JsonDict | None = None, *, traits: JsonDict | None = None,
        anonymous_id: str | None = None, context: JsonDict | None = None, timestamp: When | None = None,
        integrations: JsonDict | None = None, message_id: str | None = None,
    ) -> str:
        """Record a page view; ``url``, ``title``, ``referrer`` and ``path`` in properties or traits are recognised."""
        return self._call(
            "page", userId=user_id, anonymousId=anonymous_id, category=category, name=name, properties=properties,
            traits=traits, context=context, timestamp=timestamp, integrations=integrations, messageId=message_id,
        )

    def screen(
        self, user_id: str | None = None, category: str | None = None, name: str | None = None,
        properties: JsonDict | None = None, *,
        anonymous_id: str | None = None, context: JsonDict | None = None, timestamp: When | None = None,
        integrations: JsonDict | None = None, message_id: str | None = None,
    ) -> str:
        """Record a mobile screen view."""
        return self._call(
            "screen", userId=user_id, anonymousId=anonymous_id, category=category, name=name, properties=properties,
            context=context, timestamp=timestamp, integrations=integrations, messageId=message_id,
        )

    def group(
        self, user_id: str | None = None, group_id: str | None = None, traits: JsonDict | None = None, *,
        anonymous_id: str | None = None, context: JsonDict | None = None, timestamp: When | None = None,
        integrations: JsonDict | None = None, message_id: str | None = None,
    ) -> str:
        """Associate a user with a group and record the group's traits (``group_id`` is required)."""
        return self._call(
            "group", userId=user_id, anonymousId=anonymous_id, groupId=group_id, traits=traits,
            context=context, timestamp=timestamp, integrations=integrations, messageId=message_id,
        )

    def alias(
        self, previous_id: str | None = None, user_id: str | None = None, *,
        context: JsonDict | None = None, timestamp: When | None = None,
        integrations: JsonDict | None = None, message_id: str | None = None,
    ) -> str:
        """Associate ``previous_id`` with the new ``user_id`` (both are required)."""
        return self._call(
            "alias", previousId=previous_id, userId=user_id,
            context=context, timestamp=timestamp, integrations=integrations, messageId=message_id,
        )

    def enqueue(self, message: BaseMessage | Mapping[str, Any]) -> str:
        """Queue a message model (``Identify``, ``Track``, ``Page``, ``Screen``, ``Group``, ``Alias``) or a wire dict.

        The model is validated again as it is queued (fields may have been changed after construction).
        """
        if isinstance(message, BaseMessage):
            return self._record(message.model_dump(by_alias=True, exclude_none=True))
        if isinstance(message, Mapping):
            return self._record(dict(message))
        raise AnalyticsError("message", f"expected a message model or a dict, got {type(message).__name__}")

    def _call(self, message_type: str, **fields: Any) -> str:
        """The six calls' one path: their arguments in wire form (those not given left out), then recorded."""
        raw: dict[str, Any] = {"type": message_type}
        for name, value in fields.items():
            if value is not None:
                raw[name] = value
        return self._record(raw)

    def _record(self, raw: dict[str, Any]) -> str:
        if self._closed:
            raise AnalyticsError("client", "this Analytics client is closed")
        data = encode_call(raw)
        if self._pid != os.getpid():
            # A fork without the at-fork hook (os.fork in C code): start over as that child.
            self._reset_runtime()
        if not self._senders:
            self._start_senders()
        try:
            self._queue.put(data, self._put_timeout)
        except QueueFullError as error:
            self._reporter.message_dropped(data, error)
        return raw["messageId"]

    def _start_senders(self) -> None:
        with self._start_lock:
            if self._senders:
                return
            options = self.options
            for index in range(options.senders):
                # The connection is made here, in the calling thread (see Sender).
                poster = BatchPoster(self._url, self._headers, options.timeout, options.gzip)
                sender = Sender(f"analytics-sender-{index}", self._queue, poster, self._policy, options.flush_after,
                                self._abort, self._reporter)
                sender.start()
                self._senders.append(sender)

    # -- counters and lifecycle --------------------------------------------------------------------------------------

    @property
    def uploaded(self) -> int:
        """Messages the ingest API accepted."""
        return self._reporter.uploaded

    @property
    def failed(self) -> int:
        """Messages that did not reach the ingest API (each reported to ``on_error``)."""
        return self._reporter.failed

    @property
    def dropped(self) -> int:
        """Messages not queued because the queue stayed full (each reported to ``on_error``)."""
        return self._reporter.dropped

    @property
    def queued(self) -> int:
        """Messages waiting in the queue (not counting a batch being sent)."""
        return len(self._queue)

    def flush(self, timeout: float | None = None) -> bool:
        """Send everything queued so far now and wait until each message is uploaded or failed.

        Args:
            timeout: Seconds to wait at most; None waits as long as retries take.

        Returns:
            True when everything settled, False when the timeout ran out first.
        """
        if self._pid != os.getpid():
            self._reset_runtime()
        return self._queue.wait_settled(timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Flush, stop the sender threads and refuse further calls.

        Messages still queued when ``timeout`` runs out are reported to ``on_error`` and counted as failed.

        Returns:
            True when everything queued was settled within the timeout.
        """
        if self._closed:
            return True
        self._closed = True
        if self._pid != os.getpid():
            self._reset_runtime()
        settled = self._queue.wait_settled(timeout)
        self._queue.close()
        if not settled:
            self._abort.set()
            left = self._queue.drain()
            if left:
                self._reporter.batch_failed(left, UploadError("client closed before these messages were sent"))
        for sender in self._senders:
            sender.join(None if settled else 1.0)
            if sender.is_alive():
                logger.warning("analytics sender still busy with a request at close; its batch may be lost")
        _LIVE_CLIENTS.discard(self)
        return settled

    def __enter__(self) -> Analytics:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close_all_at_exit() -> None:
    for client in list(_LIVE_CLIENTS):
        try:
            client.close(client.options.atexit_timeout)
        except Exception:
            logger.exception("closing an analytics client at exit failed")


def _reset_all_after_fork() -> None:
    for client in list(_LIVE_CLIENTS):
        client._reset_runtime()


atexit.register(_close_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_all_after_fork)
