"""How long a destination's shared secret must be, and the warning for one shorter than recommended.

Any non-empty secret is accepted, as Segment's Webhooks destination accepts it: a destination moved from Segment keeps
the secret its receivers already check. One under 16 characters (128 bits when random) is pointed out where a user
looks: when the block is saved, in ``prefect-webhooks status``, and in the field's description in the Prefect UI.
A minimum is enforced only where ``PREFECT_WEBHOOKS_MIN_SECRET_LENGTH`` asks for one. ``generate_secret()`` makes
``whsec_`` + base64 of 32 random bytes (50 characters), the recommended way for a new destination.
"""

from __future__ import annotations

from prefect_webhooks.blocks.saved import revealed, saved_documents
from prefect_webhooks.settings import get_settings

RECOMMENDED_SECRET_LENGTH = 16


def check_secret_length(secret: str) -> None:
    """Refuse an empty secret, or one shorter than PREFECT_WEBHOOKS_MIN_SECRET_LENGTH; the message gives the length,
    never the secret."""
    if not secret:
        raise ValueError("a shared secret is not empty; leave it unset to send requests unsigned")
    minimum = get_settings().delivery.min_secret_length
    if len(secret) < minimum:
        raise ValueError(f"a shared secret has at least {minimum} characters here "
                         f"(PREFECT_WEBHOOKS_MIN_SECRET_LENGTH), this one {len(secret)} "
                         "(WebhookDestination.generate_secret() makes one)")


def short_secret_warning(name: str, secret: str | None) -> str | None:
    """The warning for destination ``name`` when its secret is shorter than recommended, else None."""
    if secret is None or len(secret) >= RECOMMENDED_SECRET_LENGTH:
        return None
    return (f"destination {name!r}: its shared secret has {len(secret)} characters, fewer than the "
            f"{RECOMMENDED_SECRET_LENGTH} recommended (accepted, as Segment accepts it; "
            "WebhookDestination.generate_secret() makes a strong one)")


async def saved_short_secret_warnings() -> list[str]:
    """A warning per saved destination whose shared secret is shorter than recommended (read from the Prefect API)."""
    documents = await saved_documents("webhook-destination", include_secrets=True)
    warnings = (short_secret_warning(document.name, revealed(document.data.get("shared_secret")))
                for document in documents)
    return [warning for warning in warnings if warning]
