"""Zero-downtime secret rotation: the ``rotate-secret`` command and the end of rotation windows.

``WebhookDestination.rotate_secret`` makes the new secret current and keeps the old one for a window. During the
window ``X-Signature`` is still made with the old secret (a receiver that knows only the old one keeps working)
and ``webhook-signature`` carries a signature with each; receivers add the new secret to the ones they accept. When
the window ends the new secret signs everything: delivery stops using the old secret at once (it checks the
window's end on every request), and ``finish_rotations`` — run by every ``deliver`` flow run — removes it from the
saved block.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from prefect._internal.compatibility.async_dispatch import async_dispatch
from pydantic import SecretStr, TypeAdapter

from prefect_webhooks.blocks.destination import DEFAULT_ROTATION_WINDOW, WebhookDestination
from prefect_webhooks.blocks.saved import is_missing_block, load_block, save_block, saved_documents

DESTINATION_BLOCK_SLUG = "webhook-destination"
_DATETIME = TypeAdapter(datetime)


def _ended(expires_at: object, now: datetime) -> bool:
    if expires_at is None:
        return False
    moment = _DATETIME.validate_python(expires_at)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment <= now


async def _names_with_ended_rotations(now: datetime) -> list[str]:
    """Destination blocks whose stored rotation window has ended, read without secrets."""
    return [document.name for document in await saved_documents(DESTINATION_BLOCK_SLUG)
            if _ended(document.data.get("previous_secret_expires_at"), now)]


async def afinish_rotations(now: datetime | None = None) -> list[str]:
    """Remove previous secrets whose rotation window has ended from the saved destination blocks.

    Args:
        now: The time windows are compared with; the current time by default.

    Returns:
        The names of the blocks saved without their previous secret.
    """
    now = now or datetime.now(timezone.utc)
    finished = []
    for name in await _names_with_ended_rotations(now):
        block = await load_block(WebhookDestination, name)
        # Checked again on a fresh copy: the block may have been rotated again since the listing.
        if block.previous_secret is None or block.rotation_active(now):
            continue
        block = block.model_copy(update={"previous_secret": None, "previous_secret_expires_at": None})
        await save_block(block, name, overwrite=True)
        finished.append(name)
    return finished


@async_dispatch(afinish_rotations)
def finish_rotations(now: datetime | None = None) -> list[str]:
    """Remove previous secrets whose rotation window has ended (sync form of ``afinish_rotations``)."""
    import asyncio

    return asyncio.run(afinish_rotations(now))


# -- The rotate-secret command -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RotationOutcome:
    """What a rotation did: the new secret (shown once when generated) and the end of the window."""

    destination: str
    new_secret: SecretStr
    generated: bool
    old_secret_valid_until: datetime | None
    x_signature: bool = True
    standard_webhooks: bool = False


def rotate_destination_secret(
    name: str, new_secret: str | None = None, window: timedelta = DEFAULT_ROTATION_WINDOW, force: bool = False
) -> RotationOutcome:
    """Rotate the shared secret of the saved destination ``name`` (the logic behind ``rotate-secret``).

    Args:
        name: The WebhookDestination block name.
        new_secret: The new secret; a generated ``whsec_`` secret when None.
        window: How long the old secret stays valid.
        force: Rotate even while a rotation is in progress.

    Raises:
        ValueError: the block does not exist, or the rotation is refused (reason in the message).
    """
    try:
        block = WebhookDestination.load(name, _sync=True)
    except Exception as exc:
        if is_missing_block(exc):
            raise ValueError(f"no WebhookDestination block named {name!r} is saved") from None
        raise
    secret = block.rotate_secret(new_secret, window=window, force=force, _sync=True)
    return RotationOutcome(
        destination=name,
        new_secret=secret,
        generated=new_secret is None,
        old_secret_valid_until=block.previous_secret_expires_at,
        x_signature=block.x_signature,
        standard_webhooks=block.standard_webhooks,
    )


def describe_rotation(outcome: RotationOutcome) -> str:
    """What the command prints (the secret itself only when it was generated)."""
    lines = []
    if outcome.old_secret_valid_until is None:
        lines.append(f"{outcome.destination}: the new secret signs every request from now on.")
    else:
        until = outcome.old_secret_valid_until.astimezone(timezone.utc).isoformat(timespec="seconds")
        lines.append(f"{outcome.destination}: rotation until {until}. Until then {_during_window(outcome)}; add the "
                     "new secret to your receiver's accepted secrets now and remove the old one after that time.")
    if outcome.generated:
        lines.append("New secret (shown once; give it to the receiver):")
        lines.append(outcome.new_secret.get_secret_value())
    return "\n".join(lines)


def _during_window(outcome: RotationOutcome) -> str:
    """What the requests carry during the window, by the signatures the destination sends."""
    carried = []
    if outcome.x_signature:
        carried.append("X-Signature is still made with the old secret")
    if outcome.standard_webhooks:
        carried.append("webhook-signature carries a signature with each secret")
    return " and ".join(carried) or "the old secret stays valid"

