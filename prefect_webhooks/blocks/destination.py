"""Prefect blocks: where a destination's endpoints and a source's write key are kept (an endpoint's URL and headers
are checked in ``webhook_endpoint``)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import Any

from prefect._internal.compatibility.async_dispatch import async_dispatch
from pydantic import (
    Field,
    SecretStr,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from prefect_webhooks.blocks.disabled import DisabledEndpoint, check_disabled_entries
from prefect_webhooks.blocks.endpoint import WebhookEndpoint
from prefect_webhooks.blocks.filter_rules import FilterRule, check_rules
from prefect_webhooks.blocks.saved import revealed, save_block
from prefect_webhooks.blocks.secret_length import check_secret_length, short_secret_warning
from prefect_webhooks.blocks.validated import ValidatedBlock
from prefect_webhooks.signing.signatures import decode_secret, generate_secret

MAX_ENDPOINTS = 5
MAX_BATCH_SIZE = 4000
DEFAULT_BATCH_BYTES = 1_000_000
# Prefect's own webhook block logo: a real, square PNG the UI can show.
LOGO_URL = "https://raw.githubusercontent.com/PrefectHQ/prefect/420d0d6a78bb6df1fc18bcf188fdad43c1d22ea9/assets/block-logos/webhook.png"
DOCS_URL = "https://github.com/prefect-webhooks/prefect-webhooks#readme"

# How long a rotated-out secret stays valid by default (as Svix keeps an old endpoint secret).
DEFAULT_ROTATION_WINDOW = timedelta(hours=24)
logger = logging.getLogger("prefect_webhooks.blocks")


class RotationInProgress(ValueError):
    """A rotation was asked for while the previous one's window is still open (pass ``force=True`` to drop the
    older secret now)."""

    def __init__(self, name: str, until: datetime) -> None:
        self.name = name
        self.until = until
        super().__init__(f"a rotation of {name!r} is in progress until {until.isoformat()}; rotate again after it "
                         "ends, or pass force=True to drop the older secret now")


class WebhookDestination(ValidatedBlock):
    """A customer's webhook destination: one to five endpoint URLs and an optional shared secret.

    By default a message is posted to every URL and counts as delivered once any one answers 2xx (the seed's rule:
    the others are not retried). With ``each_endpoint`` every URL gets every message on its own: its own retries,
    4-hour bound, outcome and counters, so one endpoint that is down never holds back or hides from the others.
    Every request carries the
    message's stable id (``Idempotency-Key``, or ``webhook-id`` with Standard Webhooks on) so a receiver can drop
    the rare duplicate of at-least-once delivery. With a shared secret every request carries ``X-Signature``, the
    hex HMAC-SHA1 of the body; with ``standard_webhooks`` also ``webhook-id``, ``webhook-timestamp`` and
    ``webhook-signature``. ``rotate_secret`` replaces the secret with no downtime, and ``filters`` drop messages
    before they are sent.

    Attributes:
        endpoints: One to five endpoints, each a URL with optional static headers, method, mapping and
            authentication (bearer token, OAuth2 client credentials, client certificate).
        shared_secret: Key of the ``X-Signature`` HMAC (and of ``webhook-signature``); no signature when unset.
        standard_webhooks: Also sign the Standard Webhooks way; the secret must be in the ``whsec_`` format.
        x_signature: Send ``X-Signature`` when a shared secret is set.
        previous_secret: The secret a rotation replaced, still signing until ``previous_secret_expires_at``.
        previous_secret_expires_at: End of the rotation window.
        filters: Rules that drop messages, or allow only some, before they are sent.
        batch_size: Send up to this many messages per request, as a JSON array; one message per request when unset.
        batch_bytes: Largest body of a batch in bytes (1,000,000 when unset).
        batch_wait: Seconds a message may wait for its batch to fill (0 when unset: send what is due).
        each_endpoint: Deliver every message to every endpoint independently (fan-out), not once to any one.
        ordered: Deliver each user's messages one at a time, in the order they were accepted.
        disable_after: Disable an endpoint that has failed without a break for this long; never when unset.
        disabled_endpoints: The endpoints that get no requests (remove an entry to enable it again).

    Example:
        Load a saved destination:
        ```python
        from prefect_webhooks.blocks.destination import WebhookDestination

        destination = WebhookDestination.load("BLOCK_NAME")
        ```

        Create one:
        ```python
        from prefect_webhooks.blocks.destination import WebhookDestination

        WebhookDestination(
            endpoints=[{"url": "https://hooks.example.com/in", "headers": {"Authorization": "Bearer abc"}}],
            shared_secret=WebhookDestination.generate_secret(),
        ).save("crm-webhooks")
        ```
    """

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
        description=(
            "When set, each request carries X-Signature: the hex HMAC-SHA1 of the body keyed by it. With Standard "
            "Webhooks on it also keys webhook-signature and must be whsec_ followed by base64 of 24 to 64 bytes. "
            "Any non-empty secret is accepted; under 16 characters it is saved with a warning (a secret moved from "
            "Segment keeps working), and generate_secret() makes a strong one."
        ),
        # Checked in Python by _long_enough (a message that names the rule); here for the UI form.
        json_schema_extra={"minLength": 1},
    )
    standard_webhooks: bool = Field(
        default=False,
        description=(
            "Also sign each request the Standard Webhooks way: webhook-id, webhook-timestamp and webhook-signature "
            "(v1, base64 HMAC-SHA256 of id.timestamp.body)."
        ),
    )
    x_signature: bool = Field(
        default=True,
        description="Send X-Signature when a shared secret is set; turn off to sign with Standard Webhooks only.",
    )
    previous_secret: SecretStr | None = Field(
        default=None,
        description=(
            "The secret the last rotation replaced: it keeps signing X-Signature, and signs webhook-signature next "
            "to the new secret, until previous_secret_expires_at."
        ),
    )
    previous_secret_expires_at: datetime | None = Field(
        default=None,
        description="End of the rotation window; then only the shared secret signs and the previous one is removed.",
    )
    filters: list[FilterRule] = Field(
        default_factory=list,
        description="Destination filter rules, checked in order: drop matching messages, or allow only matching ones.",
    )
    each_endpoint: bool = Field(
        default=False,
        description="Every endpoint gets every message, each with its own retries, 4-hour bound, outcome and counters "
        "(fan-out, as Svix and Convoy deliver); when off, a message is delivered once any one endpoint answers 2xx "
        "and the others are not retried.",
    )
    ordered: bool = Field(
        default=False,
        description="Deliver the messages of each user (userId, else anonymousId) to each endpoint in the order they "
        "were accepted: a message waits until the user's previous one is delivered or has failed for good.",
    )
    disable_after: timedelta | None = Field(
        default=None,
        description="Disable an endpoint once it has failed without a single success for this long (e.g. 5 days); "
        "never disabled when unset.",
    )
    disabled_endpoints: list[DisabledEndpoint] = Field(
        default_factory=list,
        description="Endpoints that get no requests (delivery adds one after disable_after); remove an entry to "
        "enable that endpoint again.",
    )
    batch_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_BATCH_SIZE,
        description="Send up to this many messages per request as a JSON array of {id, message} items, signed "
        "whole; unset: one message per request.",
    )
    batch_bytes: int | None = Field(
        default=None, ge=1024, le=16 * 2**20, description="Largest batch body in bytes; 1,000,000 when unset."
    )
    batch_wait: float | None = Field(
        default=None,
        ge=0,
        le=300,
        description="Seconds a message may wait for its batch to fill; 0 when unset (send what is due at once).",
    )

    @field_validator("endpoints", mode="before")
    @classmethod
    def _count_endpoints(cls, value: Any) -> Any:
        if isinstance(value, list) and not 1 <= len(value) <= MAX_ENDPOINTS:
            raise ValueError(f"a destination has 1 to {MAX_ENDPOINTS} endpoints, got {len(value)}")
        return value

    @field_validator("shared_secret")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            check_secret_length(value.get_secret_value())
        return value

    @field_validator("previous_secret_expires_at")
    @classmethod
    def _aware_utc(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value

    @model_validator(mode="after")
    def _consistent_secrets(self) -> WebhookDestination:
        # Messages name the field and what is wrong, never the secret (hide_input_in_errors keeps it out too).
        if self.standard_webhooks:
            if self.shared_secret is None:
                raise ValueError(
                    "shared_secret: Standard Webhooks signing needs a shared secret in the whsec_ format "
                    "(WebhookDestination.generate_secret() makes one)"
                )
            try:
                decode_secret(self.shared_secret.get_secret_value())
            except ValueError as exc:
                raise ValueError(f"shared_secret: {exc}") from None
        if self.previous_secret is not None:
            if self.shared_secret is None:
                raise ValueError("previous_secret: kept only during a rotation, next to a shared_secret")
            if self.previous_secret_expires_at is None:
                raise ValueError("previous_secret: needs previous_secret_expires_at, the end of the rotation window")
        elif self.previous_secret_expires_at is not None:
            raise ValueError("previous_secret_expires_at: set only together with previous_secret")
        check_rules(self.filters)
        check_disabled_entries(self.disabled_endpoints, len(self.endpoints))
        if self.disable_after is not None and self.disable_after <= timedelta(0):
            raise ValueError("disable_after: must be a positive duration")
        for name in ("batch_bytes", "batch_wait"):
            if getattr(self, name) is not None and self.batch_size is None:
                raise ValueError(f"{name}: applies to batches; set batch_size too")
        return self

    @model_serializer(mode="wrap")
    def ser_model(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        """Prefect's block serialiser, except that ``endpoints`` is written by ``saved.revealed`` when a save asks
        for secrets (Prefect's own walk can write one endpoint over another)."""
        data = super().ser_model(handler, info)
        if info.context and info.context.get("include_secrets") is True and isinstance(data, dict):
            data["endpoints"] = revealed(self.endpoints)
        return data

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

    @staticmethod
    def generate_secret() -> SecretStr:
        """A new random secret (``whsec_`` + base64 of 32 bytes): valid for X-Signature and Standard Webhooks.

        Returns:
            The secret, as ``rotate_secret`` returns one (``.get_secret_value()`` gives the text).
        """
        return SecretStr(generate_secret())

    def rotation_active(self, now: datetime | None = None) -> bool:
        """Whether a previous secret is still within its rotation window at ``now`` (default: the current time)."""
        if self.previous_secret is None or self.previous_secret_expires_at is None:
            return False
        return (now or datetime.now(timezone.utc)) < self.previous_secret_expires_at

    def _rotated(
        self, new_secret: str | SecretStr | None, window: timedelta | float, force: bool
    ) -> tuple[WebhookDestination, str]:
        """A copy of this block with ``new_secret`` current and the old one kept for ``window``; and its name."""
        name = self._block_document_name
        if not name:
            raise ValueError("save the destination before rotating its secret (the rotation is saved under its name)")
        if isinstance(new_secret, SecretStr):
            new_secret = new_secret.get_secret_value()
        new_secret = generate_secret() if new_secret is None else new_secret
        try:
            check_secret_length(new_secret)
        except ValueError as exc:
            raise ValueError(f"new_secret: {exc}") from None
        window = window if isinstance(window, timedelta) else timedelta(seconds=window)
        if window < timedelta(0):
            raise ValueError("window: must not be negative")
        now = datetime.now(timezone.utc)
        current = self.secret()
        if current is not None and new_secret == current:
            raise ValueError("new_secret: is the current shared secret")
        if self.rotation_active(now) and not force:
            assert self.previous_secret_expires_at is not None
            raise RotationInProgress(name, self.previous_secret_expires_at)
        keep_previous = current is not None and window > timedelta(0)
        rotated = self.model_copy(update={
            "shared_secret": SecretStr(new_secret),
            "previous_secret": SecretStr(current) if keep_previous else None,
            "previous_secret_expires_at": now + window if keep_previous else None,
        })  # validated: model_copy checks the copy as a new block
        return rotated, name

    def _adopt(self, rotated: WebhookDestination) -> None:
        self._take_fields(rotated, ("shared_secret", "previous_secret", "previous_secret_expires_at"))

    async def arotate_secret(
        self,
        new_secret: str | SecretStr | None = None,
        *,
        window: timedelta | float = DEFAULT_ROTATION_WINDOW,
        force: bool = False,
    ) -> SecretStr:
        """Replace the shared secret with no downtime and save the block: the async form of ``rotate_secret``, which
        describes the arguments.

        Returns:
            The new secret.
        """
        rotated, name = self._rotated(new_secret, window, force)
        await save_block(rotated, name, overwrite=True)
        self._adopt(rotated)
        assert rotated.shared_secret is not None
        return rotated.shared_secret

    # Every save goes through ``_save`` (async, every Prefect 3 release) or ``_save_sync`` (sync, later releases):
    # where a short secret is pointed out, once it is stored.
    async def _save(self, *args: Any, **kwargs: Any) -> Any:
        document_id = await super()._save(*args, **kwargs)
        self._warn_if_short_secret(kwargs.get("name") or (args[0] if args else None))
        return document_id

    def _save_sync(self, *args: Any, **kwargs: Any) -> Any:
        document_id = super()._save_sync(*args, **kwargs)  # type: ignore[misc]
        self._warn_if_short_secret(kwargs.get("name") or (args[0] if args else None))
        return document_id

    def _warn_if_short_secret(self, name: str | None) -> None:
        warning = short_secret_warning(name or self._block_document_name or "(unnamed)", self.secret())
        if warning:
            logger.warning(warning)

    @async_dispatch(arotate_secret)
    def rotate_secret(
        self,
        new_secret: str | SecretStr | None = None,
        *,
        window: timedelta | float = DEFAULT_ROTATION_WINDOW,
        force: bool = False,
    ) -> SecretStr:
        """Replace the shared secret with no downtime and save the block.

        Dispatches to ``arotate_secret`` when called from an async context, as ``save`` does.

        Args:
            new_secret: The new secret; a generated ``whsec_`` secret when None.
            window: How long the old secret stays valid (a timedelta or seconds; 24 h by default). During it
                ``X-Signature`` is still made with the old secret and ``webhook-signature`` carries both; at its end
                the new secret takes over and the old one is removed from the saved block. ``0`` switches at once
                (a leaked secret).
            force: Start a new rotation even while one is in progress (the oldest secret is dropped at once).

        Returns:
            The new secret.

        Example:
            ```python
            from prefect_webhooks.blocks.destination import WebhookDestination

            destination = WebhookDestination.load("BLOCK_NAME")
            new_secret = destination.rotate_secret(window=3600)
            ```
        """
        rotated, name = self._rotated(new_secret, window, force)
        rotated.save(name, overwrite=True, _sync=True)
        self._adopt(rotated)
        assert rotated.shared_secret is not None
        return rotated.shared_secret

