"""Where every message's end is counted and told: uploaded (``on_success``), failed or dropped (``on_error``).

None is dropped silently: with no ``on_error``, a message that failed or was dropped is logged as a warning.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from prefect_webhooks.client.batching import QueuedMessage, decode_messages
from prefect_webhooks.client.errors import UploadError
from prefect_webhooks.client.logs import logger

ErrorCallback = Callable[[Exception, list[dict[str, Any]]], Any]
SuccessCallback = Callable[[list[dict[str, Any]]], Any]


class Reporter:
    """The counters of one client and its callbacks, shared by the calling threads and the sender threads."""

    def __init__(self, on_error: ErrorCallback | None, on_success: SuccessCallback | None) -> None:
        self.on_error = on_error
        self.on_success = on_success
        self._lock = threading.Lock()
        self.uploaded = 0
        self.failed = 0
        self.dropped = 0

    def batch_uploaded(self, batch: Sequence[QueuedMessage]) -> None:
        """The ingest API accepted ``batch``."""
        with self._lock:
            self.uploaded += len(batch)
        if self.on_success is not None:
            # Decoded only when asked for: most clients have no on_success.
            self._call(self.on_success, decode_messages(batch))

    def batch_failed(self, batch: Sequence[QueuedMessage], error: UploadError) -> None:
        """``batch`` did not reach the ingest API and will not be tried again."""
        with self._lock:
            self.failed += len(batch)
        logger.debug("%d messages failed: %s", len(batch), error)
        self._tell_error(error, decode_messages(batch))

    def message_dropped(self, data: bytes, error: UploadError) -> None:
        """A message was not queued (the queue stayed full)."""
        with self._lock:
            self.dropped += 1
        logger.debug("dropped a message: %s", error)
        self._tell_error(error, [orjson.loads(data)])

    def _tell_error(self, error: UploadError, messages: list[dict[str, Any]]) -> None:
        if self.on_error is None:
            # No on_error: the log is the only trace left, so it is a warning, not a debug line.
            logger.warning("%d analytics messages not uploaded: %s", len(messages), error)
            return
        self._call(self.on_error, error, messages)

    @staticmethod
    def _call(callback: Callable[..., Any], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:
            logger.exception("analytics callback %r raised", getattr(callback, "__name__", callback))
