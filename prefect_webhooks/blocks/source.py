"""The Source block: a write key and the webhook destinations enabled on it."""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr, field_validator

from prefect_webhooks.blocks.destination import DOCS_URL, LOGO_URL, WebhookDestination
from prefect_webhooks.blocks.validated import ValidatedBlock


class Source(ValidatedBlock):
    """A source of events: its write key and the webhook destinations enabled on it.

    Attributes:
        write_key: The key clients send with every batch; unique across sources.
        destinations: Names of saved WebhookDestination blocks that receive this source's events.
        enabled: Whether the source accepts events at all.

    Example:
        Load a saved source:
        ```python
        from prefect_webhooks.blocks.source import Source

        source = Source.load("BLOCK_NAME")
        ```

        Create one:
        ```python
        from prefect_webhooks.blocks.source import Source

        Source(write_key="wk_live_123", destinations=["crm-webhooks"]).save("web-app")
        ```
    """

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
