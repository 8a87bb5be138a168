"""The ``prune`` flow: one retention pass over the store, then over prefect-webhooks' own runs in Prefect.

``prefect-webhooks serve`` runs it every ``PREFECT_WEBHOOKS_RETENTION_INTERVAL``; ``prefect-webhooks prune`` runs
it once; on a work pool the ``prune/retention`` deployment does. Each run shows one table artifact (key
``store-retention``): rows removed per state, when the oldest row kept got there, the retention of each, and in its
description the store's size and the old Prefect runs removed. A pass skipped because another process is running
one (one at a time per store) says so and removes nothing.
"""

# No `from __future__ import annotations`: Prefect before 3.5 builds the flow's parameter model from the signature
# without this module's namespace, so the annotations must be objects, not strings.

import asyncio
from typing import Any

from prefect import flow
from prefect.artifacts import acreate_table_artifact
from prefect.logging import get_run_logger

from prefect_webhooks.flows.old_runs import RunsRemoved, remove_old_runs
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.upkeep.retention import PruneReport, prune_store
from prefect_webhooks.utilities.sync_flows import sync_compatible
from prefect_webhooks.utilities.tables import table_text
from prefect_webhooks.utilities.tagged_flows import tagged

ARTIFACT_KEY = "store-retention"


def report_description(report: PruneReport, runs: RunsRemoved, runs_retention: float) -> str:
    """The artifact's text: the store's size after the pass and what was removed from Prefect."""
    size = report.size
    store = (f"Store: {size.total_bytes / 1e6:.1f} MB after the pass ({size.free_bytes / 1e6:.1f} MB of it free "
             f"for reuse, WAL {size.wal_bytes / 1e6:.1f} MB). " if size else "")
    return (f"Pruning pass: {report.messages_removed()} messages removed in {report.batches} transactions, "
            f"{report.seconds:.1f} s. {store}Prefect: {runs.flow_runs} prefect-webhooks flow runs older than "
            f"{runs_retention:g} s removed, with {runs.artifacts} artifacts.")


@tagged
@sync_compatible
@flow(name="prune", log_prints=False)
async def prune() -> dict[str, Any]:
    """Remove what retention no longer keeps: old messages and their attempts, old messageIds, old Prefect runs.

    Returns:
        Rows removed per kind, Prefect runs and artifacts removed, the store's size in bytes, or ``skipped``.
    """
    logger = get_run_logger()
    settings = get_settings()
    # The store work is blocking I/O in short transactions: off the event loop.
    report = await asyncio.to_thread(prune_store)
    if report.skipped:
        logger.info("%s", report.summary())
        return {"skipped": report.skipped}
    runs = RunsRemoved()
    try:
        runs = await remove_old_runs(settings.retention.retention_runs)
    except Exception as exc:
        # The store is pruned whatever happens here; the next pass tries again.
        logger.warning("removing old prefect-webhooks runs from Prefect failed: %s", type(exc).__name__)
    await acreate_table_artifact(table=report.table(), key=ARTIFACT_KEY,
                                 description=report_description(report, runs, settings.retention.retention_runs))
    logger.info("%s; %d old flow run(s) and %d artifact(s) removed from Prefect", report.summary(), runs.flow_runs,
                runs.artifacts)
    return {**report.removed, "flow_runs": runs.flow_runs, "artifacts": runs.artifacts,
            "store_bytes": report.size.total_bytes if report.size else None}


def result_text(result: dict[str, Any]) -> str:
    """A ``prune`` run's result for a person: rows removed per kind as a table, the store's size on a line of its
    own (a measure, not a count of removed rows), or why the pass was skipped."""
    if "skipped" in result:
        return f"pruning skipped: {result['skipped']}"
    removed = {name: count for name, count in result.items() if name != "store_bytes"}
    lines = [table_text(("removed", "count"), list(removed.items()))]
    if result.get("store_bytes") is not None:
        lines.append(f"store size after the pass: {result['store_bytes'] / 1e6:.1f} MB")
    return "\n".join(lines)


if __name__ == "__main__":
    prune()
