"""The Analytics client: record identify/track/page/screen/group/alias calls in memory and send them in batches.

Every call is validated when it is made, with the same message models the ingest API uses, and queued already
serialised. A background thread posts batches to ``{endpoint}/v1/batch`` when ``flush_at`` messages are waiting or
``flush_after`` seconds have passed since the last flush; a batch carries at most ``flush_at`` messages (and 500 KB).
A message that cannot be queued or sent always reaches ``on_error`` and a counter; none is dropped silently.

Example:
    ```python
    from prefect_webhooks import Analytics

    with Analytics("WRITE_KEY", endpoint="http://127.0.0.1:8088") as analytics:
        analytics.identify("user-1", traits={"email": "ada@example.com"})
        analytics.track("user-1", "Signed Up", properties={"plan": "pro"})
    ```
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from prefect_webhooks.batching import MessageQueue, QueuedMessage, QueueFull, decode_messages
from prefect_webhooks.client_transport import (
    BatchPoster,
    DeliveryError,
    RetryPolicy,
    basic_auth,
    batch_url,
    deliver,
)
from prefect_webhooks.message_ids import new_message_id
from prefect_webhooks.messages import MAX_MESSAGE_BYTES, BaseMessage, MessageError, parse_message
from prefect_webhooks.settings import get_settings
from prefect_webhooks.timestamps import TimestampError, parse_timestamp

try:
    VERSION = version("prefect-webhooks")
except PackageNotFoundError:  # running from a source tree that was not installed
    VERSION = "0.1.0"

LIBRARY = {"name": "prefect-webhooks", "version": VERSION}
USER_AGENT = f"prefect-webhooks/{VERSION}"
ID_FIELDS = ("userId", "anonymousId", "groupId", "previousId", "messageId")

logger = logging.getLogger("prefect_webhooks.client")

ErrorCallback = Callable[[Exception, list[dict[str, Any]]], Any]
SuccessCallback = Callable[[list[dict[str, Any]]], Any]


class AnalyticsError(ValueError):
    """An invalid call; ``field`` is the keyword argument at fault (``user_id``, ``properties.price``…)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class QueueFullError(DeliveryError):
    """Given to ``on_error`` for a message dropped because the queue stayed full."""


class ClientOptions(BaseModel):
    """The client's tunables, checked once at construction (the write key is kept out of here on purpose)."""

    model_config = ConfigDict(extra="forbid")

    flush_at: int = Field(
        default=20, ge=1,
        description="Messages waiting that trigger a flush, and the most one request carries; 1 turns batching off.",
    )
    flush_after: float = Field(default=5.0, gt=0, description="Seconds since the last flush that trigger a flush.")
    max_queue_size: int = Field(default=10_000, ge=1, description="Messages held in memory at most.")
    on_full: Literal["block", "drop"] = Field(default="block", description="What a call does when the queue is full.")
    block_timeout: float | None = Field(
        default=5.0, ge=0, description="Seconds a call waits for room in block mode before the message is dropped."
    )
    timeout: float = Field(default=10.0, gt=0, description="Seconds the ingest API has to answer one request.")
    max_retries: int = Field(default=10, ge=0, description="Retries of one batch after its first attempt.")
    max_retry_time: float = Field(default=120.0, gt=0, description="Seconds one batch may spend being retried.")
    backoff_base: float = Field(default=0.5, gt=0, description="First backoff in seconds; doubles per retry.")
    backoff_cap: float = Field(default=30.0, gt=0, description="Largest backoff in seconds.")
    gzip: bool = Field(default=False, description="Compress request bodies (Content-Encoding: gzip).")
    senders: int = Field(default=1, ge=1, le=16, description="Sender threads, each with one keep-alive connection.")
    atexit_timeout: float = Field(default=10.0, ge=0, description="Seconds the exit hook spends flushing.")


