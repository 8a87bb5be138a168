"""The ``deliver`` flow: claim due outbox messages in batches and deliver each batch in one task run.

Run it once to drain what is due, or with ``run_for_seconds`` to keep delivering in near real time (it claims
again every ``idle_sleep`` seconds while nothing is due, at once again while a backlog fills whole batches). Each run
publishes one table artifact per endpoint, one per destination whose filters dropped messages, and ends the secret
rotations whose window is over. When the Prefect API cannot be reached at the end of a run, a delivery worker
publishes its artifacts once the API answers again; elsewhere the run logs them as not recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote
from uuid import UUID

from prefect import flow, get_client
from prefect.artifacts import TableArtifact
from prefect.client.schemas.actions import ArtifactCreate
from prefect.logging import get_run_logger
from prefect.utilities.context import get_task_and_flow_run_ids

from prefect_webhooks.blocks.api_status import PrefectApiUnavailable, prefect_api
from prefect_webhooks.blocks.rotation import afinish_rotations
from prefect_webhooks.delivery import DeliveryOptions, DeliveryStats, current_shift, deliver_due
from prefect_webhooks.delivery.endpoints.stats import artifact_key, filtered_artifact_key
from prefect_webhooks.settings import get_settings
from prefect_webhooks.utilities.sync_flows import sync_compatible
from prefect_webhooks.utilities.tagged_flows import tagged

# Publishing a run's artifacts takes one call per endpoint; it happens after the run's last batch, off the data path.
ARTIFACTS_WAIT_SECONDS = 15.0


def run_artifacts(stats: DeliveryStats) -> list[TableArtifact]:
    """A run's table artifacts: one per endpoint (requests delivered, retried, failed, p50/p95 latency) and one per
    destination whose filters dropped messages (a row per rule)."""
    artifacts = []
    settings = get_settings()
    for endpoint in stats.endpoints.values():
        row = endpoint.row()
        console = settings.console_link(f"/destinations/{quote(endpoint.destination, safe='')}")
        artifacts.append(TableArtifact(
            table=[row],
            key=artifact_key(endpoint.destination, endpoint.url),
            description=(
                f"Requests to {row['endpoint']} (destination {row['destination']!r}) in this run: 2xx delivered, "
                "retryable failures (timeouts, connection errors, 5xx, 408, 429) retried, other outcomes failed; "
                "latency in milliseconds."
                + (f" [The destination in the console]({console}): its messages, failures and attempts." if console
                   else "")
            ),
        ))
    by_destination: dict[str, list[dict[str, Any]]] = {}
    for (destination, reason), count in sorted(stats.filtered_by_rule.items()):
        by_destination.setdefault(destination, []).append(
            {"destination": destination, "rule": reason.removeprefix("filtered: "), "filtered": count})
    for destination, rows in by_destination.items():
        artifacts.append(TableArtifact(
            table=rows,
            key=filtered_artifact_key(destination),
            description=(
                f"Messages of destination {destination!r} that its filter rules dropped in this run (never sent; "
                "their outbox rows are in the filtered state)."
            ),
        ))
    return artifacts


async def publish_artifacts(artifacts: Sequence[TableArtifact], flow_run_id: UUID | None = None) -> int:
    """Publish a run's artifacts (``run_artifacts``) for ``flow_run_id``, the current run by default."""
    flow_run_id = flow_run_id or get_task_and_flow_run_ids()[1]
    async with get_client() as client:
        for artifact in artifacts:
            await client.create_artifact(ArtifactCreate(type=artifact.type, key=artifact.key,
                                                        description=artifact.description, flow_run_id=flow_run_id,
                                                        data=await artifact.aformat()))
    return len(artifacts)


async def record_run(stats: DeliveryStats) -> bool:
    """Publish the run's artifacts, unless the Prefect API cannot be reached: then a delivery worker publishes them
    on its return, and elsewhere they are logged as not recorded. Returns whether they were published."""
    try:
        await prefect_api().call(lambda: publish_artifacts(run_artifacts(stats)), wait=ARTIFACTS_WAIT_SECONDS)
        return True
    except PrefectApiUnavailable:
        pass
    shift = current_shift.get()
    if shift is not None:
        shift.unrecorded = stats
        get_run_logger().warning("the Prefect API cannot be reached: this run's artifacts are published when it "
                                 "answers again")
    else:
        get_run_logger().warning("the Prefect API cannot be reached: this run's %d artifact(s) are not recorded "
                                 "(%s)", len(run_artifacts(stats)), stats.in_words())
    return False


async def finish_ended_rotations() -> list[str]:
    """Remove previous secrets whose rotation window has ended from the saved blocks; never fails the run."""
    try:
        finished = await afinish_rotations()
    except Exception as exc:
        # The old secret is not used after its window whatever happens here; the next run tries again.
        get_run_logger().warning("could not finish secret rotations: %s", type(exc).__name__)
        return []
    for name in finished:
        get_run_logger().info("secret rotation of %r finished: the previous secret is removed", name)
    return finished


@tagged
@sync_compatible
@flow(name="deliver", log_prints=False)
async def deliver(
    destination: str | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
    run_for_seconds: float | None = None,
    until_empty: bool = False,
    parallel_batches: int = 2,
    idle_sleep: float = 0.3,
) -> dict[str, Any]:
    """Deliver due outbox messages.

    Args:
        destination: Only this WebhookDestination block's messages; all destinations when empty.
        batch_size: Messages per claimed batch (one task run); the ``claim_batch_size`` setting by default.
        max_batches: Stop after this many batches.
        run_for_seconds: Keep delivering this long (continuous mode); by default stop when nothing is due.
        until_empty: With ``run_for_seconds``, stop early once nothing is due.
        parallel_batches: Batches being prepared or sending at once; a batch whose messages are all on their way
            only waits for answers and does not count (up to 20 such batches: ``DeliveryOptions``).
        idle_sleep: Continuous mode: seconds between claims unless the last claim was full (a backlog), so each
            batch (one task run) holds what arrived meanwhile.

    Returns:
        Message counts: delivered, failed, rescheduled, filtered, batches.
    """
    options = DeliveryOptions(destination=destination, batch_size=batch_size, max_batches=max_batches,
                              run_for_seconds=run_for_seconds, until_empty=until_empty,
                              parallel_batches=parallel_batches, idle_sleep=idle_sleep, prefect_tasks=True)
    stats = await deliver_due(options)
    if await record_run(stats):
        await finish_ended_rotations()
    summary = stats.summary()
    get_run_logger().info("deliver: %s", stats.in_words())
    return summary


if __name__ == "__main__":
    deliver()
