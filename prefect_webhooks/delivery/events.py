"""Prefect events the delivery engine emits, so an automation can alert on messages that failed for good.

Payloads carry ids, the destination name, the reason and the attempt count; never a body, header or secret.
"""

from __future__ import annotations

from prefect.events import emit_event

DELIVERY_FAILED = "prefect-webhooks.delivery.failed"


def outbox_resource_id(outbox_id: int) -> str:
    """The Prefect resource id of one outbox row."""
    return f"prefect-webhooks.outbox.{outbox_id}"


def emit_delivery_failed(outbox_id: int, destination: str, reason: str, attempts: int) -> None:
    """Emit ``prefect-webhooks.delivery.failed`` for a message that will not be attempted again.

    Args:
        outbox_id: The outbox row's id.
        destination: The WebhookDestination block name.
        reason: ``permanent: …`` or ``expired: …`` (an HTTP status or a transport error, no secrets).
        attempts: How many attempts the message had.
    """
    emit_event(
        event=DELIVERY_FAILED,
        resource={
            "prefect.resource.id": outbox_resource_id(outbox_id),
            "prefect.resource.name": f"outbox message {outbox_id}",
        },
        related=[
            {
                "prefect.resource.id": f"prefect-webhooks.destination.{destination}",
                "prefect.resource.role": "destination",
            }
        ],
        payload={"outbox_id": outbox_id, "destination": destination, "reason": reason, "attempts": attempts},
    )
