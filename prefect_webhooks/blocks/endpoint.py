"""One webhook endpoint: its URL and the static headers sent with every request to it (values kept secret)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from prefect.types import SecretDict
from pydantic import BaseModel, ConfigDict, Field, field_validator

from prefect_webhooks.signing.signatures import (
    IDEMPOTENCY_KEY_HEADER,
    WEBHOOK_ID_HEADER,
    WEBHOOK_SIGNATURE_HEADER,
    WEBHOOK_TIMESTAMP_HEADER,
)

_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_HEADER_VALUE = re.compile(r"^[\t\x20-\x7e\x80-\xff]*$")
# Headers the delivery engine owns: a static header must not change framing, routing, the signatures or the
# message's idempotency key.
RESERVED_HEADERS = frozenset({
    "content-length", "host", "transfer-encoding", "x-signature", "connection", IDEMPOTENCY_KEY_HEADER.lower(),
    WEBHOOK_ID_HEADER, WEBHOOK_TIMESTAMP_HEADER, WEBHOOK_SIGNATURE_HEADER,
})


def check_url(url: str) -> str:
    """A full ``http``/``https`` URL with a host, or ``ValueError`` saying what is missing."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"URL must start with http:// or https://, got scheme {parts.scheme or 'none'!r}")
    if not parts.hostname:
        raise ValueError("URL has no host")
    return url.strip()


class WebhookEndpoint(BaseModel):
    """One webhook URL, the static headers sent with every request to it and an optional rate limit."""

    # Header values are secrets: a validation error must not echo the input.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    url: str = Field(
        description="Full URL of the receiver, including the http or https protocol.",
        examples=["https://hooks.example.com/segment"],
    )
    headers: SecretDict = Field(
        default_factory=lambda: SecretDict({}),
        description="Static headers added to every request to this URL; values are kept secret.",
    )
    rate_limit: float | None = Field(
        default=None,
        gt=0,
        description="Most requests per second this URL gets, summed over every delivery process of the store; no "
        "limit when unset.",
        examples=[10],
    )
    rate_limit_burst: int = Field(
        default=1,
        ge=1,
        description="Requests that may go at once after a quiet spell before rate_limit paces them.",
    )

    @field_validator("url")
    @classmethod
    def _full_url(cls, value: str) -> str:
        return check_url(value)

    @field_validator("headers")
    @classmethod
    def _valid_headers(cls, value: SecretDict) -> SecretDict:
        for name, header_value in value.get_secret_value().items():
            if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
                raise ValueError(f"invalid header name {name!r}")
            if name.lower() in RESERVED_HEADERS:
                raise ValueError(f"header {name!r} is set by the delivery engine and cannot be configured")
            if not isinstance(header_value, str):
                raise ValueError(f"header {name!r}: value must be a string")
            # fullmatch: with match, `$` would let a trailing line break through.
            if not _HEADER_VALUE.fullmatch(header_value):
                # The value is a secret: say what is wrong without echoing it.
                raise ValueError(f"header {name!r}: value contains a control character or line break")
        return value

    def header_values(self) -> dict[str, str]:
        """The static headers in the clear, for building a request."""
        return dict(self.headers.get_secret_value())
