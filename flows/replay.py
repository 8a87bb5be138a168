"""The ``replay`` flow: put failed messages back into the outbox with a fresh deadline, in bounded chunks.

Like Svix's ``recover {since, until}``: a destination (or every destination with an endpoint URL) and a time window
choose what failed; a million messages go back in chunks of ``chunk_size`` rows, each its own short transaction,
with a progress artifact in the Prefect UI and a table artifact at the end.
"""

# No `from __future__ import annotations`: Prefect before 3.5 builds the flow's parameter model from the signature
# without this module's namespace, so the annotations must be objects, not strings.

from datetime import datetime

from prefect import flow
from prefect.artifacts import acreate_progress_artifact, acreate_table_artifact, aupdate_progress_artifact
from prefect.logging import get_run_logger

from prefect_webhooks.blocks.enabling import adestinations_with_url
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.replay import DEFAULT_CHUNK, ReplaySelection, count_selected, replay_chunks
from prefect_webhooks.utilities.sync_flows import sync_compatible
from prefect_webhooks.utilities.tagged_flows import tagged


def _text(value: object) -> str:
    return value.isoformat() if isinstance(value, datetime) else ("" if value is None else str(value))


@tagged
@sync_compatible
@flow(name="replay")
async def replay(
    destination: str | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    reason_prefix: str | None = None,
    filtered: bool = False,
    since: datetime | None = None,
    until: datetime | None = None,
    endpoint: str | None = None,
    chunk_size: int = DEFAULT_CHUNK,
) -> int:
    """Put failed messages back to pending, due now.

    Attempt counters and first-attempt times are reset, so each message gets a full ``max_retry_age`` again; the
    attempt log keeps the earlier attempts.

    Args:
        destination: The WebhookDestination block name.
        created_after: Only messages created at or after this time.
        created_before: Only messages created before this time.
        reason_prefix: Only messages whose failure reason starts with this, e.g. ``expired``, ``permanent`` or
            ``disabled``.
        filtered: Put back messages a destination filter dropped instead of failed ones, e.g. after a rule was
            changed (``reason_prefix`` can pick one rule: ``filtered: drop rule 'internal'``).
        since: Only messages that were being attempted at or after this time (from their first attempt to their
            last, as Svix's recover).
        until: Only messages that were being attempted before this time.
        endpoint: Every destination with an endpoint at this URL (instead of, or besides, ``destination``).
        chunk_size: Messages put back per transaction.

    Returns:
        How many messages were put back.
    """
    if destination is None and endpoint is None:
        raise ValueError("replay needs a destination or an endpoint URL")
    if chunk_size < 1:
        raise ValueError("chunk_size: must be at least 1")
    if since is not None and until is not None and until <= since:
        raise ValueError("until: must be later than since")
    names = [destination] if destination else []
    if endpoint is not None:
        names += [name for name in await adestinations_with_url(endpoint) if name not in names]
    selection = ReplaySelection(tuple(names), since, until, created_after, created_before, reason_prefix, filtered)
    engine = get_engine()
    total = count_selected(engine, selection) if names else 0
    kind = "filtered" if filtered else "failed"
    progress = await acreate_progress_artifact(0.0, description=f"Replaying {total} {kind} message(s) of {names}")
    replayed = 0
    for replayed in replay_chunks(engine, selection, chunk_size) if names else ():
        await aupdate_progress_artifact(progress, min(100.0, 100.0 * replayed / max(total, 1)))
    await aupdate_progress_artifact(progress, 100.0)
    await acreate_table_artifact(
        table=[{
            "destination": ", ".join(names), "endpoint": endpoint or "", "since": _text(since), "until": _text(until),
            "created_after": _text(created_after), "created_before": _text(created_before),
            "reason_prefix": reason_prefix or "", "state": kind, "replayed": replayed,
        }],
        key="replay",
        description=f"{kind.capitalize()} messages put back into the outbox: {replayed} in all.",
    )
    get_run_logger().info("replay: %d %s message(s) of %s are pending again", replayed, kind, names or "no destination")
    return replayed
