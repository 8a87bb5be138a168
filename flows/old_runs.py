"""Removal of prefect-webhooks' own old flow runs from the Prefect server, after ``PREFECT_WEBHOOKS_RETENTION_RUNS``.

The runs of our deployments (``deliver/continuous``, ``deletions/interval``, …) and of ``serve``'s pruning passes
carry the tag ``prefect-webhooks``; a finished run with that tag that started longer ago than the retention (or
never started and was due longer ago: superseded or crashed before it started, recorded after an outage) is
removed with its artifacts (deleted one by one first: the server keeps artifacts of a deleted run), its task runs and
states and its logs (the server deletes those with the run). Runs of other flows on the same server are never
touched, nor is anything Prefect keeps on its own schedule (events: ``PREFECT_SERVER_EVENTS_RETENTION_PERIOD``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterExpectedStartTime,
    FlowRunFilterStartTime,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.exceptions import ObjectNotFound

from prefect_webhooks.utilities.tagged_flows import OUR_TAG as OUR_TAG  # the tag's home; named here as before

if TYPE_CHECKING:
    from prefect.client.orchestration import PrefectClient

# Runs removed per pass at most: a pass stays short, and a backlog of old runs goes over a few passes.
MOST_RUNS_PER_PASS = 200
FINISHED = [StateType.COMPLETED, StateType.FAILED, StateType.CRASHED, StateType.CANCELLED]


@dataclass
class RunsRemoved:
    """What one removal did: flow runs (with their task runs, states, logs) and artifacts removed."""

    flow_runs: int = 0
    artifacts: int = 0


async def remove_old_runs(older_than_seconds: float, *, limit: int = MOST_RUNS_PER_PASS) -> RunsRemoved:
    """Remove up to ``limit`` of our finished flow runs that started more than ``older_than_seconds`` ago, oldest
    first.

    Args:
        older_than_seconds: The retention (``PREFECT_WEBHOOKS_RETENTION_RUNS``).
        limit: Most runs removed by this call.

    Returns:
        How many flow runs and artifacts were removed.
    """
    cutoff = datetime.now(timezone.utc) - timedelta(seconds=older_than_seconds)
    removed = RunsRemoved()
    async with get_client() as client:
        ids = await _old_run_ids(client, cutoff, limit)
        while ids:
            artifacts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=ids)), limit=200)
            for artifact in artifacts:
                await client.delete_artifact(artifact.id)
            removed.artifacts += len(artifacts)
            if len(artifacts) < 200:
                break
        for run_id in ids:
            try:
                await client.delete_flow_run(run_id)
            except ObjectNotFound:
                continue  # removed meanwhile (by hand, or by Prefect's own vacuum)
            removed.flow_runs += 1
    return removed


async def _old_run_ids(client: PrefectClient, cutoff: datetime, limit: int) -> list[UUID]:
    """Our finished runs older than ``cutoff``, up to ``limit``: those that started before it, then those that never
    started (superseded by a catch-up, crashed before starting, recorded after an outage) whose slot came before it.
    """
    ours = {"tags": FlowRunFilterTags(all_=[OUR_TAG]),
            "state": FlowRunFilterState(type=FlowRunFilterStateType(any_=FINISHED))}
    # Start, not end: the end-time filter is missing from older Prefect clients.
    started = await client.read_flow_runs(
        flow_run_filter=FlowRunFilter(**ours, start_time=FlowRunFilterStartTime(before_=cutoff)),
        sort=FlowRunSort.START_TIME_ASC, limit=limit)
    if len(started) >= limit:
        return [run.id for run in started]
    never_started = await client.read_flow_runs(
        flow_run_filter=FlowRunFilter(**ours, start_time=FlowRunFilterStartTime(is_null_=True),
                                      expected_start_time=FlowRunFilterExpectedStartTime(before_=cutoff)),
        sort=FlowRunSort.EXPECTED_START_TIME_ASC, limit=limit - len(started))
    return [run.id for run in (*started, *never_started)]
