"""Prefect blocks: where a destination's endpoints and a source's write key are kept."""

from __future__ import annotations

import re
from typing import Any, TypeVar
from urllib.parse import urlsplit
from uuid import UUID

from prefect.blocks.core import Block
from prefect.types import SecretDict
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

MAX_ENDPOINTS = 5
# Prefect's own webhook block logo: a real, square PNG the UI can show.
LOGO_URL = "https://raw.githubusercontent.com/PrefectHQ/prefect/420d0d6a78bb6df1fc18bcf188fdad43c1d22ea9/assets/block-logos/webhook.png"
DOCS_URL = "https://github.com/prefect-webhooks/prefect-webhooks#readme"

_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_HEADER_VALUE = re.compile(r"^[\t\x20-\x7e\x80-\xff]*$")
# Headers the delivery engine owns: a static header must not change framing, routing or the signature.
RESERVED_HEADERS = frozenset({"content-length", "host", "transfer-encoding", "x-signature", "connection"})

BlockT = TypeVar("BlockT", bound=Block)


async def save_block(block: Block, name: str, *, overwrite: bool = False) -> UUID:
    """Save ``block`` as ``name`` from async code, on every Prefect 3 release.

    ``Block.asave`` exists from Prefect 3.7; before, ``save`` is the coroutine in async code. ``_sync=False`` asks
    both forms for the coroutine, also inside a sync flow run.
    """
    return await block.save(name, overwrite=overwrite, _sync=False)  # type: ignore[call-arg,misc]


async def load_block(block_type: type[BlockT], name: str) -> BlockT:
    """Load the saved block ``name`` from async code, on every Prefect 3 release (``aload`` exists from 3.5)."""
    return await block_type.load(name, _sync=False)  # type: ignore[call-arg,misc]


def check_url(url: str) -> str:
    """A full ``http``/``https`` URL with a host, or ``ValueError`` saying what is missing."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"URL must start with http:// or https://, got scheme {parts.scheme or 'none'!r}")
    if not parts.hostname:
        raise ValueError("URL has no host")
    return url.strip()


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


class WebhookDestination(Block):
    """A customer's webhook destination: one to five endpoint URLs and an optional shared secret.

    A message is posted to every URL; once any one answers 2xx it counts as delivered. With a shared secret
    every request carries ``X-Signature``, the hex HMAC-SHA1 of the body.

    Attributes:
        endpoints: One to five endpoints, each a URL with optional static headers.
        shared_secret: Key of the ``X-Signature`` HMAC; no signature when unset.

    Example:
        Load a saved destination:
        ```python
        from prefect_webhooks.blocks import WebhookDestination

        destination = WebhookDestination.load("BLOCK_NAME")
        ```

        Create one:
        ```python
        from prefect_webhooks.blocks import WebhookDestination

        WebhookDestination(
            endpoints=[{"url": "https://hooks.example.com/in", "headers": {"Authorization": "Bearer abc"}}],
            shared_secret="s3cret",
        ).save("crm-webhooks")
        ```
    """

    model_config = ConfigDict(hide_input_in_errors=True)

    _block_type_name = "Webhook Destination"
    _block_type_slug = "webhook-destination"
    _logo_url = LOGO_URL
    _documentation_url = DOCS_URL

    endpoints: list[WebhookEndpoint] = Field(
        min_length=1,
        max_length=MAX_ENDPOINTS,
        description="One to five endpoints; each is a full http(s) URL with optional static headers.",
    )
    shared_secret: SecretStr | None = Field(
        default=None,
        description="When set, each request carries X-Signature: the hex HMAC-SHA1 of the body keyed by it.",
    )

    @field_validator("endpoints", mode="before")
    @classmethod
    def _count_endpoints(cls, value: Any) -> Any:
        if isinstance(value, list) and not 1 <= len(value) <= MAX_ENDPOINTS:
            raise ValueError(f"a destination has 1 to {MAX_ENDPOINTS} endpoints, got {len(value)}")
        return value

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The block schema, with the whole ``endpoints`` list declared secret.

        Prefect's API masks secret fields by flattening nested dicts but never descends into lists, so the
        ``endpoints.headers.*`` it derives would return header values in the clear. Masking the list keeps header
        values (and URL tokens) out of API reads; ``load`` still returns everything.
        """
        schema = super().model_json_schema(*args, **kwargs)
        secret_fields = schema.setdefault("secret_fields", [])
        if "endpoints.*" not in secret_fields:
            secret_fields.append("endpoints.*")
        return schema

    def secret(self) -> str | None:
        """The shared secret in the clear, or None."""
        return self.shared_secret.get_secret_value() if self.shared_secret else None


class Source(Block):
    """A source of events: its write key and the webhook destinations enabled on it.

    Attributes:
        write_key: The key clients send with every batch; unique across sources.
        destinations: Names of saved WebhookDestination blocks that receive this source's events.
        enabled: Whether the source accepts events at all.

    Example:
        Load a saved source:
        ```python
        from prefect_webhooks.blocks import Source

        source = Source.load("BLOCK_NAME")
        ```

        Create one:
        ```python
        from prefect_webhooks.blocks import Source

        Source(write_key="wk_live_123", destinations=["crm-webhooks"]).save("web-app")
        ```
    """

    model_config = ConfigDict(hide_input_in_errors=True)

    _block_type_name = "Webhooks Source"
    _block_type_slug = "webhooks-source"
    _logo_url = LOGO_URL
    _documentation_url = DOCS_URL

    write_key: SecretStr = Field(description="The source's write key, sent by clients; unique across sources.")
    destinations: list[str] = Field(
        default_factory=list,
        description="Names of saved WebhookDestination blocks enabled on this source.",
    )
    enabled: bool = Field(default=True, description="Whether the source accepts events.")

    @field_validator("write_key")
    @classmethod
    def _non_empty_key(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value().strip():
            raise ValueError("write_key must not be empty")
        return value

    @field_validator("destinations", mode="before")
    @classmethod
    def _destination_names(cls, value: Any) -> Any:
        # A saved WebhookDestination is kept by name, so later edits to it are seen (a nested copy would not be).
        if isinstance(value, list):
            names = []
            for item in value:
                if isinstance(item, WebhookDestination):
                    if not item._block_document_name:
                        raise ValueError("save a WebhookDestination before enabling it on a source")
                    names.append(item._block_document_name)
                else:
                    names.append(item)
            return names
        return value
