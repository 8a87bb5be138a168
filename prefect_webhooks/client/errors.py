"""What the Analytics client raises (``AnalyticsError``) and what it gives ``on_error`` (``UploadError``)."""

from __future__ import annotations

from prefect_webhooks.messages.model import MessageError


class AnalyticsError(MessageError):
    """An invalid call; ``field`` is the keyword argument at fault (``user_id``, ``properties.price``…)."""


class UploadError(Exception):
    """Messages that did not reach the ingest API; ``status`` is the HTTP status when there was one."""

    def __init__(self, reason: str, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(reason)
        self.status = status
        self.retryable = retryable


class QueueFullError(UploadError):
    """A message dropped because the queue stayed full (``on_full="drop"``, or ``block_timeout`` ran out)."""
