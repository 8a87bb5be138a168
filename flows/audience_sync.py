"""The ``audience-sync`` flow: snapshot ▶ validate ▶ diff per destination ▶ identify rows + state in one transaction.

Run it on a schedule per audience (see ``prefect_webhooks.audiences`` for how an audience is defined and diffed)::

    from prefect_webhooks.flows.audience_sync import audience_sync
    from prefect_webhooks.audiences.sync import AudienceDefinition
    from prefect_webhooks.audiences.snapshots import SqlSnapshot

    audience_sync(AudienceDefinition(name="Big Spenders 2024", sources=["web-app"],
                                     snapshot=SqlSnapshot(url="postgresql://…", query="select user_id from …")))

The run shows a progress artifact while the snapshot is written and a table artifact with, per destination, the
members, added, removed, changed and unchanged users and the messages queued.
"""

# No `from __future__ import annotations`: Prefect before 3.5 builds the flow's parameter model from the signature
# without this module's namespace, so the annotations must be objects, not strings.

from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import State

from prefect_webhooks.audiences.sync import AudienceDefinition, AudienceError, SyncResult, sync_audience
from prefect_webhooks.flows.catch_up import superseded
from prefect_webhooks.inbound.sources import read_source
from prefect_webhooks.utilities.tagged_flows import tagged

PROGRESS_STEP = 2.0


def artifact_key(audience_key: str) -> str:
    """A Prefect artifact key for an audience (artifact keys allow lowercase letters, digits and dashes)."""
    return "audience-" + audience_key.replace("_", "-")


@task(name="read-source-destinations", cache_policy=NO_CACHE)
def read_source_destinations(sources: Sequence[str]) -> dict[str, list[str]]:
    """Each Source block's enabled WebhookDestination names (a missing block is an error: the audience is
    misconfigured, and skipping it silently would never deliver)."""
    destinations_of = {}
    for name in sources:
        info = read_source(name)
        if info is None:
            raise AudienceError(f"sources: no Source block named {name!r}")
        destinations_of[name] = list(info.destinations)
    return destinations_of


def progress_reporter(artifact_id: UUID) -> Callable[[float], None]:
    """A callback that moves the progress artifact, at most once per ``PROGRESS_STEP`` percent."""
    shown = [0.0]

    def report(fraction: float) -> None:
        percent = round(100.0 * fraction, 1)
        if percent - shown[0] >= PROGRESS_STEP or (percent >= 100.0 > shown[0]):
            shown[0] = percent
            update_progress_artifact(artifact_id, percent)

    return report


@task(name="sync-audience-snapshot", cache_policy=NO_CACHE)
def sync_snapshot(
    definition: AudienceDefinition, destinations_of: dict[str, list[str]], allow_empty: bool
) -> SyncResult:
    """Load, validate, diff and write the audience (one transaction per destination), showing progress."""
    artifact_id = create_progress_artifact(0.0, description=f"Syncing audience {definition.name!r}")
    return sync_audience(definition, destinations_of, allow_empty=allow_empty,
                         progress=progress_reporter(artifact_id))


def result_table(result: SyncResult) -> list[dict[str, object]]:
    """One artifact row per destination."""
    return [
        {
            "audience": result.key,
            "destination": row.destination,
            "source": row.source,
            "members": row.members,
            "added": row.added,
            "removed": row.removed,
            "changed": row.changed,
            "unchanged": row.unchanged,
            "messages queued": row.queued,
        }
        for row in result.destinations
    ]


@tagged
@flow(name="audience-sync", log_prints=False)
def audience_sync(definition: AudienceDefinition, allow_empty: bool = False) -> SyncResult | State[Any]:
    """Sync one audience or computed trait to the Webhooks destinations of its sources.

    A scheduled run that a later due scheduled run covers (slots missed while Prefect was down) ends ``Cancelled``
    at once: the later one syncs the newest snapshot (``flows.catch_up``).

    Args:
        definition: The audience or computed trait (name, sources, snapshot provider, columns).
        allow_empty: Accept an empty snapshot after a non-empty one (sends ``false`` to every member).

    Returns:
        Per-destination counts of the sync (or the ``Cancelled`` state of a superseded run).
    """
    logger = get_run_logger()
    if (skipped := superseded()) is not None:
        logger.info("%s", skipped.message)
        return skipped
    destinations_of = read_source_destinations(definition.sources)
    result = sync_snapshot(definition, destinations_of, allow_empty)
    create_table_artifact(
        table=result_table(result),
        key=artifact_key(result.key),
        description=f"Audience sync of {result.name!r} ({result.kind}, key {result.key!r}): {result.members} members",
    )
    for row in result.destinations:
        logger.info(
            "audience %s → %s: %d members, %d added, %d removed, %d changed, %d queued",
            result.key, row.destination, row.members, row.added, row.removed, row.changed, row.queued,
        )
    return result
