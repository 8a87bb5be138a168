"""The client's tunables, checked once when a client is made."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from prefect_webhooks.client.errors import AnalyticsError


class ClientOptions(BaseModel):
    """Every option of ``Analytics`` but the write key and the callbacks (kept out of here on purpose)."""

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


def client_options(flush_at: int | None, size: int | None, flush_after: float, **options: Any) -> ClientOptions:
    """The options of a new client; ``size`` (the spec's name) and ``flush_at`` are one option.

    Raises:
        AnalyticsError: naming the option at fault; an unknown option is refused, not ignored.
    """
    if flush_at is not None and size is not None and flush_at != size:
        raise AnalyticsError("size", "size is another name for flush_at; give one or the same value")
    chosen = flush_at if flush_at is not None else size if size is not None else 20
    try:
        return ClientOptions(flush_at=chosen, flush_after=flush_after, **options)
    except ValidationError as exc:
        # An option with a typo or a removed one must not be ignored: the client would not do what was asked.
        error = exc.errors(include_url=False)[0]
        field = ".".join(str(part) for part in error["loc"]) or "options"
        reason = "not an option of Analytics" if error["type"] == "extra_forbidden" else error["msg"]
        raise AnalyticsError(field, reason) from None
