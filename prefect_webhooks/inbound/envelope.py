"""The request envelope: a ``/v1/batch`` body's batch-level fields, and how they merge into each call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class EnvelopeError(ValueError):
    """A request that is refused as a whole (answered 400): ``code`` is machine-readable, ``message`` says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Envelope:
    """The batch-level fields of a request body."""

    messages: list[Any]
    context: dict[str, Any] | None = None
    integrations: dict[str, Any] | None = None
    sent_at: Any = None
    write_key: str | None = None


def _object_or_none(body: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise EnvelopeError("invalid_batch", f"batch-level {key} must be a JSON object")
    return value


def batch_envelope(body: Any) -> Envelope:
    """Read a ``/v1/batch`` body: the calls and the batch-level ``context``, ``integrations``, ``sentAt``, key.

    Raises:
        EnvelopeError: the body is not an object with a ``batch`` list.
    """
    if not isinstance(body, dict):
        raise EnvelopeError("invalid_batch", "the body must be a JSON object with a batch list")
    messages = body.get("batch")
    if not isinstance(messages, list):
        raise EnvelopeError("invalid_batch", "the body must have a batch list")
    write_key = body.get("writeKey")
    return Envelope(
        messages=messages,
        context=_object_or_none(body, "context"),
        integrations=_object_or_none(body, "integrations"),
        sent_at=body.get("sentAt"),
        write_key=write_key if isinstance(write_key, str) else None,
    )


def merge_batch_fields(
    raw: dict[str, Any],
    context: dict[str, Any] | None = None,
    integrations: dict[str, Any] | None = None,
    sent_at: Any = None,
) -> dict[str, Any]:
    """A copy of ``raw`` with the batch-level fields merged in; the call's own values win.

    ``context`` and ``integrations`` merge key by key (one level deep, and ``context.integrations`` key by key too);
    ``sentAt`` fills in only when missing.
    """
    merged = dict(raw)
    if context:
        own = merged.get("context")
        if isinstance(own, dict):
            merged["context"] = {**context, **own}
            batch_nested, own_nested = context.get("integrations"), own.get("integrations")
            if isinstance(batch_nested, dict) and isinstance(own_nested, dict):
                # context.integrations routes the call (see routing): merged key by key like the top-level object.
                merged["context"]["integrations"] = {**batch_nested, **own_nested}
        elif own is None:
            merged["context"] = context
        # A call's own context that is not an object stays as sent, for validation to refuse with its field name.
    if integrations:
        own = merged.get("integrations")
        merged["integrations"] = (
            {**integrations, **own} if isinstance(own, dict) else (own if own is not None else integrations)
        )
    if sent_at is not None and merged.get("sentAt") is None:
        merged["sentAt"] = sent_at
    return merged
