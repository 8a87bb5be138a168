"""One webhook endpoint: its URL, the static headers sent with every request to it (values kept secret), and what
its receiver may ask for beyond the seed's POST: another method, a mapping of the body, a bearer token, OAuth2
client credentials or a client certificate."""

from __future__ import annotations

import re
from typing import Any, Literal

from prefect.types import SecretDict
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from prefect_webhooks.blocks.endpoint_auth import ClientCertificate, EndpointAuth, check_url
from prefect_webhooks.messages.mapping import compile_mapping
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


class WebhookEndpoint(BaseModel):
    """One webhook URL and the static headers sent with every request to it."""

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
    method: Literal["POST", "PUT", "PATCH"] = Field(default="POST", description="HTTP method of the requests.")
    mapping: dict[str, Any] | None = Field(
        default=None,
        description="A template that builds the body from each message ({\"@path\": \"$.properties.x\"}, "
        "constants, renames); the message as specified when unset.",
    )
    auth: EndpointAuth | None = Field(
        default=None, description="A bearer token or OAuth2 client credentials sent in the Authorization header."
    )
    client_certificate: ClientCertificate | None = Field(
        default=None, description="A client certificate and key presented to the server (mutual TLS)."
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

    @field_validator("mapping")
    @classmethod
    def _valid_mapping(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            compile_mapping(value)
        return value

    @model_validator(mode="after")
    def _one_authorization(self) -> WebhookEndpoint:
        if self.auth is not None and any(name.lower() == "authorization" for name in self.header_values()):
            raise ValueError("headers: an Authorization header cannot be set next to auth, which sets it")
        return self

    def header_values(self) -> dict[str, str]:
        """The static headers in the clear, for building a request."""
        return dict(self.headers.get_secret_value())
