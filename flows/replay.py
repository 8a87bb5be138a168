"""The ``replay`` flow: put a destination's failed messages back into the outbox with a fresh deadline."""

# No `from __future__ import annotations`: Prefect before 3.5 builds the flow's parameter model from the signature
# without this module's namespace, so the annotations must be objects, not strings.

from datetime import datetime

from prefect import flow
from prefect.artifacts import acreate_table_artifact
from prefect.logging import get_run_logger

from prefect_webhooks.store.outbox import replay_failed
from prefect_webhooks.utilities.sync_flows import sync_compatible


@sync_compatible
@flow(name="replay")
async def replay(
    destination: str,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    reason_prefix: str | None = None,
    filtered: bool = False,
) -> int:
    """Put failed messages of ``destination`` back to pending, due now.

    Attempt counters and first-attempt times are reset, so each message gets a full ``max_retry_age`` again; the
    attempt log keeps the earlier attempts.

    Args:
        destination: The WebhookDestination block name.
        created_after: Only messages created at or after this time.
        created_before: Only messages created before this time.
        reason_prefix: Only messages whose failure reason starts with this, e.g. ``expired`` or ``permanent``.
        filtered: Put back messages a destination filter dropped instead of failed ones, e.g. after a rule was
            changed (``reason_prefix`` can pick one rule: ``filtered: drop rule 'internal'``).

    Returns:
        How many messages were put back.
    """
    count = replay_failed(
        destination, created_after=created_after, created_before=created_before, reason_prefix=reason_prefix,
        filtered=filtered,
    )
    await acreate_table_artifact(
        table=[
            {
                "destination": destination,
                "created_after": created_after.isoformat() if created_after else "",
                "created_before": created_before.isoformat() if created_before else "",
                "reason_prefix": reason_prefix or "",
                "state": "filtered" if filtered else "failed",
                "replayed": count,
            }
        ],
        key="replay",
        description=f"{'Filtered' if filtered else 'Failed'} messages of {destination!r} put back into the outbox.",
    )
    get_run_logger().info("replay: %d %s message(s) of %r are pending again", count,
                          "filtered" if filtered else "failed", destination)
    return count