def _debug_enabled() -> bool:
    return "analytics" in [part.strip() for part in os.environ.get("DEBUG", "").split(",")]


def _enable_debug_logging() -> None:
    """DEBUG=analytics: log this client at DEBUG to stderr (once per process)."""
    if any(getattr(handler, "_prefect_webhooks_debug", False) for handler in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    handler._prefect_webhooks_debug = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)


def _find_unserialisable(value: Any, path: str) -> tuple[str, str]:
    """The dotted path and type name of the first value orjson cannot encode."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return path, f"has a key of type {type(key).__name__}; JSON keys must be strings"
            try:
                orjson.dumps(item)
            except TypeError:
                return _find_unserialisable(item, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            try:
                orjson.dumps(item)
            except TypeError:
                return _find_unserialisable(item, f"{path}[{index}]")
    return path, f"a value of type {type(value).__name__} cannot be serialised to JSON"


def _snake(name: str) -> str:
    return "".join(f"_{char.lower()}" if char.isupper() else char for char in name)


def _event_time(raw: dict[str, Any]) -> datetime:
    """The call's time as an aware UTC datetime: the caller's (historical import) or now."""
    timestamp = raw.get("timestamp")
    if timestamp is None:
        return datetime.now(timezone.utc)
    try:
        return parse_timestamp(timestamp)
    except TimestampError as exc:
        raise AnalyticsError("timestamp", str(exc)) from None


def _wire_time(value: datetime) -> str:
    # isoformat is several times faster than strftime, and this runs once per call.
    return value.isoformat(timespec="milliseconds").removesuffix("+00:00") + "Z"


def _with_library(raw: dict[str, Any]) -> None:
    context = raw.get("context")
    if context is None:
        context = {}
    elif not isinstance(context, Mapping):
        raise AnalyticsError("context", f"must be a dict, got {type(context).__name__}")
    raw["context"] = {**context, "library": LIBRARY}


def prepare_message(raw: dict[str, Any]) -> bytes:
    """Complete one call in wire form (messageId, timestamp, context.library), validate it and serialise it.

    Args:
        raw: The call as a wire-form dict (camelCase keys); it is modified in place.

    Returns:
        The message's JSON bytes, at most ``MAX_MESSAGE_BYTES``.

    Raises:
        AnalyticsError: naming the field at fault; nothing is queued.
    """
    raw["messageId"] = raw.get("messageId") or new_message_id()
    event_time = _event_time(raw)
    # The models take the datetime as is; parsing the string form again would double the cost of a call.
    raw["timestamp"] = event_time
    _with_library(raw)
    try:
        message = parse_message(raw)
    except MessageError as exc:
        raise AnalyticsError(_snake(exc.field), exc.reason) from None
    raw["timestamp"] = _wire_time(event_time)
    for key in ID_FIELDS:
        # The models accept numeric ids; send them as the strings the models hold.
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raw[key] = getattr(message, _snake(key))
    try:
        data = orjson.dumps(raw)
    except TypeError:
        field, reason = _find_unserialisable(raw, "message")
        raise AnalyticsError(_snake(field.removeprefix("message.")), reason) from None
    if len(data) > MAX_MESSAGE_BYTES:
        raise AnalyticsError("message", f"{len(data)} bytes serialised, over the {MAX_MESSAGE_BYTES}-byte limit")
    return data


def _call(message_type: str, **fields: Any) -> dict[str, Any]:
    """A wire-form dict from keyword arguments, leaving out those not given."""
    raw: dict[str, Any] = {"type": message_type}
    for name, value in fields.items():
        if value is not None:
            raw[name] = value
    return raw


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
        on_error: ``on_error(error, messages)`` for every message that failed or was dropped.
        on_success: ``on_success(messages)`` for every batch the API accepted.
        **options: Any other field of ``ClientOptions`` (``max_queue_size``, ``on_full``, ``block_timeout``,
            ``gzip``, ``max_retries``, ``max_retry_time``, ``timeout``, ``senders``…); an unknown option raises
            ``AnalyticsError``.

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
        if flush_at is not None and size is not None and flush_at != size:
            raise AnalyticsError("size", "size is another name for flush_at; give one or the same value")
        chosen = flush_at if flush_at is not None else size if size is not None else 20
        try:
            self.options = ClientOptions(flush_at=chosen, flush_after=flush_after, **options)
        except ValidationError as exc:
            # An option with a typo or a removed one must not be ignored: the client would not do what was asked.
            error = exc.errors(include_url=False)[0]
            field = ".".join(str(part) for part in error["loc"]) or "options"
            reason = "not an option of Analytics" if error["type"] == "extra_forbidden" else error["msg"]
            raise AnalyticsError(field, reason) from None
        self.endpoint = (endpoint or get_settings().resolved_endpoint()).rstrip("/")
        self._url = batch_url(self.endpoint)
        self._headers = {
            "Authorization": basic_auth(write_key),
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
        }
        self.on_error = on_error
        self.on_success = on_success
        self._policy = RetryPolicy(
            self.options.max_retries, self.options.max_retry_time, self.options.backoff_base, self.options.backoff_cap
        )
        if debug or (debug is None and _debug_enabled()):
            _enable_debug_logging()
        self._closed = False
        self._reset_runtime()
        _LIVE_CLIENTS.add(self)

    def _reset_runtime(self) -> None:
        """Fresh queue, locks, counters and (lazily) sender threads: at construction and in a forked child."""
        self._queue = MessageQueue(self.options.max_queue_size, self.options.flush_at)
        self._abort = threading.Event()
        self._start_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._senders: list[threading.Thread] = []
        self.delivered = 0
        self.failed = 0
        self.dropped = 0
        self.pid = os.getpid()

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
        from prefect_webhooks.blocks import Source

        source = Source.load(name, _sync=True)
        if not source.enabled:
            logger.warning("source %r is disabled; the ingest API may refuse its messages", name)
        return cls(source.write_key.get_secret_value(), **kwargs)

    # -- calls ---------------------------------------------------------------------------------------------------

    def identify(
        self,
        user_id: str | None = None,
        traits: dict[str, Any] | None = None,
        *,
        anonymous_id: str | None = None,
        context: dict[str, Any] | None = None,
        timestamp: datetime | str | None = None,
        integrations: dict[str, Any] | None = None,
        message_id: str | None = None,
    ) -> str:
        """Tie a user to traits. Returns the call's messageId.

        Raises:
            AnalyticsError: naming the field at fault (for example no ``user_id`` and no ``anonymous_id``).
        """
        return self._record(
            _call(
                "identify",
                userId=user_id,
                anonymousId=anonymous_id,
                traits=traits,
                context=context,
                timestamp=timestamp,
                integrations=integrations,
                messageId=message_id,
            )
        )

    def track(
        self,
        user_id: str | None = None,
        event: str | None = None,
        properties: dict[str, Any] | None = None,
        *,
        anonymous_id: str | None = None,
        context: dict[str, Any] | None = None,
        timestamp: datetime | str | None = None,
        integrations: dict[str, Any] | None = None,
        message_id: str | None = None,
    ) -> str:
        """Record a user action. Returns the call's messageId.

        Raises:
            AnalyticsError: naming the field at fault (``event`` missing, no user, …).
        """
        return self._record(
            _call(
                "track",
                userId=user_id,
                anonymousId=anonymous_id,
                event=event,
                properties=properties,
                context=context,
                timestamp=timestamp,
                integrations=integrations,
                messageId=message_id,
            )
        )

    def page(
        self,
        user_id: str | None = None,
        category: str | None = None,
        name: str | None = None,
        properties: dict[str, Any] | None = None,
        *,
        traits: dict[str, Any] | None = None,
        anonymous_id: str | None = None,
        context: dict[str, Any] | None = None,
        timestamp: datetime | str | None = None,
        integrations: dict[str, Any] | None = None,
        message_id: str | None = None,
    ) -> str:
        """Record a page view; ``url``, ``title``, ``referrer`` and ``path`` in properties or traits are recognised.

        Raises:
            AnalyticsError: naming the field at fault.
        """
        return self._record(
            _call(
                "page",
                userId=user_id,
                anonymousId=anonymous_id,
                category=category,
                name=name,
                properties=properties,
                traits=traits,
                context=context,
                timestamp=timestamp,
                integrations=integrations,
                messageId=message_id,
            )
        )

    def screen(
        self,
        user_id: str | None = None,
        category: str | None = None,
        name: str | None = None,
        properties: dict[str, Any] | None = None,
        *,
        anonymous_id: str | None = None,
        context: dict[str, Any] | None = None,
        timestamp: datetime | str | None = None,
        integrations: dict[str, Any] | None = None,
        message_id: str | None = None,
    ) -> str:
        """Record a mobile screen view.

        Raises:
            AnalyticsError: naming the field at fault.
        """
        return self._record(
            _call(
                "screen",
                userId=user_id,
                anonymousId=anonymous_id,
                category=category,
                name=name,
                properties=properties,
                context=context,
                timestamp=timestamp,
                integrations=integrations,
                messageId=message_id,
            )
        )

    def group(
        self,
        user_id: str | None = None,
        group_id: str | None = None,
        traits: dict[str, Any] | None = None,
        *,
        anonymous_id: str | None = None,
        context: dict[str, Any] | None = None,
        timestamp: datetime | str | None = None,
        integrations: dict[str, Any] | None = None,
        message_id: str | None = None,
    ) -> str:
        """Associate a user with a group and record the group's traits.

        Raises:
            AnalyticsError: naming the field at fault (``group_id`` missing, no user, …).
        """
        return self._record(
            _call(
                "group",
                userId=user_id,
                anonymousId=anonymous_id,
                groupId=group_id,
                traits=traits,
                context=context,
                timestamp=timestamp,
                integrations=integrations,
                messageId=message_id,
            )
        )

    def alias(
        self,
        previous_id: str | None = None,
        user_id: str | None = None,
        *,
        context: dict[str, Any] | None = None,
        timestamp: datetime | str | None = None,
        integrations: dict[str, Any] | None = None,
        message_id: str | None = None,
    ) -> str:
        """Associate ``previous_id`` with the new ``user_id``.

        Raises:
            AnalyticsError: naming the field at fault (``previous_id`` or ``user_id`` missing).
        """
        return self._record(
            _call(
                "alias",
                previousId=previous_id,
                userId=user_id,
                context=context,
                timestamp=timestamp,
                integrations=integrations,
                messageId=message_id,
            )
        )

    def enqueue(self, message: BaseMessage | Mapping[str, Any]) -> str:
        """Queue a message model (``Identify``, ``Track``, ``Page``, ``Screen``, ``Group``, ``Alias``) or a wire dict.

        The model is validated again as it is queued (fields may have been changed after construction).

        Raises:
            AnalyticsError: naming the field at fault.
        """
        if isinstance(message, BaseMessage):
            raw = message.model_dump(by_alias=True, exclude_none=True)
        elif isinstance(message, Mapping):
            raw = dict(message)
        else:
            raise AnalyticsError("message", f"expected a message model or a dict, got {type(message).__name__}")
        return self._record(raw)

    # -- queue and sender ----------------------------------------------------------------------------------------

    def _record(self, raw: dict[str, Any]) -> str:
        if self._closed:
            raise AnalyticsError("client", "this Analytics client is closed")
        data = prepare_message(raw)
        if self.pid != os.getpid():
            # A fork without the at-fork hook (os.fork in C code): start over as that child.
            self._reset_runtime()
        if not self._senders:
            self._start_senders()
        options = self.options
        try:
            self._queue.put(data, options.block_timeout if options.on_full == "block" else 0)
        except QueueFull:
            self._report_dropped(data)
        return raw["messageId"]

    def _report_dropped(self, data: bytes) -> None:
        with self._count_lock:
            self.dropped += 1
        error = QueueFullError(f"queue full ({self.options.max_queue_size} messages); message dropped")
        logger.debug("dropped a message: %s", error)
        self._callback(self.on_error, error, [orjson.loads(data)])

    def _start_senders(self) -> None:
        with self._start_lock:
            if self._senders:
                return
            for index in range(self.options.senders):
                # The HTTP client (and its TLS context) is built here, in the calling thread: built in the sender
                # thread, an os.fork() landing mid-construction would leave OpenSSL's lock held in the child.
                poster = BatchPoster(self._url, self._headers, self.options.timeout, self.options.gzip)
                thread = threading.Thread(
                    target=self._send_loop,
                    args=(self._queue, self._abort, poster),
                    name=f"analytics-sender-{index}",
                )
                # Daemon so a forgotten client cannot keep the process alive; the atexit hook does the last flush.
                thread.daemon = True
                thread.start()
                self._senders.append(thread)

    def _send_loop(self, queue: MessageQueue, abort: threading.Event, poster: BatchPoster) -> None:
        try:
            while (taken := queue.take(self.options.flush_after)) is not None:
                batch_id, batch = taken
                try:
                    self._send_batch(poster, batch, abort)
                finally:
                    queue.settle(batch_id)
        finally:
            poster.close()

    def _send_batch(self, poster: BatchPoster, batch: list[QueuedMessage], abort: threading.Event) -> None:
        try:
            deliver(poster, batch, self._policy, abort)
        except DeliveryError as error:
            self._batch_failed(batch, error)
        except Exception as exc:  # the sender thread must survive anything, and report the batch
            logger.exception("unexpected error sending a batch")
            self._batch_failed(batch, DeliveryError(f"unexpected error: {type(exc).__name__}: {exc}"))
        else:
            with self._count_lock:
                self.delivered += len(batch)
            if self.on_success is not None:
                self._callback(self.on_success, decode_messages(batch))

    def _batch_failed(self, batch: Sequence[QueuedMessage], error: DeliveryError) -> None:
        with self._count_lock:
            self.failed += len(batch)
        logger.debug("%d messages failed: %s", len(batch), error)
        self._callback(self.on_error, error, decode_messages(batch))

    @staticmethod
    def _callback(callback: Callable[..., Any] | None, *args: Any) -> None:
        if callback is None:
            if args and isinstance(args[0], Exception):
                # No on_error: the log is the only trace left, so it is a warning, not a debug line.
                logger.warning("%d analytics messages not delivered: %s", len(args[1]), args[0])
            return
        try:
            callback(*args)
        except Exception:
            logger.exception("analytics callback %r raised", getattr(callback, "__name__", callback))

    # -- lifecycle -----------------------------------------------------------------------------------------------

    @property
    def queued(self) -> int:
        """Messages waiting in the queue (not counting a batch being sent)."""
        return len(self._queue)

    def flush(self, timeout: float | None = None) -> bool:
        """Send everything queued so far now and wait until each message is delivered or failed.

        Args:
            timeout: Seconds to wait at most; None waits as long as retries take.

        Returns:
            True when everything settled, False when the timeout ran out first.
        """
        if self.pid != os.getpid():
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
        if self.pid != os.getpid():
            self._reset_runtime()
        settled = self._queue.wait_settled(timeout)
        self._queue.close()
        if not settled:
            self._abort.set()
            left = self._queue.drain()
            if left:
                self._batch_failed(left, DeliveryError("client closed before these messages were sent"))
        for thread in self._senders:
            thread.join(None if settled else 1.0)
            if thread.is_alive():
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
